"""hw/residual.py against sim.models.int_ops.int_residual_add, bit for bit: the layer's
two residual adds (KDA int8 branch, MoE resid_bits branch) of tiny and small, plus
corner scales (s = 0, a zero multiplier, all-ones multipliers), with random, extreme
and saturating operands, indices in any order and gaps in the valid stream."""
from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from hw.residual import ResidualAdd, csd_digits
from moekda.config import load_config
from moekda.formats import formats_for
from sim.models.int_ops import int_residual_add
from sim.models.qparams import QResidual
from sim.models.params import random_params
from sim.models.quantize import quantize_layer


def _layer_cases():
    out = []
    for name in ("tiny", "small"):
        cfg = load_config(name)
        fm = formats_for(cfg)
        q = quantize_layer(random_params(cfg, 0), cfg)
        d, rb = cfg.model.d_model, fm.resid_bits
        out.append((f"{name}-res1", q.res1, rb, fm.act_bits, d, cfg.hw.clock_period_ns, fm))
        out.append((f"{name}-res2", q.res2, rb, rb, d, cfg.hw.clock_period_ns, fm))
    return out


CASES = _layer_cases()
_fm = CASES[0][-1]
CASES += [
    ("s0", QResidual(m_a=3, m_b=1, s=0), 16, 8, 5, 1.0, _fm),           # no rounding, odd n
    ("mb0", QResidual(m_a=65535, m_b=0, s=16), 16, 16, 4, 0.8, _fm),    # a zero multiplier
    ("ones", QResidual(m_a=(1 << 16) - 1, m_b=(1 << 15) - 1, s=9), 16, 8, 16, 2.5, _fm),
]


@pytest.mark.parametrize("label,res,a_bits,b_bits,n,period,fm", CASES, ids=[c[0] for c in CASES])
def test_residual_matches_model(label, res, a_bits, b_bits, n, period, fm):
    dut = ResidualAdd(res, a_bits, b_bits, fm.resid_bits, n, clock_period_ns=period)
    rng = np.random.default_rng(7)
    alo, ahi = -(1 << (a_bits - 1)), (1 << (a_bits - 1)) - 1
    blo, bhi = -(1 << (b_bits - 1)), (1 << (b_bits - 1)) - 1
    vectors = [(rng.integers(alo, ahi + 1, n), rng.integers(blo, bhi + 1, n)) for _ in range(4)]
    vectors += [(np.full(n, alo), np.full(n, blo)), (np.full(n, ahi), np.full(n, bhi)),
                (np.full(n, alo), np.full(n, bhi)), (np.zeros(n, np.int64), np.zeros(n, np.int64)),
                (rng.integers(-4, 5, n), rng.integers(-4, 5, n))]
    want, got = [], []

    async def bench(ctx):
        for a, b in vectors:
            ctx.set(dut.a, [int(v) for v in a])
            ctx.set(dut.b, [int(v) for v in b])
            order = rng.permutation(n)
            want.append({int(i): int(int_residual_add(a[i], b[i], res, fm)) for i in order})
            seen, k = {}, 0
            for _ in range(4 * n + 64):
                issue = k < n and rng.random() < 0.7
                ctx.set(dut.valid, issue)
                ctx.set(dut.idx, int(order[k]) if issue else int(rng.integers(0, n)))
                if ctx.get(dut.wr_en):
                    seen[ctx.get(dut.wr_idx)] = ctx.get(dut.wr_y)
                await ctx.tick()
                k += issue
            ctx.set(dut.valid, 0)
            got.append(seen)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == want


@pytest.mark.parametrize("k", [0, 1, 2, 3, 7, 1016, 55891, 63132, (1 << 16) - 1, 0b1011011101111])
def test_csd_digits_sum_and_no_neighbours(k):
    digits = csd_digits(k)
    assert sum(d << s for s, d in digits) == k
    shifts = [s for s, _ in digits]
    assert all(b - a >= 2 for a, b in zip(shifts, shifts[1:]))
