"""hw/arith/carry_save.py ``prefix_add``: the Kogge-Stone adder against +, in both forms
(a + b + carry_in with the carry out on top; the modular form of ``width`` bits, its
operands extended by their shapes)."""
import random

import pytest
from amaranth.hdl import Module, Signal, signed
from amaranth.sim import Simulator

from hw.arith.carry_save import prefix_add


def _check(m, inputs, out, want, seed):
    rng = random.Random(seed)

    async def bench(ctx):
        for _ in range(60):
            values = []
            for sig in inputs:
                n = len(sig)
                v = rng.choice([0, (1 << n) - 1, rng.randrange(1 << n)])
                ctx.set(sig, v - (1 << n) * (sig.shape().signed and v >> (n - 1)))
                values.append(ctx.get(sig))
            await ctx.delay(1e-9)
            assert ctx.get(out) == want(*values), values

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("width", [1, 5, 19, 50])
def test_prefix_add_wraps_like_plus(width):
    m = Module()
    a, b = Signal(width), Signal(width)
    _check(m, [a, b], prefix_add(m, a, b, width=width), lambda va, vb: (va + vb) % (1 << width), width)


@pytest.mark.parametrize("width", [1, 8, 17, 33])
def test_prefix_add_carry_in_and_out(width):
    m = Module()
    a, b, cin = Signal(width), Signal(width), Signal()
    _check(m, [a, b, cin], prefix_add(m, a, b, carry_in=cin), lambda va, vb, c: va + vb + c, width)


@pytest.mark.parametrize("width", [6, 13])
def test_prefix_add_extends_by_shape(width):
    """A signed operand is sign-extended, an unsigned one zero-extended, to ``width``."""
    m = Module()
    a, b = Signal(signed(width - 3)), Signal(width - 2)
    _check(m, [a, b], prefix_add(m, a, b, width=width), lambda va, vb: (va + vb) % (1 << width), width)
