"""hw/kda/delta.py against model.int_kda.int_delta_rule, bit for bit,
over a sequence of tokens (state carried), a clear in the middle, and random
back-pressure on the output stream."""
from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import numpy as np
import pytest
from amaranth import ClockDomain, Module

from hw.kda.delta import DeltaRule, DeltaShifts
from moekda.config import load_config
from moekda.formats import formats_for
from model.int_kda import int_delta_rule
from sim.pysim import simulate


def random_token(rng, fm, H, dk, extreme=False):
    a = 1 << (fm.qk_bits - 1)
    av = 1 << (fm.qkv_bits - 1)
    if extreme:   # saturating corners: full-scale vectors, alpha ~ 1, beta = 1
        k = rng.choice([-a, a - 1], (H, dk))
        return dict(q=rng.choice([-a, a - 1], (H, dk)), k=k, v=rng.choice([-av, av - 1], (H, dk)),
                    alpha=np.full((H, dk), (1 << fm.alpha_frac) - 1), beta=np.full(H, 1 << fm.unit_frac))
    return dict(q=rng.integers(-a, a, (H, dk)), k=rng.integers(-a, a, (H, dk)), v=rng.integers(-av, av, (H, dk)) >> rng.integers(0, 9),
                alpha=rng.integers(1, 1 << fm.alpha_frac, (H, dk)), beta=rng.integers(0, (1 << fm.unit_frac) + 1, H))


def _run_and_check(dut, bench, memory: str, want: list, per_token: int, got_flat: list,
                   label=lambda t: f"token {t}") -> None:
    """Run ``bench`` on the delta rule with a monitor that appends every output beat to
    ``got_flat`` (the bench waits on it) and, for SRAM state, a watch on bank collisions; then
    no collision, and token t's ``per_token`` outputs equal ``want[t]`` (``label(t)`` names a
    failing token)."""
    collisions = []

    async def monitor(ctx):
        async for _, _, valid, ready, payload in ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.payload):
            if valid and ready:
                got_flat.append(payload)

    async def watch_banks(ctx):
        async for _, _, hit in ctx.tick().sample(dut.collision):
            if hit:
                collisions.append(1)

    simulate(dut, bench, processes=[monitor] + ([watch_banks] if memory == "sram" else []))
    assert not collisions, f"{len(collisions)} cycles with a read and a write in one SRAM bank"
    got = [got_flat[t * per_token:(t + 1) * per_token] for t in range(len(want))]
    for t in range(len(want)):
        assert got[t] == want[t], label(t)


# the clock period sets the pipeline depth (hw/arith/pipeline.py): 1.0 ns is the deepest
# pipeline the configs use, 2.5 ns a shallow one.  Each case with the state in flip-flops
# and in SRAM macros (hw.state_memory): the same outputs, and no bank collision
# (the flip-flop state's shapes run in the slow suite; its fast twins are the reset and
# layers-apart cases below, the same shapes in SRAM here)
@pytest.mark.parametrize("memory", [pytest.param("flops", marks=pytest.mark.slow), "sram"])
@pytest.mark.parametrize("H,dk,P,shifts,qk_bits,period", [
    (1, 8, 4, DeltaShifts(f_k=7, f_v=4, f_s=9, o_shift=8), None, 1.0),
    (2, 8, 2, DeltaShifts(f_k=6, f_v=6, f_s=6, o_shift=0), None, 1.25),
    (1, 4, 4, DeltaShifts(f_k=7, f_v=2, f_s=12, o_shift=12), None, 2.5),
    (1, 8, 4, DeltaShifts(f_k=11, f_v=4, f_s=10, o_shift=12), 12, 1.0),   # the 12-bit q/k option
])
def test_delta_rule_matches_model(H, dk, P, shifts, qk_bits, period, memory):
    cfg = load_config("tiny")
    fm = formats_for(cfg)
    if qk_bits is not None:
        fm = dataclasses.replace(fm, qk_bits=qk_bits)
    rng = np.random.default_rng(H * 100 + dk * 10 + P)
    T, clear_at = 12, {0, 7}
    tokens = [random_token(rng, fm, H, dk, extreme=(t in (3, 4, 5))) for t in range(T)]
    q = SimpleNamespace(f_k=shifts.f_k, f_v=shifts.f_v, f_s=shifts.f_s, o_shift=shifts.o_shift)
    want, S = [], np.zeros((H, dk, dk), np.int64)
    for t, tok in enumerate(tokens):
        if t in clear_at:
            S = np.zeros_like(S)
        S, o16 = int_delta_rule(q, fm, S, tok["q"], tok["k"], tok["v"], tok["alpha"], tok["beta"])
        want.append(o16.ravel().tolist())

    dut = DeltaRule(fm, H, dk, dk, P, clock_period_ns=period, state_memory=memory)
    stall = random.Random(P)
    got_flat = []

    async def bench(ctx):
        for name in ("f_k", "f_v", "f_s", "o_shift"):   # run-time inputs, stable from a cycle ahead
            ctx.set(getattr(dut.shifts, name), getattr(shifts, name))
        await ctx.tick()
        for t, tok in enumerate(tokens):
            for name in ("q", "k", "v", "alpha"):
                ctx.set(getattr(dut, name), [int(x) for x in tok[name].ravel()])
            ctx.set(dut.beta, [int(x) for x in tok["beta"]])
            if t in clear_at:
                ctx.set(dut.clear, 1)
                await ctx.tick()
                ctx.set(dut.clear, 0)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            while len(got_flat) < (t + 1) * H * dk:
                ctx.set(dut.o.ready, stall.random() < 0.7)
                await ctx.tick()
            ctx.set(dut.o.ready, 0)
            await ctx.tick().until(~dut.busy)

    _run_and_check(dut, bench, memory, want, H * dk, got_flat)


