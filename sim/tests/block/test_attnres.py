"""The Attention Residuals depth unit (hw/attnres/unit.py) against the integer model
(model/int_attn_res.py ``IntDepthResidual``), bit for bit.

The cocotb bench sim/cocotb/tb_attnres.py runs the `attnres` top of hw.tops (Icarus) on
model-tiny-hybrid (block AttnRes, two sequence slots) and its full-AttnRes twin: whole
tokens (START, then MIX / ADD per sub-layer, the output's MIX) in both slots interleaved at
random, corner and random vectors, stalls on ``i`` and the weight port, back-pressure on
``o``, a reset in the middle of a first pass, cycle limits; and the cycles per token
without stalls.
"""
from __future__ import annotations

import json

import pytest

from moekda.config import ConfigError, load_config
from sim.cocotb_util import run_cocotb, sim_configs, simulator_available


def full_config(base: str) -> str:
    """``base`` with full Attention Residuals (path, for the bench)."""
    from studies.sweep import write_config
    raw = load_config(base).to_dict()
    raw["model"]["attn_res"] = "full"
    raw["name"] = f"{raw['name']}-full"
    return write_config(raw)


@pytest.mark.skipif(not simulator_available("icarus"), reason="icarus not installed")
@pytest.mark.parametrize("config", sim_configs("model-tiny-hybrid"))
# full AttnRes is the block form's unit with every layer its own block: the slow suite's
@pytest.mark.parametrize("mode", ["block", pytest.param("full", marks=pytest.mark.slow)])
def test_depth_unit_matches_model_icarus(config, mode, tmp_path):
    if load_config(config).model.attn_res == "none":
        pytest.skip(f"config {config}: no Attention Residuals")
    if load_config(config).model.attn_res != mode:
        config = full_config(config) if mode == "full" else config
        if load_config(config).model.attn_res != mode:
            pytest.skip(f"config {config}: attn_res is not {mode}")
    result = tmp_path / "result.json"
    run_cocotb("attnres", config, "sim.cocotb.tb_attnres", simulator="icarus",
               env={"MOEKDA_SEED": 3, "MOEKDA_RESULT": result}, test_name=f"depth_{mode}")
    got = json.loads(result.read_text())
    print(f"\n{config} depth unit: {got['cycles_per_token']:.0f} cycles per token without stalls "
          f"({got['mixes_per_token']} mixes, {got['adds_per_token']} starts and adds); {got['cycles_per_mix']:.1f} "
          f"cycles per mix from command to output, {got['cycles_per_add']:.1f} per start or add")


def test_the_bench_reaches_the_corners():
    """The corner tokens do what they are there for: block partials on the rails, and mixes
    whose output is on a rail."""
    import numpy as np
    from sim.cocotb.tb_attnres import depth_model, slot_commands, token_vectors
    cfg = load_config("model-tiny-hybrid")
    qm, _ = depth_model(cfg, 3)
    rng = np.random.default_rng(0)
    vecs = [token_vectors(cfg, rng, c) for c in range(4)]
    outs = [e for _, _, e in slot_commands(cfg, qm.attn_res, vecs) if e is not None]
    assert any(max(o) == 32767 for o in outs) and any(min(o) == -32768 for o in outs)
    assert any(max(o) == 0 == min(o) for o in outs)                     # the all-zero token


def test_the_depth_unit_needs_attn_res():
    from hw.tops import build_top
    with pytest.raises(ConfigError, match=r'model.attn_res = "none", so no depth unit'):
        build_top("attnres", load_config("model-tiny"))
