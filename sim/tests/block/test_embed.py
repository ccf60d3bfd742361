"""The embedding lookup (hw/chip/embed.py) against the integer model (model/int_model.py).

The cocotb bench sim/cocotb/tb_embed.py runs the `embed` top of hw.tops (Icarus): the int8
corners of a row, stalls on every port, a reset while a row is read, the request of every token
and the cycles per token without stalls; on model-tiny (tied) and model-small (16-byte port).
"""
from __future__ import annotations

import pytest

from moekda.config import ConfigError, load_config
from sim.cocotb_util import run_cocotb, sim_configs, simulator_available


@pytest.mark.skipif(not simulator_available("icarus"), reason="icarus not installed")
@pytest.mark.parametrize("config", sim_configs("model-tiny", "model-small", slow=("model-small",)))
def test_embedding_matches_model_icarus(config):
    if load_config(config).model.vocab == 0:
        pytest.skip(f"config {config}: no vocabulary, no embedding")
    run_cocotb("embed", config, "sim.cocotb.tb_embed", simulator="icarus",
               env={"MOEKDA_SEED": 3, "MOEKDA_TOKENS": 24}, test_name="embed")


def test_embedding_needs_a_vocabulary():
    from hw.tops import build_top
    with pytest.raises(ConfigError, match=r"model.vocab = 0, there is no embedding"):
        build_top("embed", load_config("tiny"))
