"""hw/arith/counter.py: the chunked counter against Python integers, with random counting,
loads of constants and of another counter's next value, and wrap-around."""
from __future__ import annotations

import random

import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator

from hw.arith.counter import ChunkedCounter


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

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
