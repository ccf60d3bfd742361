"""hw/moe/divider.py against Python's floor division, with stalls on both sides."""
import random

import pytest

from hw.moe.divider import SequentialDivider
from sim.pysim import simulate


@pytest.mark.parametrize("num_bits,den_bits,period,cycles_per_bit",
                         [(8, 8, 4.0, 1), (24, 12, 4.0, 1), (17, 5, 4.0, 1), (28, 18, 1.0, 2), (28, 18, 1.25, 1)])
def test_divider_floor_quotient(num_bits, den_bits, period, cycles_per_bit):
    rng = random.Random(num_bits)
    cases = [(0, 1), ((1 << num_bits) - 1, 1), ((1 << num_bits) - 1, (1 << den_bits) - 1), (5, 7), (7, 7)]
    cases += [(rng.randrange(1 << num_bits), rng.randrange(1, 1 << den_bits)) for _ in range(60)]
    dut = SequentialDivider(num_bits, den_bits, clock_period_ns=period)
    assert dut.cycles_per_bit == cycles_per_bit   # the clock decides the step
    got = []

    async def source(ctx):
        for num, den in cases:
            while rng.random() < 0.3:
                await ctx.tick()
            ctx.set(dut.inp.valid, 1)
            ctx.set(dut.inp.payload, {"num": num, "den": den})
            await ctx.tick().until(dut.inp.ready)
            ctx.set(dut.inp.valid, 0)

    async def sink(ctx):
        while len(got) < len(cases):
            ctx.set(dut.out.ready, rng.random() < 0.5)
            await ctx.delay(1e-9)
            if ctx.get(dut.out.valid) and ctx.get(dut.out.ready):
                got.append(ctx.get(dut.out.payload.quotient))
            await ctx.tick()

    simulate(dut, source, sink)
    assert got == [n // d for n, d in cases]
