"""hw/moe_arith.py: carry-save products equal Python's products (signed and unsigned)."""
import random

import pytest
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from hw.moe_arith import carry_save, const_products, partial_products


@pytest.mark.parametrize("a_shape,b_shape", [(signed(32), unsigned(16)), (signed(17), signed(16)),
                                             (unsigned(8), signed(5)), (signed(8), signed(8))])
def test_product_plus_addend(a_shape, b_shape):
    width = a_shape.width + b_shape.width + 2
    m = Module()
    a, b, c = Signal(a_shape), Signal(b_shape), Signal(signed(12))
    s, k = carry_save(partial_products(a, b, width) + [c], width)
    out = Signal(signed(width))
    m.d.comb += out.eq((s + k)[:width])
    k_const = 0b1011_0110_0101
    width2 = a_shape.width + k_const.bit_length() + 1
    s2, k2 = carry_save(const_products(a, k_const, width2), width2)
    out2 = Signal(signed(width2))
    m.d.comb += out2.eq((s2 + k2)[:width2])
    rng = random.Random(a_shape.width * 100 + b_shape.width)

    def rand(shape):
        lo = -(1 << (shape.width - 1)) if shape.signed else 0
        hi = (1 << (shape.width - 1)) - 1 if shape.signed else (1 << shape.width) - 1
        return rng.choice([lo, hi, 0, rng.randint(lo, hi), rng.randint(lo, hi)])

    async def bench(ctx):
        for _ in range(24):   # corner values are drawn often; the simulator is slow on wide trees
            va, vb, vc = rand(a_shape), rand(b_shape), rng.randint(-2048, 2047)
            ctx.set(a, va)
            ctx.set(b, vb)
            ctx.set(c, vc)
            await ctx.delay(1e-9)
            assert ctx.get(out) == va * vb + vc, (va, vb, vc)
            assert ctx.get(out2) == va * k_const

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("width", [1, 5, 19, 50])
def test_prefix_add_wraps_like_plus(width):
    from hw.moe_arith import prefix_add
    m = Module()
    a, b = Signal(width), Signal(width)
    out = prefix_add(m, a, b, width)
    rng = random.Random(width)

    async def bench(ctx):
        for _ in range(60):
            va, vb = rng.randrange(1 << width), rng.choice([0, (1 << width) - 1, rng.randrange(1 << width)])
            ctx.set(a, va)
            ctx.set(b, vb)
            await ctx.delay(1e-9)
            assert ctx.get(out) == (va + vb) % (1 << width)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
