"""hw/stream/skid.py: the register slice passes every beat once, in order, at full rate, and
what it drives depends on no input of the same cycle (the reason it is at the chip's pins)."""
from __future__ import annotations

import random

import pytest

from hw.stream.skid import SkidBuffer
from sim.pysim import simulate


@pytest.mark.parametrize("p_valid,p_ready,seed", [(1.0, 1.0, 1), (0.7, 0.5, 2), (0.3, 0.9, 3), (1.0, 0.2, 4)])
def test_skid_buffer_order_rate_and_registered_outputs(p_valid, p_ready, seed):
    dut = SkidBuffer(16)
    rng = random.Random(seed)
    sent, got = [], []
    cycles = 2000

    async def bench(ctx):
        word = 0
        for cycle in range(cycles):
            # what the slice drives before this cycle's inputs are applied ...
            before = (ctx.get(dut.i.ready), ctx.get(dut.o.valid), ctx.get(dut.o.payload))
            valid, ready = rng.random() < p_valid, rng.random() < p_ready
            ctx.set(dut.i.valid, valid)
            ctx.set(dut.i.payload, word)
            ctx.set(dut.o.ready, ready)
            # ... is what it drives after them: no combinational path through it
            assert (ctx.get(dut.i.ready), ctx.get(dut.o.valid), ctx.get(dut.o.payload)) == before, cycle
            if valid and ctx.get(dut.i.ready):
                sent.append(word)
                word = (word + 1) & 0xFFFF
            if ready and ctx.get(dut.o.valid):
                got.append(ctx.get(dut.o.payload))
            await ctx.tick()
            # a beat offered must stay offered, unchanged, until it is taken
            if ctx.get(dut.o.valid) and before[1] and not ready:
                assert ctx.get(dut.o.payload) == before[2], cycle

    simulate(dut, bench)
    assert got == sent[:len(got)]
    assert len(sent) - len(got) <= 2            # at most two beats inside the slice
    if p_valid == 1.0 and p_ready == 1.0:
        assert len(got) >= cycles - 2           # full rate, one cycle of latency
