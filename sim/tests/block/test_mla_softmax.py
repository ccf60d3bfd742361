"""The MLA layer's online softmax (hw/mla/softmax.py) against the integer model
(model/int_mla.py ``online_softmax``).

The cocotb bench sim/cocotb/tb_mla_softmax.py runs the `mla_softmax` top of hw.tops (Icarus):
corner heads (one position, ties, a rescale at every position, a jump past any shift, the
score and latent rails) and random ones, stalls on ``i``, back-pressure on ``o``, a reset in
the middle of a head, and the cycles per head without stalls.
"""
from __future__ import annotations

import json

import pytest

from moekda.config import ConfigError, load_config
from moekda.formats import formats_for
from sim.cocotb_util import run_cocotb, sim_configs, simulator_available


@pytest.mark.skipif(not simulator_available("icarus"), reason="icarus not installed")
@pytest.mark.parametrize("config", sim_configs("model-tiny-hybrid"))
def test_online_softmax_matches_model_icarus(config, tmp_path):
    if load_config(config).model.kv_rank == 0:
        pytest.skip(f"config {config}: no MLA layer")
    result = tmp_path / "result.json"
    run_cocotb("mla_softmax", config, "sim.cocotb.tb_mla_softmax", simulator="icarus",
               env={"MOEKDA_SEED": 2, "MOEKDA_HEADS": 24, "MOEKDA_RESULT": result}, test_name="softmax")
    got = json.loads(result.read_text())
    print(f"\n{config} online softmax: {got['cycles_per_head']:.1f} cycles per head of 32 positions "
          f"({got['rises']:.1f} rises of the running maximum)")


@pytest.mark.slow
@pytest.mark.skipif(not simulator_available("icarus"), reason="icarus not installed")
@pytest.mark.parametrize("config", sim_configs("model-tiny-hybrid"))
def test_online_softmax_over_a_4096_token_cache_icarus(config):
    """The MLA layer's softmax at the context sweep's longest cache (slow: ~30 s on Icarus)."""
    run_cocotb("mla_softmax", config, "sim.cocotb.tb_mla_softmax", simulator="icarus",
               env={"MOEKDA_SEED": 3, "MOEKDA_LONG": 4096}, test_name="softmax_long",
               testcase="softmax_long_head")


def test_the_bench_heads_reach_the_corners():
    """The corner heads do what they are there for: a rescale past every shift, ties, and
    latents whose weighted mean saturates."""
    import numpy as np
    from sim.cocotb.tb_mla_softmax import expected, softmax_heads
    cfg = load_config("model-tiny-hybrid")
    heads = softmax_heads(cfg, 12, seed=2)
    F = formats_for(cfg).mla_exp_frac
    whole = [-((-u) >> F) for u, _ in heads]
    assert any(np.diff(w).max(initial=0) > 63 for w in whole)          # a shift past the sums' width
    assert any(len(set(u)) == 1 and len(u) > 1 for u, _ in heads)       # every position a maximum
    assert any(np.all(np.diff(w) > 0) and len(w) > 8 for w in whole)   # a rescale at every position
    outs = expected(cfg, heads)
    assert any(min(o) == -128 for o in outs) and any(max(o) == 127 for o in outs)


def test_the_softmax_needs_an_mla_layer():
    from hw.tops import build_top
    with pytest.raises(ConfigError, match=r"model.kv_rank = 0, there is no MLA layer"):
        build_top("mla_softmax", load_config("tiny"))
