"""configs/tiny-situ.toml's layer chip (K3's SiTU-GLU, issue 47 difference 5) bit-exact on
Verilator; the models and tables: model/tests/test_situ.py."""
from __future__ import annotations

import numpy as np
import pytest

from sim.cocotb_util import simulator_available

CONFIG = "tiny-situ"

needs_verilator = pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_tiny_situ_layer_verilator():
    """configs/tiny-situ.toml's layer chip, 48 tokens bit-exact against the integer model with
    stalls on both streams and the weight port, a CSR clear and a reset in the middle; then 32
    tokens without stalls for the cycles per token (docs/numerics.md, "SiTU-GLU")."""
    from run.driver import LayerDriver, RunPlan
    driver = LayerDriver.from_seed(CONFIG, seed=0)
    res = driver.run(RunPlan(tokens=48, first=(0, 20), clears=(30,), reset_at=36, abandon=2, seed=5),
                     simulator="verilator", name="situ48")
    assert res.match, res.summary()
    res = driver.run(RunPlan(tokens=32, stall=False, seed=7), simulator="verilator", name="situ_nostall32")
    assert res.match, res.summary()
    gaps = np.diff(res.out_cycles[4:-1])
    assert len(set(gaps.tolist())) == 1, gaps.tolist()
    print(f"{CONFIG}: one token every {gaps[0]} cycles")
