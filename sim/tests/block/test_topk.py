"""The streaming top-k selector (hw/moe/topk.py) against a plain sort, with stalls.

Reference: rank by key, largest first; equal keys: lower index first.  Keys
are drawn from small ranges so ties are frequent, and all-equal rows are
included; valid and ready toggle randomly on both streams.
"""
import random

import pytest

from hw.moe.topk import TopK
from sim.pysim import simulate


def reference_topk(keys, k):
    return sorted(range(len(keys)), key=lambda i: (-keys[i], i))[:k]


def run_selector(n, k, key_bits, rows, tags, seed, p_valid=0.7, p_ready=0.6):
    dut = TopK(n, k, key_bits, tag_bits=8)
    rng = random.Random(seed)
    got = []

    async def source(ctx):
        for row, trow in zip(rows, tags):
            for key, tag in zip(row, trow):
                while rng.random() > p_valid:
                    ctx.set(dut.inp.valid, 0)
                    await ctx.tick()
                ctx.set(dut.inp.valid, 1)
                ctx.set(dut.inp.payload, {"key": key, "tag": tag})
                await ctx.tick().until(dut.inp.ready)
            ctx.set(dut.inp.valid, 0)

    async def sink(ctx):
        while len(got) < len(rows):
            ctx.set(dut.out.ready, rng.random() < p_ready)
            await ctx.delay(1e-9)  # let out.valid settle before sampling the handshake
            if ctx.get(dut.out.valid) and ctx.get(dut.out.ready):
                sel = ctx.get(dut.out.payload)
                got.append([(e["index"], e["key"], e["tag"]) for e in sel["entries"]])
            await ctx.tick()

    simulate(dut, source, sink)
    return got


@pytest.mark.parametrize("n,k,key_bits", [(1, 1, 8), (4, 1, 8), (4, 2, 16), (4, 4, 8), (8, 2, 16),
                                          (8, 8, 4), (64, 8, 16), (65, 64, 8)])
def test_topk_matches_sorted_order(n, k, key_bits):
    rng = random.Random(n * 1000 + k)
    lo, hi = -(1 << (key_bits - 1)), (1 << (key_bits - 1)) - 1
    rows = [[lo] * n, [hi] * n, [0] * n]                         # all equal: indices 0..k-1
    rows += [[rng.randint(lo, hi) for _ in range(n)] for _ in range(6)]
    rows += [[rng.choice([lo, -1, 0, hi]) for _ in range(n)] for _ in range(6)]  # heavy ties
    rows += [list(range(n))[::-1][:n], [min(i, hi) for i in range(n)]]  # sorted either way
    rows = [[max(lo, min(hi, v)) for v in r] for r in rows]
    tags = [[rng.randrange(256) for _ in range(n)] for _ in rows]
    got = run_selector(n, k, key_bits, rows, tags, seed=n + k)
    assert len(got) == len(rows)
    for row, trow, sel in zip(rows, tags, got):
        want = reference_topk(row, k)
        assert [e[0] for e in sel] == want, f"keys {row}"
        assert [e[1] for e in sel] == [row[i] for i in want]
        assert [e[2] for e in sel] == [trow[i] for i in want]


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_topk_rejects_k_above_n():
    with pytest.raises(ValueError, match="k = 5"):
        TopK(4, 5, 8)
