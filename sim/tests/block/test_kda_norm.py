"""hw/kda/norm.py against model.int_ops.int_normalize, bit for bit, with the
q, k and o norms of a quantised layer sharing one unit."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hw.kda.norm import Normalizer, norm_layout
from moekda.config import load_config
from moekda.formats import clog2, formats_for
from sim.cocotb_util import sim_config, sim_configs
from model.int_ops import int_normalize
from model.params import random_params
from model.quantize import quantize_layer
from sim.pysim import simulate


# the configs of `make sim CONFIG=x` (sim/cocotb_util.py sim_configs), and the 12-bit q/k option on the first
@pytest.mark.parametrize("name,qk_bits", [(c, None) for c in sim_configs("tiny", "small")] + [(sim_config("tiny"), 12)])
def test_normalizer_matches_model(name, qk_bits):
    cfg = load_config(name)
    fm = formats_for(cfg)
    if qk_bits is not None:      # the measured 12-bit q/k option of docs/numerics.md
        fm = dataclasses.replace(fm, qk_bits=qk_bits)
    qk = quantize_layer(random_params(cfg, 0), cfg).kda
    n = cfg.model.head_dim
    norms = [qk.q_norm, qk.k_norm, qk.o_norm]
    in_bits = max(fm.qkv_bits, fm.o_bits)
    out_bits = [fm.qk_bits, fm.qk_bits, fm.act_bits]
    ss_bits = 2 * (in_bits - 1) + clog2(n + 1) + 1
    # the parameter fields: eps as wide as the sum of squares, s 5 bits (hw/image/param_map.py)
    dut = Normalizer(fm, n, in_bits, ss_bits, out_bits, norm_layout(ss_bits, fm.mult_bits, 5),
                     clock_period_ns=cfg.hw.clock_period_ns)
    rng = np.random.default_rng(3)
    a8, a16 = 1 << (fm.qkv_bits - 1), 1 << (fm.o_bits - 1)
    cases = []
    for r in range(8):
        cases.append((0, rng.integers(-a8, a8, n)))
        cases.append((1, rng.integers(-a8, a8, n) >> rng.integers(0, 15)))
        cases.append((2, rng.integers(-a16, a16, n) >> rng.integers(0, 15)))
    cases += [(2, np.zeros(n, np.int64)), (2, np.full(n, -a16)), (1, np.full(n, -a8)), (0, np.eye(1, n, 3)[0] * 5)]
    cases = [(mode, x.astype(np.int64)) for mode, x in cases]
    want = [list(int_normalize(x, norms[mode], fm, out_bits[mode])[0]) for mode, x in cases]
    got = []

    async def bench(ctx):
        for k, q in enumerate(norms):           # the run-time parameters of the three modes
            ctx.set(dut.norms[k].eps_int, int(q.eps_int))
            ctx.set(dut.norms[k].m, int(q.m))
            ctx.set(dut.norms[k].s, int(q.s))
        await ctx.tick()
        for mode, x in cases:
            ctx.set(dut.mode, mode)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            out = {}
            while True:
                ctx.set(dut.rd_x, int(x[ctx.get(dut.rd_idx)]))
                if ctx.get(dut.wr_en):
                    out[ctx.get(dut.wr_idx)] = ctx.get(dut.wr_y)
                busy = ctx.get(dut.busy)
                await ctx.tick()
                if not busy:
                    break
            got.append([out.get(i) for i in range(n)])

    simulate(dut, bench)
    assert len(got) == len(cases)
    for (mode, x), g, w in zip(cases, got, want):
        assert g == w, (mode, list(x))
