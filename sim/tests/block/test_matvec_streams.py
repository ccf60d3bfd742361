"""The stream helpers of sim/cocotb/streams.py: payload packing against Amaranth's own layout."""
from __future__ import annotations

import random

import pytest
from amaranth.lib import data

from hw.arith.matvec import MatVecFormats
from moekda.config import load_config
from sim.cocotb.streams import LayoutCodec
from model.matvec import Beat

# the layouts do not depend on the clock, but an engine's formats take one
PERIOD = load_config("tiny").hw.clock_period_ns


def _amaranth_pack(layout, value: dict) -> int:
    """Amaranth's own packing (Layout.const of a dict) as the reference."""
    return data.Layout.cast(layout).const(value).as_bits()


@pytest.mark.parametrize("lanes", [1, 4, 16])
def test_beat_packing_matches_amaranth(lanes):
    fmt = MatVecFormats(lanes=lanes, clock_period_ns=PERIOD)
    layout = fmt.beat_layout()
    codec = LayoutCodec(layout)
    rng = random.Random(lanes)
    for _ in range(200):
        beat = {"w": [rng.randint(-128, 127) for _ in range(lanes)],
                "x": [rng.randint(-128, 127) for _ in range(lanes)],
                "first": rng.randint(0, 1), "last": rng.randint(0, 1),
                "mult": rng.randrange(1 << fmt.mult_bits), "shift": rng.randrange(1 << fmt.shift_bits)}
        bits = codec.pack(beat)
        assert bits == _amaranth_pack(layout, beat)
        assert codec.unpack(bits) == beat


def test_dataclass_items_and_signed_results():
    fmt = MatVecFormats(lanes=2, clock_period_ns=PERIOD)
    beat = Beat(w=(-128, 127), x=(1, -1), first=True, last=False, mult=5, shift=3)
    assert LayoutCodec(fmt.beat_layout()).pack(beat) == _amaranth_pack(
        fmt.beat_layout(), {"w": [-128, 127], "x": [1, -1], "first": 1, "last": 0, "mult": 5, "shift": 3})
    res = LayoutCodec(fmt.result_layout())
    assert res.unpack(res.pack({"y": -128, "acc": -(2 ** 31)})) == {"y": -128, "acc": -(2 ** 31)}


def test_out_of_range_value_is_refused():
    with pytest.raises(ValueError, match="out of range"):
        LayoutCodec(MatVecFormats(lanes=1, clock_period_ns=PERIOD).result_layout()).pack({"y": 128, "acc": 0})


def test_too_wide_formats_refused():
    with pytest.raises(ValueError, match="requant_mult_bits"):
        MatVecFormats(lanes=4, acc_bits=48, mult_bits=31, clock_period_ns=PERIOD)
