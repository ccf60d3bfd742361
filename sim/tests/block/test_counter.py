"""hw/arith/counter.py: the chunked counter against Python integers, with random counting,
loads of constants and of another counter's next value, and wrap-around; ``event_counter``
(the units' counters) exact in every cycle, through the chunks' carries and a clear."""
from __future__ import annotations

import random

import pytest
from amaranth import Module, Signal

from hw.arith.counter import ChunkedCounter, event_counter
from sim.pysim import simulate


@pytest.mark.parametrize("width,step", [(32, 1), (32, 0x3A7F1), (20, 16), (12, 0xFFF), (5, 3)])
def test_counter_matches_integers(width, step):
    m = Module()
    a = ChunkedCounter(width, step, name="a")
    b = ChunkedCounter(width, 1, name="b")
    load_a, load_b, start = Signal(), Signal(), Signal(width)
    a.load(load_a, start)
    b.load(load_b, a.next)
    a.elaborate(m)
    b.elaborate(m)
    mask = (1 << width) - 1
    rng = random.Random(width * 7 + step)
    # start near wrap-around points of the chunks and of the whole counter
    starts = [0, mask, mask - 3 * step, 0xFF - step, 0xFFFF - 2 * step, rng.getrandbits(width)]

    async def bench(ctx):
        va, vb = 0, 0
        for cycle in range(3000):
            inc_a, inc_b = rng.random() < 0.9, rng.random() < 0.5
            la, lb = rng.random() < 0.01, rng.random() < 0.05
            s = starts[rng.randrange(len(starts))] & mask
            ctx.set(a.inc, inc_a)
            ctx.set(b.inc, inc_b)
            ctx.set(load_a, la)
            ctx.set(load_b, lb)
            ctx.set(start, s)
            assert ctx.get(a.value) == va and ctx.get(b.value) == vb, cycle
            next_a = (va + step * inc_a) & mask
            assert ctx.get(a.next) == next_a
            await ctx.tick()
            va, vb = (s if la else next_a), (next_a if lb else (vb + inc_b) & mask)

    simulate(m, bench)


@pytest.mark.parametrize("width,step", [(32, 4), (32, 0x1FFF1), (9, 3)])
def test_counter_with_a_second_step_matches_integers(width, step):
    """``step2`` (the MACS counter's two beats in a cycle): inc2 adds 2 step and wins over
    inc; loads and wrap-around as above."""
    m = Module()
    a = ChunkedCounter(width, step, name="a", step2=2 * step)
    load_a, start = Signal(), Signal(width)
    a.load(load_a, start)
    a.elaborate(m)
    mask = (1 << width) - 1
    rng = random.Random(width * 11 + step)
    starts = [0, mask, mask - 5 * step, 0xFF - 2 * step, 0xFFFF - 3 * step, rng.getrandbits(width)]

    async def bench(ctx):
        va = 0
        for cycle in range(3000):
            inc, inc2, la = rng.random() < 0.6, rng.random() < 0.5, rng.random() < 0.01
            s = starts[rng.randrange(len(starts))] & mask
            ctx.set(a.inc, inc)
            ctx.set(a.inc2, inc2)
            ctx.set(load_a, la)
            ctx.set(start, s)
            assert ctx.get(a.value) == va, cycle
            nxt = (va + (2 * step if inc2 else step * inc)) & mask
            assert ctx.get(a.next) == nxt, cycle
            await ctx.tick()
            va = s if la else nxt

    simulate(m, bench)


@pytest.mark.parametrize("width", [9, 32])
def test_event_counter_exact_every_cycle(width):
    """Bursts of events (most cycles, or a cycle or more apart, as the units' token counts),
    through the chunks' carries (and, 9 bits, the wrap of the whole count); ``clear``
    restarts it at 2 (the units' token_count).  The count is exact in every cycle, not only
    once the events stop."""
    m = Module()
    event, clear = Signal(), Signal()
    count = event_counter(m, event, "n", width, clear=clear, clear_to=2)
    mask = (1 << width) - 1
    rng = random.Random(width)

    async def bench(ctx):
        want, wrapped = 0, False
        for cycle in range(3000):
            on = rng.random() < (0.9 if cycle % 400 < 200 else 0.3)
            cl = cycle in (700, 701, 2900)
            ctx.set(event, on)
            ctx.set(clear, cl)
            assert ctx.get(count) == want, cycle
            await ctx.tick()
            wrapped = wrapped or (not cl and want + on > mask)
            want = 2 if cl else (want + on) & mask
        assert wrapped or width > 9

    simulate(m, bench)
