"""small's chip end to end (issue 18, item 4): a few tokens on Verilator, bit-exact against the
integer model, stalls on every port, a CSR clear, the chip's tags and the MACS counter with
small's padding lanes (sim/cocotb/tb_layer.py checks MACS = TOKENS x engine_macs_per_token).

Slow: small's Verilog and its Verilator build alone take longer than the default suite's
budget for additions (157 s from a clean build on the loaded 2-core machine, 32 s with the
Verilator build cached); the default suite
runs tiny end to end (sim/tests/chip/test_layer.py) and one randomised config
(sim/tests/chip/test_random_configs.py).  MOEKDA_CONFIG picks another config (sim_config).
"""
from __future__ import annotations

import pytest

from sim.cocotb_util import sim_config, simulator_available
from run.driver import LayerDriver, RunPlan

CONFIG = sim_config("small")


@pytest.mark.slow
@pytest.mark.verilator
@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_small_end_to_end_verilator():
    drv = LayerDriver.from_seed(CONFIG, seed=0)
    res = drv.run(RunPlan(tokens=4, clears=(2,), seed=13), simulator="verilator", name="small4")
    assert res.match, res.summary()
    assert res.tags.tolist() == [0, 1, 0, 1]
