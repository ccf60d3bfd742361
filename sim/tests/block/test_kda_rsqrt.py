"""hw/arith/rsqrt.py against moekda.numerics.rsqrt_fixed, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from hw.arith.rsqrt import Rsqrt
from moekda.config import load_config
from moekda.formats import derived_widths, formats_for
from moekda.numerics import rsqrt_fixed
from sim.cocotb_util import sim_config
from sim.pysim import simulate


def rsqrt_model(fm, a):
    y, E = rsqrt_fixed(np.array([a]), fm.rsqrt_norm_bits, fm.rsqrt_frac, fm.rsqrt_seed,
                       fm.rsqrt_seed_bits, fm.rsqrt_newton_steps)
    return int(y[0]), int(np.asarray(E)[0])


@pytest.mark.parametrize("width_name", ["ss_l2norm", "ss_onorm"])
def test_rsqrt_matches_model(width_name):
    cfg = load_config(sim_config("small"))     # small's widths are the widest; MOEKDA_CONFIG's when set
    fm = formats_for(cfg)
    in_bits = derived_widths(cfg)[width_name]
    dut = Rsqrt(fm, in_bits, cfg.hw.clock_period_ns)
    rng = np.random.default_rng(in_bits)
    # every bit length, its edges, and random values of random magnitude
    vals = [1, 2, 3, (1 << in_bits) - 1]
    for b in range(1, in_bits + 1):
        vals += [1 << (b - 1), (1 << b) - 1]
    vals += [int(rng.integers(1, 1 << int(rng.integers(1, in_bits + 1)))) for _ in range(150)]
    got = []

    async def bench(ctx):
        for a in vals:
            ctx.set(dut.i.payload, a)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)
            ctx.set(dut.o.ready, 1)
            await ctx.tick().until(dut.o.valid)
            got.append((ctx.get(dut.o.payload.y), ctx.get(dut.o.payload.E)))
            ctx.set(dut.o.ready, 0)

    simulate(dut, bench)
    assert len(got) == len(vals)
    want = [rsqrt_model(fm, a) for a in vals]
    bad = [(a, g, w) for a, g, w in zip(vals, got, want) if g != w]
    assert not bad, bad[:5]
