"""The model chip's head (hw/chip/head.py) against the integer model (model/int_model.py).

The cocotb bench sim/cocotb/tb_head.py runs the `head` top of hw.tops (Icarus): every input
kind, a tie in the model, saturated logits, logits_en on and off, stalls on every port, a
reset while a token is inside, and the cycles per token without stalls.
"""
from __future__ import annotations

import json

import pytest

from moekda.config import ConfigError, load_config
from sim.cocotb_util import run_cocotb, sim_configs, simulator_available

pytestmark = pytest.mark.skipif(not simulator_available("icarus"), reason="icarus not installed")


def _needs_vocab(config: str):
    if load_config(config).model.vocab == 0:
        pytest.skip(f"config {config}: no vocabulary, no head")


@pytest.mark.parametrize("config", sim_configs("model-tiny"))
def test_head_matches_model_icarus(config, tmp_path):
    _needs_vocab(config)
    result = tmp_path / "result.json"
    run_cocotb("head", config, "sim.cocotb.tb_head", simulator="icarus",
               env={"MOEKDA_SEED": 1, "MOEKDA_TOKENS": 14, "MOEKDA_RESET_AFTER": 2, "MOEKDA_RESULT": result},
               test_name="head")
    measured = json.loads(result.read_text())
    from hw.chip.head import head_beats_per_token
    assert measured["weight_beats"] == head_beats_per_token(load_config(config))
    print(f"\n{config} head: {measured['cycles_per_token']} cycles per token without stalls "
          f"({measured['weight_beats']} weight beats, RMSNorm {measured['norm_cycles']}), "
          f"latency {measured['latency']}")


@pytest.mark.parametrize("config", sim_configs("model-small", slow=("model-small",)))
def test_head_one_token_small_icarus(config):
    """The untied head (its own lm_head region) with 16 lanes: two tokens, stalls, no reset pass."""
    _needs_vocab(config)
    run_cocotb("head", config, "sim.cocotb.tb_head", simulator="icarus",
               env={"MOEKDA_SEED": 2, "MOEKDA_TOKENS": 2, "MOEKDA_RESET_AFTER": 0},
               test_name="head_small", testcase="head_bit_exact_with_stalls")


def test_head_needs_a_vocabulary():
    from hw.tops import build_top
    with pytest.raises(ConfigError, match=r"model.vocab = 0, there is no LM head"):
        build_top("head", load_config("tiny"))
