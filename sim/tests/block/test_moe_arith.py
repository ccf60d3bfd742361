"""hw/moe/arith.py: the chunked counter counts every event."""
import random

import pytest
from amaranth.hdl import Module, Signal

from hw.moe.arith import chunked_counter
from hw.arith.pipeline import plan_pipeline
from sim.pysim import simulate


@pytest.mark.parametrize("period,width", [(1.0, 9), (4.0, 9)])
def test_chunked_counter_counts_and_wraps(period, width):
    """Bursts of events across chunk boundaries and through the wrap: once the events
    stop and the carries settle, the count equals the events seen (mod 2**width).
    The first plan's budget is cut to a 2-bit adder, so 9 bits are five chunks and
    the registered carries between them are exercised; the second is one chunk."""
    plan = plan_pipeline(period)
    if period == 1.0:   # a plan whose adder chunk is 2 bits: many chunk boundaries in 9 bits
        from dataclasses import replace
        plan = replace(plan, budget_ns=plan.delays.adder(2))
        assert plan.adder_chunk_bits() == 2
    m = Module()
    en = Signal()
    count = chunked_counter(m, plan, width, en, "c")
    rng = random.Random(width)

    async def bench(ctx):
        events = 0
        for _ in range(1200):
            on = rng.random() < 0.8
            ctx.set(en, on)
            events += on
            await ctx.tick()
            if rng.random() < 0.05:
                ctx.set(en, 0)
                await ctx.tick().repeat(6)
                assert ctx.get(count) == events % (1 << width)
        assert events >= 1 << width   # it wrapped
        ctx.set(en, 0)
        await ctx.tick().repeat(6)
        assert ctx.get(count) == events % (1 << width)

    simulate(m, bench, period_s=1e-6)

