"""Matrix-vector engine: the numpy model against independent arithmetic, and
the RTL against the model on Icarus and Verilator (sim/cocotb/tb_matvec.py)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from moekda.config import load_config
from sim.cocotb_util import run_cocotb, sim_configs, simulator_available
from model.matvec import Beat, Result, matrix_beats, matvec, row_beats, run_beats, wrap
from sim.pysim import simulate


# ---- the model, against plain Python integers and floats -----------------

def _reference_row(w, x, mult, shift):
    """Independent of moekda.numerics: exact rational arithmetic, then half-up."""
    from fractions import Fraction
    import math
    acc = sum(int(a) * int(b) for a, b in zip(w, x))
    scaled = Fraction(acc * mult, 2 ** shift)
    y = math.floor(scaled + Fraction(1, 2)) if shift else acc * mult
    return max(-128, min(127, y)), acc


@pytest.mark.parametrize("seed", range(4))
def test_model_matches_exact_rational_reference(seed):
    rng = np.random.default_rng(seed)
    rows, cols = 9, int(rng.integers(1, 70))
    W = rng.integers(-128, 128, (rows, cols))
    x = rng.integers(-128, 128, cols)
    mult = rng.integers(0, 1 << 16, rows)
    shift = rng.integers(0, 49, rows)
    y, acc = matvec(W, x, mult, shift)
    for r in range(rows):
        assert (y[r], acc[r]) == _reference_row(W[r], x, int(mult[r]), int(shift[r]))


@pytest.mark.parametrize("lanes", [1, 4, 16, 64])
def test_beats_equal_matrix_form_for_any_lane_count(lanes):
    rng = np.random.default_rng(lanes)
    W = rng.integers(-128, 128, (5, 37))
    x = rng.integers(-128, 128, 37)
    y, acc = matvec(W, x, 23456, 21)
    results = run_beats(matrix_beats(W, x, lanes, 23456, 21))
    assert [r.y for r in results] == list(y) and [r.acc for r in results] == list(acc)
    assert len(matrix_beats(W, x, lanes, 1, 0)) == 5 * -(-37 // lanes)


def test_float_scale_close_to_integer_result():
    """With M/2**s ~ 0.01 the int8 result is the float result rounded (|err| <= 0.5)."""
    rng = np.random.default_rng(7)
    W = rng.integers(-128, 128, (50, 16))
    x = rng.integers(-128, 128, 16)
    mult, shift = 20972, 21                      # 0.0100002...
    y, acc = matvec(W, x, mult, shift)
    ref = np.clip(W.astype(float) @ x * (mult / 2 ** shift), -128, 127)
    assert np.max(np.abs(y - ref)) <= 0.5 + 1e-9


def test_rounding_is_half_up_and_saturates():
    res = run_beats([Beat((-5,), (1,), True, True, 1, 1), Beat((5,), (1,), True, True, 1, 1),
                     Beat((127,), (127,), True, True, 65535, 0), Beat((-128,), (127,), True, True, 65535, 0)])
    assert [r.y for r in res] == [-2, 3, 127, -128]


def test_first_and_last_are_independent():
    b = lambda v, first, last: Beat((v,), (1,), first, last, 1, 0)
    res = run_beats([b(3, True, False), b(4, False, True), b(5, False, True), b(6, True, True)])
    assert [r.acc for r in res] == [7, 12, 6]    # a running sum, then a restart


def test_accumulator_wraps_like_the_register():
    assert wrap(2 ** 31, 32) == -2 ** 31 and wrap(-2 ** 31 - 1, 32) == 2 ** 31 - 1
    beats = [Beat((-128,), (-128,), i == 0, False) for i in range(4)] + [Beat((0,), (0,), False, True, 1, 0)]
    assert run_beats(beats, acc_bits=16)[0].acc == wrap(4 * 16384, 16)


def test_row_beats_zero_pads_the_last_beat():
    beats = row_beats([1, 2, 3, 4, 5], [1, 1, 1, 1, 1], 4, 7, 3)
    assert [bt.w for bt in beats] == [(1, 2, 3, 4), (5, 0, 0, 0)]
    assert [(bt.first, bt.last) for bt in beats] == [(True, False), (False, True)]
    assert (beats[-1].mult, beats[-1].shift) == (7, 3)


# ---- the planning function ------------------------------------------------

def test_pipeline_deepens_as_the_clock_shortens():
    from amaranth.hdl import Fragment
    from hw.arith.matvec import MatVecEngine, MatVecFormats
    engines = [MatVecEngine(MatVecFormats(lanes=16, clock_period_ns=p)) for p in (4.0, 1.25, 1.0)]
    for engine in engines:
        Fragment.get(engine, None)   # it elaborates at every depth
    depths = [engine.latency for engine in engines]
    assert depths[0] < depths[1] < depths[2], depths


def test_too_short_clock_is_a_one_line_error():
    from hw.arith.pipeline import plan_pipeline
    with pytest.raises(ValueError, match="hw.clock_period_ns"):
        plan_pipeline(0.3)


# ---- RTL against the model --------------------------------------------------

SIMULATORS = [
    pytest.param("icarus", id="icarus"),
    pytest.param("verilator", id="verilator", marks=pytest.mark.verilator),
]


@pytest.mark.parametrize("simulator", SIMULATORS)
@pytest.mark.parametrize("config", sim_configs("tiny", "small"))
def test_rtl_matches_model(config, simulator):
    if not simulator_available(simulator):
        pytest.skip(f"{simulator} not installed")
    run_cocotb("matvec", config, "sim.cocotb.tb_matvec", simulator=simulator,
               env={"MOEKDA_SEED": 11, "MOEKDA_ROWS": 40}, test_name="default")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 6))
@pytest.mark.parametrize("config", sim_configs("tiny", "small"))
def test_rtl_matches_model_long(config, seed):
    """Many more rows and seeds on Verilator."""
    if not simulator_available("verilator"):
        pytest.skip("verilator not installed")
    run_cocotb("matvec", config, "sim.cocotb.tb_matvec", simulator="verilator",
               env={"MOEKDA_SEED": seed, "MOEKDA_ROWS": 600}, test_name=f"long{seed}")


# ---- accumulator-only engine (the KDA unit requantises the wide sum itself) --

@pytest.mark.parametrize("period", [4.0, 1.0])
def test_accumulator_only_engine_matches_model_acc(period):
    """Amaranth simulation with a stalling consumer: acc bit-exact vs the model, y = 0,
    and the requantiser is not in the design."""
    from hw.arith.matvec import AccResolver, MatVecEngine, MatVecFormats
    fmt = MatVecFormats(lanes=4, clock_period_ns=period)
    dut = MatVecEngine(fmt, requantise=False)
    assert isinstance(dut.rq, AccResolver)
    rng = random.Random(7)
    beats = []
    for _ in range(12):
        length = rng.randint(1, 11)
        w = [rng.randint(-128, 127) for _ in range(length)]
        x = [rng.choice([-128, 127, rng.randint(-128, 127)]) for _ in range(length)]
        beats += row_beats(w, x, fmt.lanes, rng.randint(0, 65535), rng.randint(0, 40))
    expected = [r.acc for r in run_beats(beats, fmt.acc_bits)]
    got = []

    async def bench(ctx):
        sent = 0
        while len(got) < len(expected):
            if sent < len(beats):
                b = beats[sent]
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.p, {"w": list(b.w), "x": list(b.x), "first": b.first, "last": b.last,
                                  "mult": b.mult, "shift": b.shift})
            else:
                ctx.set(dut.i.valid, 0)
            ctx.set(dut.o.ready, rng.random() < 0.6)
            await ctx.delay(1e-9)   # settle the combinational handshakes before sampling
            took = sent < len(beats) and ctx.get(dut.i.ready)
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                assert ctx.get(dut.o.p.y) == 0
                got.append(ctx.get(dut.o.p.acc))
            await ctx.tick()
            sent += bool(took)

    simulate(dut, bench, period_s=1e-6)
    assert got == expected


# ---- several output widths, a tag, always ready (the MoE unit's engine) -----

@pytest.mark.parametrize("period,widths", [(4.0, (8, 16)), (1.0, (8, 6, 16)), (1.0, (8, 12))])
def test_width_select_and_tag_engine_matches_model(period, widths):
    """Amaranth simulation: every row saturated to its own out_widths[out_sel], its tag
    handed back with the result, exactly ``latency`` cycles after the last beat,
    with gaps in the input (the consumer never stalls; there is no FIFO)."""
    from amaranth.hdl import unsigned
    from hw.arith.matvec import MatVecEngine, MatVecFormats
    fmt = MatVecFormats(lanes=4, clock_period_ns=period, out_widths=widths, tag_shape=unsigned(7))
    dut = MatVecEngine(fmt, always_ready=True)
    assert dut.fifo_depth == 0
    rng = random.Random(len(widths) * 10 + int(period))
    beats = []
    for row in range(60):
        length = rng.randint(1, 11)
        w = [rng.choice([-128, 127, rng.randint(-128, 127)]) for _ in range(length)]
        x = [rng.choice([-128, 127, rng.randint(-128, 127)]) for _ in range(length)]
        m, s = rng.randrange(1 << fmt.mult_bits), rng.randint(0, 30)
        sel = rng.randrange(len(widths))
        beats += [Beat(b.w, b.x, b.first, b.last, b.mult, b.shift, out_sel=sel if b.last else 0,
                       tag=row % 128 if b.last else 0)
                  for b in row_beats(w, x, fmt.lanes, m, s)]
    want = run_beats(beats, fmt.acc_bits, out_widths=widths)
    assert {r.y for r in want} & {-(1 << (w - 1)) for w in widths}, "no row saturated"
    got, last_at, out_at = [], [], []

    async def bench(ctx):
        sent, cycle = 0, 0
        while len(got) < len(want) and cycle < 20 * len(beats):
            offer = sent < len(beats) and rng.random() < 0.7
            if offer:
                b = beats[sent]
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.p, {"w": list(b.w), "x": list(b.x), "first": b.first, "last": b.last,
                                  "mult": b.mult, "shift": b.shift, "out_sel": b.out_sel, "tag": b.tag})
            else:
                ctx.set(dut.i.valid, 0)
            await ctx.delay(1e-9)
            if ctx.get(dut.o.valid):
                got.append(Result(y=ctx.get(dut.o.p.y), acc=ctx.get(dut.o.p.acc), tag=ctx.get(dut.o.p.tag)))
                out_at.append(cycle)
            if offer:
                if beats[sent].last:
                    last_at.append(cycle)
                sent += 1
            await ctx.tick()
            cycle += 1

    simulate(dut, bench, period_s=1e-6)
    assert got == want
    assert [o - l for o, l in zip(out_at, last_at)] == [dut.latency] * len(want)
