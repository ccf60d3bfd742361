"""The Gated MLA unit (hw/mla/unit.py) in cocotb against the integer model, bit for bit.

The bench is sim/cocotb/tb_mla.py (the `mla` top of hw.tops): the unit's weights from the
model's image, its latents written to and read back from the cache memory, random stalls
on every port, tokens of two MLA layers and two sequence slots interleaved (four caches),
sequences restarting, a reset inside a token.  The configs are model-tiny and model-small
with MLA layers in place of KDA ones (no Attention Residuals or LatentMoE, which the image
does not carry yet), written as files under build/ so the bench process loads the same.
"""
from __future__ import annotations

import numpy as np
import pytest

from moekda.config import ConfigError, load_config
from sim.cocotb_util import simulator_available

needs_icarus = pytest.mark.skipif(not simulator_available("icarus"), reason="icarus not installed")


def mla_config(base: str, layers, kv_rank: int) -> str:
    """A config file: ``base`` with ``layers`` as its token mixers (path, for the bench)."""
    from studies.sweep import write_config
    raw = load_config(base).to_dict()
    raw["model"].update(layers=list(layers), kv_rank=kv_rank)
    raw["name"] = f"{base}-mla"
    return write_config(raw)


def run_mla(config: str, layers, slots, first=(), reset_in=-1, stall=True, seed=0, name="run", case=None):
    from sim.cocotb.tb_mla import mla_case, run_mla_case
    case = case or mla_case(config, seed, layers, slots, first, reset_in)
    return case, run_mla_case(config, case, stall, seed, name)


@pytest.fixture(scope="module")
def tiny_mla():
    return mla_config("model-tiny", ["kda", "mla", "kda", "mla"], 8)


@needs_icarus
def test_mla_unit_matches_model_icarus(tiny_mla):
    """Two MLA layers x two slots in a random order, a restart of one sequence at token 21,
    a reset inside token 30 (it is dropped, and every cache starts again at 0), stalls."""
    rng = np.random.default_rng(5)
    T = 40
    layers = rng.choice([1, 3], T)
    slots = rng.integers(0, 2, T)
    case, cycles = run_mla(tiny_mla, layers, slots, first=(21,), reset_in=30, name="interleaved")
    assert case.pos.max() >= 7 and case.pos[31:].max() < case.pos[:30].max()   # long caches, then anew
    assert case.first[21] and len(cycles) == T - 1


@pytest.mark.slow
@needs_icarus
def test_mla_unit_at_context_4096_icarus(tiny_mla):
    """(slow: 174 s, most of it the integer model's 4096 tokens) The last two tokens of a 4096-token sequence, the cache's first 4094 rows restored by
    the host: the last token attends over 4096 positions, bit for bit."""
    from sim.cocotb.tb_mla import long_mla_case
    case = long_mla_case(tiny_mla, 4, 4096)
    case, cycles = run_mla(tiny_mla, None, None, stall=True, seed=4, name="context4096", case=case)
    assert case.pos[-1] == 4095 and len(cycles) == 2


@pytest.mark.slow
@needs_icarus
def test_mla_cycles_grow_with_the_cache_icarus(tiny_mla):
    """(slow: the bench measures it too) Without stalls each position costs H rb cycles: token_cycles is linear in the context."""
    from hw.mla.cache import row_beats
    cfg = load_config(tiny_mla)
    T = 24
    case, cycles = run_mla(tiny_mla, [3] * T, [0] * T, stall=False, seed=2, name="cycles")
    slope = np.polyfit(case.pos, cycles, 1)[0]
    per_pos = cfg.model.n_heads * row_beats(cfg)
    print(f"\n{cfg.name}: token_cycles {cycles[0]} at position 0, {cycles[-1]} at {T - 1}; "
          f"{slope:.2f} per position (H rb = {per_pos})")
    # the softmax's rescales (3 cycles per rise of the running maximum, ~ln T per head) add
    # a little more than nothing per position
    assert per_pos - 0.1 <= slope <= per_pos + 1.0, (cycles, per_pos)


def test_the_mla_unit_needs_an_mla_layer():
    from hw.tops import build_top
    with pytest.raises(ConfigError, match="no \"mla\" in model.layers"):
        build_top("mla", load_config("model-tiny"))


@pytest.mark.slow
@needs_icarus
def test_mla_unit_small_matches_model_icarus():
    """model-small's sizes: two heads, a 32-value latent over two beats of the 16-byte port."""
    config = mla_config("model-small", ["kda", "kda", "kda", "mla"], 32)
    rng = np.random.default_rng(6)
    T = 16
    case, _ = run_mla(config, [3] * T, rng.integers(0, 2, T), seed=3, name="small")
    assert case.pos.max() >= 5
