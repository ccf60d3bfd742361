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


def test_shared_rsqrt_serves_each_client_its_own_results():
    """hw/arith/rsqrt.py SharedRsqrt: three clients of different widths ask at random times
    (often at once) and take their results with random stalls; each gets exactly the model's
    result for each of its own inputs, in its own order, and nothing else."""
    from hw.arith.rsqrt import SharedRsqrt
    cfg = load_config(sim_config("tiny"))
    fm = formats_for(cfg)
    widths = [derived_widths(cfg)["ss_onorm"], derived_widths(cfg)["ss_l2norm"], 9]
    dut = SharedRsqrt(fm, widths, cfg.hw.clock_period_ns)
    rng = np.random.default_rng(3)
    asks = [[int(rng.integers(1, 1 << w)) for _ in range(12)] + [(1 << w) - 1, 1] for w in widths]
    got = [[] for _ in widths]

    def client(n):
        port = getattr(dut, f"c{n}")
        wait = np.random.default_rng(10 + n)

        async def bench(ctx):
            for a in asks[n]:
                for _ in range(int(wait.integers(0, 3))):
                    await ctx.tick()
                ctx.set(port.i.payload, a)
                ctx.set(port.i.valid, 1)
                await ctx.tick().until(port.i.ready)
                ctx.set(port.i.valid, 0)
                while True:                      # take the result with random stalls
                    ready = bool(wait.integers(0, 2))
                    ctx.set(port.o.ready, ready)
                    # the values at the clock edge: the hand-over is the edge with both high
                    _clk, _rst, valid, y, E = await ctx.tick().sample(port.o.valid, port.o.payload.y,
                                                                      port.o.payload.E)
                    if ready and valid:
                        break
                got[n].append((y, E))
                ctx.set(port.o.ready, 0)
        return bench

    async def monitor(ctx):
        # a result is only ever offered to the client whose operation it is
        async for _clk, _rst, *valids in ctx.tick().sample(*(getattr(dut, f"c{n}").o.valid for n in range(3))):
            assert sum(valids) <= 1, valids

    simulate(dut, *(client(n) for n in range(3)), background=[monitor])
    for n in range(3):
        assert got[n] == [rsqrt_model(fm, a) for a in asks[n]], n