@pytest.mark.parametrize("memory", ["flops", "sram"])
def test_delta_rule_reset_mid_token(memory):
    """A reset in the middle of a token (reads and writes in flight, the state half
    rewritten): afterwards the state reads as zero (a new sequence) and the following tokens
    are bit-exact again, whichever memory holds the state (an SRAM keeps its contents over
    reset; the cleared flag hides them)."""
    cfg = load_config("tiny")
    fm = formats_for(cfg)
    H, dk, P = 1, 8, 4
    shifts = DeltaShifts(f_k=7, f_v=4, f_s=9, o_shift=8)
    q = SimpleNamespace(**vars(shifts))
    rng = np.random.default_rng(5)
    tokens = [random_token(rng, fm, H, dk) for _ in range(5)]
    reset_in = 2                 # token 2 is cut off by the reset; 3 and 4 start from zero
    want, S = {}, np.zeros((H, dk, dk), np.int64)
    for t, tok in enumerate(tokens):
        if t == reset_in + 1:
            S = np.zeros_like(S)
        S2, o16 = int_delta_rule(q, fm, S, tok["q"], tok["k"], tok["v"], tok["alpha"], tok["beta"])
        if t != reset_in:
            S = S2
            want[t] = o16.ravel().tolist()
    dut = DeltaRule(fm, H, dk, dk, P, clock_period_ns=1.0, state_memory=memory)
    got = {}

    async def bench(ctx):
        for name in ("f_k", "f_v", "f_s", "o_shift"):
            ctx.set(getattr(dut.shifts, name), getattr(shifts, name))
        ctx.set(dut.o.ready, 1)
        await ctx.tick()
        for t, tok in enumerate(tokens):
            for name in ("q", "k", "v", "alpha"):
                ctx.set(getattr(dut, name), [int(x) for x in tok[name].ravel()])
            ctx.set(dut.beta, [int(x) for x in tok["beta"]])
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            out, n = [], 0
            while ctx.get(dut.busy) or len(out) < H * dk:
                if ctx.get(dut.o.valid):
                    out.append(ctx.get(dut.o.payload))
                await ctx.tick()
                n += 1
                if t == reset_in and n == 23:          # mid pass 2 of the first columns
                    ctx.set(sync.rst, 1)
                    await ctx.tick()
                    ctx.set(sync.rst, 0)
                    break
            if t != reset_in:
                got[t] = out

    top = Module()                     # a sync domain whose reset the bench drives
    top.domains.sync = sync = ClockDomain("sync")
    top.submodules.dut = dut
    simulate(top, bench)
    assert got == want


@pytest.mark.parametrize("memory", ["flops", "sram"])
def test_delta_rule_layers_apart(memory):
    """Three layers' states on one delta rule (a model's layers on one datapath): tokens of
    the layers in an irregular order, each token reading and writing only its own layer's
    state; a clear of one layer (also one issued while another layer's token runs) starts
    that layer alone from zero; the states before any clear are zero (reset)."""
    cfg = load_config("tiny")
    fm = formats_for(cfg)
    H, dk, P, L = 1, 8, 4, 3
    shifts = DeltaShifts(f_k=7, f_v=4, f_s=9, o_shift=8)
    q = SimpleNamespace(**vars(shifts))
    rng = np.random.default_rng(11)
    layers = [2, 0, 2, 2, 1, 0, 1, 2, 0, 0, 1, 2, 1, 0]
    T = len(layers)
    clear_before = {3: [2], 5: [0], 9: [1]}        # token t: these layers are cleared just before it
    clear_during = {6: [2]}                        # issued while token t (layer 1) runs
    tokens = [random_token(rng, fm, H, dk, extreme=(t == 4)) for t in range(T)]
    S = [np.zeros((H, dk, dk), np.int64) for _ in range(L)]
    want = []
    for t, tok in enumerate(tokens):
        for l in clear_before.get(t, []):
            S[l] = np.zeros_like(S[l])
        l = layers[t]
        S[l], o16 = int_delta_rule(q, fm, S[l], tok["q"], tok["k"], tok["v"], tok["alpha"], tok["beta"])
        want.append(o16.ravel().tolist())
        for c in clear_during.get(t, []):
            S[c] = np.zeros_like(S[c])
    dut = DeltaRule(fm, H, dk, dk, P, clock_period_ns=1.0, state_memory=memory, layers=L)
    got_flat = []

    async def bench(ctx):
        for name in ("f_k", "f_v", "f_s", "o_shift"):
            ctx.set(getattr(dut.shifts, name), getattr(shifts, name))
        ctx.set(dut.o.ready, 1)
        await ctx.tick()
        for t, tok in enumerate(tokens):
            for name in ("q", "k", "v", "alpha"):
                ctx.set(getattr(dut, name), [int(x) for x in tok[name].ravel()])
            ctx.set(dut.beta, [int(x) for x in tok["beta"]])
            if t in clear_before:
                ctx.set(dut.clear, sum(1 << l for l in clear_before[t]))
                await ctx.tick()
                ctx.set(dut.clear, 0)
            ctx.set(dut.layer, layers[t])
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            if t in clear_during:
                await ctx.tick().repeat(5)
                ctx.set(dut.clear, sum(1 << l for l in clear_during[t]))
                await ctx.tick()
                ctx.set(dut.clear, 0)
            await ctx.tick().until(~dut.busy)

    _run_and_check(dut, bench, memory, want, H * dk, got_flat, lambda t: f"token {t} (layer {layers[t]})")
