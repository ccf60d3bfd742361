"""hw/arith/silu.py against the integer model's int_silu, bit for bit: every code of every
op, the ops interleaved cycle by cycle (the KDA's q, k, v share one pipeline), at the clock
periods of tiny (1.25 ns) and small (1 ns), whose stage counts differ."""
from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth import Const, Module, Signal, signed

from hw.arith.pipeline import Pipe, plan_pipeline
from hw.arith.silu import silu
from moekda.config import load_config
from moekda.formats import formats_for
from model.int_ops import int_silu
from model.quantize import _silu
from sim.cocotb_util import sim_configs
from sim.pysim import simulate


@pytest.mark.parametrize("config", sim_configs("tiny", "small", slow=("small",)))
def test_silu_unit_matches_int_silu(config):
    cfg = load_config(config)
    fm = formats_for(cfg)
    lb, out_bits = fm.lut_in_bits, fm.qkv_bits
    # three ops at the scales the quantiser gives q (c * sigmoid kept), v (a power of two) and
    # an MoE gate (the code's own scale, int8-sized values in a 16-bit output here)
    ops = [_silu(0.031, 0.031 * 2.0 ** -fm.unit_frac, out_bits, fm), _silu(0.0047, 2.0 ** -11, out_bits, fm),
           _silu(0.25, 0.25, out_bits, fm)]
    m = Module()
    valid, op, code = Signal(), Signal(2), Signal(signed(lb))
    pipe = Pipe(m, plan_pipeline(cfg.hw.clock_period_ns), "silu")
    live = silu(pipe, {"valid": valid, "op": op, "code": code}, "code", "op",
                [tuple(Const(getattr(q, f), 16) for f in ("t_m", "t_s", "m", "s")) for q in ops], out_bits, fm)
    live = pipe.register(live)
    latency = pipe.stages
    codes = list(range(-(1 << (lb - 1)), 1 << (lb - 1)))
    rng = random.Random(config)
    stream = [(rng.randrange(3), c) for c in codes for _ in range(2)]
    rng.shuffle(stream)
    want = [int(int_silu(ops[k], c, fm)) for k, c in stream]

    async def bench(ctx):
        got = []
        await ctx.tick().repeat(3)            # the parameter registers
        for n in range(len(stream) + latency + 2):
            if n < len(stream):
                k, c = stream[n]
                ctx.set(valid, 1)
                ctx.set(op, k)
                ctx.set(code, c)
            else:
                ctx.set(valid, 0)
            await ctx.tick()
            if ctx.get(live["valid"]):
                got.append(ctx.get(live["silu"]))
        assert len(got) == len(want)
        bad = [i for i in range(len(want)) if got[i] != want[i]]
        assert not bad, (len(bad), [(stream[i], got[i], want[i]) for i in bad[:5]])

    simulate(m, bench, period_s=1e-6)
    assert np.all(np.abs(want) < 1 << (out_bits - 1))
