"""hw/arith/residual.py against model.int_ops.int_residual_add, bit for bit: the layer's
two residual adds (KDA int8 branch, MoE resid_bits branch) of tiny and small, plus
corner scales (s = 0, a zero multiplier, all-ones multipliers, shifts past the sum's
width), with random, extreme and saturating operands, indices in any order and gaps in
the valid stream.  (m_a, m_b, s) are run-time inputs: one elaborated unit runs several
scale sets in turn, and its layout is the parameter map's res1 / res2 sub-bank."""
from __future__ import annotations

import numpy as np
import pytest
from amaranth.back import rtlil

from hw.image.param_map import param_layout, region_value
from hw.arith.residual import ResidualAdd, residual_layout
from moekda.config import load_config
from moekda.formats import formats_for
from sim.cocotb_util import sim_configs
from model.int_ops import int_residual_add
from model.qparams import QResidual
from model.params import random_params
from model.quantize import quantize_layer
from sim.pysim import simulate


def _layer_cases():
    out = []
    for name in sim_configs("tiny", "small"):      # MOEKDA_CONFIG when set (`make sim CONFIG=x`)
        cfg = load_config(name)
        fm = formats_for(cfg)
        qs = [quantize_layer(random_params(cfg, seed), cfg) for seed in (0, 1)]
        d, rb = cfg.model.d_model, fm.resid_bits
        out.append((f"{name}-res1", [q.res1 for q in qs], rb, fm.act_bits, d, cfg.hw.clock_period_ns, fm))
        out.append((f"{name}-res2", [q.res2 for q in qs], rb, rb, d, cfg.hw.clock_period_ns, fm))
    return out


CASES = _layer_cases()
_fm = CASES[0][-1]
CASES += [
    # one unit, several scale sets in turn: no rounding (s = 0), a zero multiplier, all ones,
    # shifts at and past the sum's width (clamped: the result is 0 or saturates the same way)
    ("corners", [QResidual(m_a=3, m_b=1, s=0), QResidual(m_a=65535, m_b=0, s=16),
                 QResidual(m_a=(1 << 16) - 1, m_b=(1 << 16) - 1, s=9), QResidual(m_a=0, m_b=0, s=5),
                 QResidual(m_a=40000, m_b=50000, s=33), QResidual(m_a=40000, m_b=50000, s=63)],
     16, 8, 5, 1.0, _fm),
    ("wide-b", [QResidual(m_a=63132, m_b=28059, s=16), QResidual(m_a=1, m_b=65535, s=1)],
     16, 16, 4, 0.8, _fm),
    ("slow-clock", [QResidual(m_a=1016, m_b=55891, s=10)], 16, 8, 16, 2.5, _fm),
]


def _params(res):
    return {"m_a": int(res.m_a), "m_b": int(res.m_b), "s": int(res.s)}


# small's adds are tiny's at other widths (the corners below reach past both): the slow suite's
@pytest.mark.parametrize("label,scales,a_bits,b_bits,n,period,fm",
                         [pytest.param(*c, id=c[0], marks=[pytest.mark.slow] if c[0].startswith("small-") else [])
                          for c in CASES])
def test_residual_matches_model(label, scales, a_bits, b_bits, n, period, fm):
    dut = ResidualAdd(a_bits, b_bits, fm.resid_bits, n, clock_period_ns=period, mult_bits=fm.mult_bits)
    rng = np.random.default_rng(7)
    alo, ahi = -(1 << (a_bits - 1)), (1 << (a_bits - 1)) - 1
    blo, bhi = -(1 << (b_bits - 1)), (1 << (b_bits - 1)) - 1
    vectors = [(rng.integers(alo, ahi + 1, n), rng.integers(blo, bhi + 1, n)) for _ in range(3)]
    vectors += [(np.full(n, alo), np.full(n, blo)), (np.full(n, ahi), np.full(n, bhi)),
                (np.full(n, alo), np.full(n, bhi)), (np.zeros(n, np.int64), np.zeros(n, np.int64)),
                (rng.integers(-4, 5, n), rng.integers(-4, 5, n))]
    want, got = [], []

    async def bench(ctx):
        for res in scales:
            ctx.set(dut.params, _params(res))
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

    simulate(dut, bench)
    assert got == want


@pytest.mark.parametrize("name", sim_configs("tiny", "small"))
def test_params_port_is_the_bank_slice(name):
    """The port's layout is param_layout(cfg, "res1") (and "res2"): the layer wires the
    bank's slice straight in, and a model's region value sets exactly (m_a, m_b, s)."""
    cfg = load_config(name)
    fm = formats_for(cfg)
    dut = ResidualAdd.for_config(cfg, fm.act_bits, cfg.model.d_model)
    assert dut.params.shape() == param_layout(cfg, "res1") == param_layout(cfg, "res2") \
        == residual_layout(fm.mult_bits)
    q = quantize_layer(random_params(cfg, 0), cfg)
    bits = region_value(cfg, q.to_flat(), "res2")
    lay = dut.params.shape()
    got = {k: (bits >> lay[k].offset) & ((1 << lay[k].shape.width) - 1) for k in ("m_a", "m_b", "s")}
    assert got == _params(q.res2)
    rtlil.convert(dut)


def test_netlist_independent_of_the_scales():
    """The RTL is a function of the widths alone: no scale is an argument any more."""
    cfg = load_config("tiny")
    fm = formats_for(cfg)
    texts = {rtlil.convert(ResidualAdd.for_config(cfg, fm.act_bits, 8)) for _ in range(2)}
    assert len(texts) == 1
