"""The chip's performance counters and output tags (issue 18, item 3).

* MACS is counted in hardware from the matrix-vector engines' ``beat`` outputs
  (hw/arith/matvec.py): ``hw.lanes`` per beat, padding lanes included, so a token
  adds hw/chip/layer.py ``engine_macs_per_token`` = the analytic ``macs_per_token``
  (studies/bench.py's traffic) + ``padding_macs_per_token``; the end-to-end runs
  (sim/cocotb/tb_layer.py) check MACS against it and read it while a token is inside.
* The output tag (token_out_layout ``seq``): run/driver.py places each output by it,
  so the out-of-order / duplicate branch of ``compare`` is fed by what the chip says.
"""
from __future__ import annotations

import random

import numpy as np

from hw.chip.csr import REGISTERS, LayerCsr
from moekda.config import load_config
from sim.cocotb_util import sim_config
from run.driver import RunPlan, compare, sequence_positions, tag_indices
from sim.pysim import simulate

CONFIG = sim_config("tiny")


def _csr_run(cfg, beats):
    """LayerCsr with per-cycle engine beats ``beats`` [(kda, moe), ...] and no token ever
    leaving; returns MACS read over the bus afterwards."""
    csr = LayerCsr(cfg, macs_per_token=12345, image_bytes=100)
    out = {}

    async def bench(ctx):
        for kda, moe in beats:
            ctx.set(csr.ev_mac, kda | moe << 1)
            await ctx.tick()
        ctx.set(csr.ev_mac, 0)
        await ctx.tick().repeat(64)         # beats owed from cycles with both engines
        ctx.set(csr.bus.cyc, 1)
        ctx.set(csr.bus.stb, 1)
        ctx.set(csr.bus.adr, REGISTERS["MACS"])
        await ctx.tick()
        await ctx.tick()
        out["macs"] = ctx.get(csr.bus.dat_r)
        ctx.set(csr.bus.adr, REGISTERS["TOKENS"])
        ctx.set(csr.bus.stb, 0)
        await ctx.tick()
        ctx.set(csr.bus.stb, 1)
        await ctx.tick()
        await ctx.tick()
        out["tokens"] = ctx.get(csr.bus.dat_r)

    simulate(csr, bench)
    return out


def test_macs_counts_engine_beats_not_tokens():
    """MACS = lanes x the engines' beats (either engine, both in one cycle counted twice),
    with no token delivered: a counter of work done, not TOKENS x a constant."""
    cfg = load_config(CONFIG)
    rng = random.Random(5)
    beats = [(int(rng.random() < 0.5), int(rng.random() < 0.3)) for _ in range(300)]
    beats += [(1, 1)] * 3                 # both engines in one cycle: counted in the next cycles
    got = _csr_run(cfg, beats)
    assert got["tokens"] == 0
    assert got["macs"] == cfg.hw.lanes * sum(k + m for k, m in beats)


def test_engine_beat_marks_every_beat_taken():
    """The engine's ``beat`` is high once per beat it takes (a cycle later), whatever the
    stalls on its input and output: the source of the MACS counter."""
    from hw.arith.matvec import MatVecEngine
    cfg = load_config(CONFIG)
    for always_ready in (False, True):
        eng = MatVecEngine(cfg, requantise=False, always_ready=always_ready)
        rng = random.Random(7)
        seen = {"taken": 0, "beats": 0}

        async def bench(ctx):
            for cycle in range(400):
                ctx.set(eng.i.valid, rng.random() < 0.7)
                ctx.set(eng.i.payload.last, rng.random() < 0.3)
                if not always_ready:
                    ctx.set(eng.o.ready, rng.random() < 0.5)
                await ctx.tick()
            ctx.set(eng.i.valid, 0)
            await ctx.tick().repeat(4)

        async def monitor(ctx):
            async for _, _, valid, ready, beat in ctx.tick().sample(eng.i.valid, eng.i.ready, eng.beat):
                seen["taken"] += valid & ready
                seen["beats"] += beat

        simulate(eng, bench, processes=[monitor], cycles=410)
        assert seen["taken"] > 100 and seen["beats"] == seen["taken"], (always_ready, seen)


def test_engine_macs_are_the_analytic_macs_plus_padding_lanes():
    """The counter's per-token growth against studies/bench.py's analytic MACs: equal where
    every row fills whole beats (tiny), the padding lanes more where it does not (small's
    f_up / g_up rows of gate_rank 8 on 16 lanes: 2 x 64 rows x 8 lanes)."""
    from hw.cost import traffic
    from hw.chip.layer import engine_macs_per_token, padding_macs_per_token
    for name, pad in (("tiny", 0), ("small", 2 * 64 * 8)):
        cfg = load_config(name)
        assert padding_macs_per_token(cfg) == pad
        assert engine_macs_per_token(cfg) == traffic(cfg).macs + pad
        # lanes == port bytes: every engine beat is a weight-port beat of the token
        assert engine_macs_per_token(cfg) == traffic(cfg).weight_bytes


def _plan():
    return RunPlan(tokens=9, first=(0, 3), clears=(6,), reset_at=4, abandon=1)


def test_sequence_positions_restart_with_every_sequence():
    # starts: 0 (first), 3 (first), 5 (after the reset), 6 (CLEAR)
    assert sequence_positions(_plan()).tolist() == [0, 1, 2, 0, 1, 0, 0, 1, 2]


def test_tags_place_the_outputs():
    """The outputs are placed by the chip's tags: a correct run passes, and a chip that
    duplicates, swaps, or does not restart its tag at a new sequence is caught, even when
    its payloads are the right ones in the bench's order."""
    plan = _plan()
    want = np.arange(18).reshape(9, 2)
    order = np.array([0, 1, 2, 3, 5, 6, 7, 8])         # token 4 lost to the reset (allowed)
    pos = sequence_positions(plan)
    assert compare(plan, want, np.arange(8), want[order], pos[order]) == []
    assert tag_indices(plan, pos[order])[0].tolist() == order.tolist()
    # a duplicated output: the payload of token 1 twice, tagged 1 twice
    dup = np.array([0, 1, 1, 2, 3, 5, 6, 7, 8])
    assert any("out of order or duplicated" in p for p in compare(plan, want, np.arange(9), want[dup], pos[dup]))
    # the bench's own numbering would have called these outputs 0..7 in order; the tags say
    # the chip gave token 2 before token 1
    swapped = np.array([0, 2, 1, 3, 5, 6, 7, 8])
    assert any("out of order" in p for p in compare(plan, want, np.arange(8), want[swapped], pos[swapped]))
    # a tag that does not restart at the CLEAR before token 6 runs past its sequence
    stale = pos[order].copy()
    stale[5:] = [1, 2, 3]
    problems = compare(plan, want, np.arange(8), want[order], stale)
    assert any("beyond its sequence" in p for p in problems)
    # a tag 0 where no sequence starts
    extra = pos[order].copy()
    extra[2] = 0
    assert compare(plan, want, np.arange(8), want[order], extra)


def test_tags_wrap_inside_a_long_sequence():
    from hw.chip.layer import SEQ_BITS
    n = (1 << SEQ_BITS) + 3
    plan = RunPlan(tokens=n, stall=False)
    tags = np.arange(n) % (1 << SEQ_BITS)
    idx, problems = tag_indices(plan, tags)
    assert problems == [] and idx.tolist() == list(range(n))
