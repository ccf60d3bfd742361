"""Unit tests of the KDA unit's format-independent parts (Amaranth simulator).

Each block is compared with a direct numpy statement of what it must do,
under random valid/ready stalls.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from hw.kda.state import StateMemory, state_address, state_geometry, state_word
from hw.arith.lut import LookupTable, check_table, tabulate
from hw.kda.short_conv import ShortConv
from moekda.config import load_config
from sim.pysim import simulate

# the blocks here keep their own sizes, not a config's; their clock is tiny's
TINY_CLOCK_NS = load_config("tiny").hw.clock_period_ns


def run(dut, bench, *processes):
    simulate(dut, bench, processes=processes)


async def _state_read(ctx, dut, addr: int, lanes: int) -> list[int]:
    """One read of a StateMemory: issue, wait its READ_LATENCY, the ``lanes`` entries."""
    ctx.set(dut.rd_addr, addr)
    ctx.set(dut.rd_en, 1)
    await ctx.tick()
    ctx.set(dut.rd_en, 0)
    await ctx.tick().repeat(dut.READ_LATENCY - 1)
    return [ctx.get(dut.rd_data[i]) for i in range(lanes)]


# ---- lookup table -------------------------------------------------------------

@pytest.mark.parametrize("in_bits,fn", [
    (8, lambda x: round(127 / (1 + np.exp(-x / 16)))),   # sigmoid-like, unsigned
    (6, lambda x: x * abs(x) // 3 - 5),                    # signed, wider than the input
])
def test_lut_reads_every_entry(in_bits, fn):
    table, shape = check_table(tabulate(fn, in_bits), in_bits)
    dut = LookupTable(in_bits, shape)
    lo = -(1 << (in_bits - 1))
    order = list(range(lo, -lo))
    random.Random(1).shuffle(order)

    async def bench(ctx):
        for n, v in enumerate(table):
            ctx.set(dut.table[n], v)
        for x in order:
            ctx.set(dut.addr, x)
            ctx.set(dut.en, 1)
            await ctx.tick()
            ctx.set(dut.en, 0)
            ctx.set(dut.addr, lo)        # a new address without en must not change data
            await ctx.tick()
            assert ctx.get(dut.data) == fn(x), x
    run(dut, bench)


def test_lut_rejects_bad_tables():
    from amaranth import signed
    with pytest.raises(ValueError, match="needs 256 entries"):
        check_table([0] * 255, 8)
    with pytest.raises(ValueError, match="does not fit"):
        check_table([200] * 64, 6, shape=signed(8))


# ---- state memory ---------------------------------------------------------------

def test_state_layout_is_a_bijection():
    H, dk, dv, P = 2, 8, 4, 4
    words = state_geometry(H, dk, dv, P)
    seen = {state_word(h, i, j, dk, dv, P) for h in range(H) for i in range(dk) for j in range(dv)}
    assert len(seen) == H * dk * dv and all(0 <= w < words and 0 <= ln < P for w, ln in seen)
    with pytest.raises(ValueError, match="state_lanes = 3"):
        state_geometry(1, 8, 8, 3)


@pytest.mark.parametrize("kind", ["flops", "sram"])
def test_state_memory_clear_and_commit(kind):
    H, dk, dv, P, bits = 1, 8, 4, 4, 16
    dut = StateMemory(H, dk, dv, P, bits, kind=kind)
    rng = np.random.default_rng(2)
    shadow = np.zeros((dut.words, P), np.int64)

    async def read(ctx, addr):
        return await _state_read(ctx, dut, addr, P)

    async def bench(ctx):
        assert ctx.get(dut.cleared) == 1             # reset: reads as zero
        for w in range(dut.words):                   # fill while cleared
            shadow[w] = rng.integers(-(1 << 15), 1 << 15, P)
            ctx.set(dut.wr_addr, w)
            ctx.set(dut.wr_data, [int(v) for v in shadow[w]])
            ctx.set(dut.wr_en, 1)
            assert await read(ctx, w) == [0] * P
        ctx.set(dut.wr_en, 0)
        ctx.set(dut.commit, 1)
        await ctx.tick()
        ctx.set(dut.commit, 0)
        for w in rng.permutation(dut.words):
            assert await read(ctx, int(w)) == list(shadow[w])
        # a read issued while cleared stays zero even if commit lands as it returns
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        ctx.set(dut.rd_addr, 3)
        ctx.set(dut.rd_en, 1)
        ctx.set(dut.commit, 1)
        await ctx.tick()
        ctx.set(dut.rd_en, 0)
        ctx.set(dut.commit, 0)
        await ctx.tick().repeat(dut.READ_LATENCY - 1)
        assert [ctx.get(dut.rd_data[i]) for i in range(P)] == [0] * P
        assert await read(ctx, 3) == list(shadow[3])
    run(dut, bench)


@pytest.mark.parametrize("H,dk,dv,P,L", [(1, 16, 16, 4, 1), (2, 32, 32, 4, 1), (1, 8, 8, 8, 1),
                                         (1, 16, 16, 4, 4), (1, 8, 8, 8, 3)])
def test_state_memory_sram_banks(H, dk, dv, P, L):
    """The SRAM state memory (tiny's, small's geometry, a one-word-per-column one, and
    model-tiny's 4 layers: 2 x 2 macros a bank, and 3 layers) against a shadow array: a
    read and a write every cycle, in different banks, random addresses of every layer and
    data; a read sees every write issued before its cycle; ``collision`` rises exactly when
    both hit one bank (the write wins, the read returns zero)."""
    bits = 16
    dut = StateMemory(H, dk, dv, P, bits, kind="sram", layers=L)
    assert dut.macros.count * dut.macros.spec.words * dut.macros.spec.bits >= L * dut.words * P * bits // 2
    if (H, dk, dv, P, L) == (1, 16, 16, 4, 4):      # more layers: more macro rows (a row select)
        assert (dut.macros.spec.name, dut.macros.rows, dut.macros.cols) == ("fakeram45_64x32", 2, 2)
    rng = np.random.default_rng(H + dk + P + L)
    addrs = np.array(dut.addresses)
    assert len(addrs) == L * dut.words
    by_bank = [addrs[addrs % 2 == b] for b in (0, 1)]
    shadow = np.zeros((dut.addr_space, P), np.int64)
    lo, hi = -(1 << (bits - 1)), 1 << (bits - 1)

    async def bench(ctx):
        ctx.set(dut.commit, (1 << L) - 1)            # reads return contents from here on
        await ctx.tick()
        ctx.set(dut.commit, 0)
        for w in addrs:                              # fill
            w = int(w)
            shadow[w] = rng.integers(lo, hi, P)
            ctx.set(dut.wr_addr, w)
            ctx.set(dut.wr_data, [int(v) for v in shadow[w]])
            ctx.set(dut.wr_en, 1)
            await ctx.tick()
        pending = []                                 # (cycle the data is out, expected)
        for cycle in range(6 * len(addrs)):
            r = int(rng.choice(addrs))
            w = int(rng.choice(by_bank[1 - r % 2]))   # the other bank
            clash = cycle % 37 == 36                  # now and then both in one bank
            if clash:
                w = r
            ctx.set(dut.rd_addr, r)
            ctx.set(dut.rd_en, 1)
            expect = [0] * P if clash else list(shadow[r])
            data = rng.integers(lo, hi, P)
            ctx.set(dut.wr_addr, w)
            ctx.set(dut.wr_data, [int(v) for v in data])
            ctx.set(dut.wr_en, 1)
            assert ctx.get(dut.collision) == clash, cycle
            shadow[w] = data
            pending.append((cycle + dut.READ_LATENCY, expect, r))
            await ctx.tick()
            if pending[0][0] == cycle + 1:
                _, want, addr = pending.pop(0)
                assert [ctx.get(dut.rd_data[i]) for i in range(P)] == want, (cycle, addr)
    run(dut, bench)


@pytest.mark.parametrize("kind", ["flops", "sram"])
def test_state_memory_layers_clear_apart(kind):
    """Three layers' states in one memory: the layer is the high part of the address
    (``state_address``), each layer has its own cleared flag, and a clear or commit of one
    layer leaves the other layers' words and flags as they are."""
    H, dk, dv, P, bits, L = 1, 8, 4, 4, 16, 3
    dut = StateMemory(H, dk, dv, P, bits, kind=kind, layers=L)
    assert dut.words == state_geometry(H, dk, dv, P) == 8
    assert [state_address(l, 5, dut.words) for l in range(L)] == [5, 13, 21]
    rng = np.random.default_rng(7)
    shadow = {}

    async def read(ctx, addr):
        return await _state_read(ctx, dut, addr, P)

    async def strobe(ctx, port, layers):
        ctx.set(port, sum(1 << l for l in layers))
        await ctx.tick()
        ctx.set(port, 0)

    async def check(ctx, live):
        """Every word of every layer: its contents if its layer is live, else zero."""
        assert ctx.get(dut.cleared) == sum(1 << l for l in range(L) if l not in live)
        for a in rng.permutation(dut.addresses):
            a = int(a)
            want = list(shadow[a]) if a // 8 in live else [0] * P
            assert await read(ctx, a) == want, (a, live)

    async def write(ctx, a):
        """A random word at address ``a``, remembered in ``shadow`` (wr_en stays high)."""
        shadow[a] = rng.integers(-(1 << 15), 1 << 15, P)
        ctx.set(dut.wr_addr, a)
        ctx.set(dut.wr_data, [int(v) for v in shadow[a]])
        ctx.set(dut.wr_en, 1)
        await ctx.tick()

    async def bench(ctx):
        assert ctx.get(dut.cleared) == (1 << L) - 1              # reset: every layer clear
        for a in dut.addresses:
            await write(ctx, a)
        ctx.set(dut.wr_en, 0)
        await check(ctx, set())
        await strobe(ctx, dut.commit, [1])
        await check(ctx, {1})
        await strobe(ctx, dut.commit, [0, 2])
        await check(ctx, {0, 1, 2})
        await strobe(ctx, dut.clear, [1])
        await check(ctx, {0, 2})
        # clear and commit of different layers in one cycle; clear wins within a layer
        ctx.set(dut.clear, 0b100)
        ctx.set(dut.commit, 0b110)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        ctx.set(dut.commit, 0)
        await check(ctx, {0, 1})
        # a write to one layer does not reach the same word of another
        a0, a1 = state_address(0, 3, 8), state_address(1, 3, 8)
        await write(ctx, a1)
        ctx.set(dut.wr_en, 0)
        assert await read(ctx, a0) == list(shadow[a0])
        assert await read(ctx, a1) == list(shadow[a1])
    run(dut, bench)


# ---- short convolution ----------------------------------------------------------

def conv_reference(w, tokens, restarts, layers=None):
    """Direct statement: zero history before each sequence start.  With ``layers`` (the
    layer of each token) one history per layer, ``w[l]`` layer l's taps, and a restart at
    token t starts t's layer again."""
    layers = [0] * len(tokens) if layers is None else layers
    w = np.asarray(w)
    w = w[None] if w.ndim == 2 else w
    K = w.shape[2]
    out, hists = [], {}
    for t, x in enumerate(tokens):
        l = layers[t]
        if t in restarts:
            hists[l] = []
        hist = hists[l] = (hists.get(l, []) + [x])[-K:]
        window = [np.zeros(len(x), np.int64)] * (K - len(hist)) + hist
        out.append(sum(w[l][:, j] * window[j] for j in range(K)))
    return np.array(out)


def tap_words_of(w, word_bytes):
    """The tap memory's words (ShortConv ``tap_memory``) of taps ``w`` (layers x C x K int8):
    layer by layer, each word ``word_bytes`` of whole channels' taps, oldest tap first."""
    flat = np.asarray(w, dtype=np.int64).reshape(-1) & 0xFF
    return [int.from_bytes(bytes(flat[i:i + word_bytes].tolist()), "little") for i in range(0, len(flat), word_bytes)]


@pytest.mark.parametrize("memory,always_ready,taps", [("flops", False, "port"), ("sram", False, "port"),
                                                      ("sram", True, "port"), ("flops", True, "port"),
                                                      ("sram", False, "sram"), ("sram", True, "sram")])
@pytest.mark.parametrize("C,K,L", [(6, 4, 1), (5, 2, 1), (3, 1, 1), (6, 4, 3), (5, 2, 2), (40, 4, 3)])
def test_short_conv_matches_reference_under_stalls(C, K, L, memory, always_ready, taps):
    """One layer, and L layers' tokens interleaved in an irregular order (each layer its
    own taps, history and restarts; the layer input moves on as soon as a token's last
    channel is taken).  The history in flip-flops and in SRAM (one masked access per
    channel, the window rotated by the token's phase; 40 channels x 3 layers take two
    macro rows), with the output FIFO and without it (``always_ready``: the sink takes
    every result, so only the input stalls).  The taps on the ``taps`` input, or in their
    SRAM (``tap_memory``: written first through ``tap_w``; words of 1, 2 and 4 channels)."""
    if (C, K, L) == (40, 4, 3) and memory == "flops":
        pytest.skip("the two-row macro case; the flip-flop history is the same code at every size")
    if taps == "sram" and K == 1:
        pytest.skip("no history, no tap memory: the taps stay on the input")
    # the widest word of a power of two of channels (at most 4) that C is a whole number of
    per = max(n for n in (1, 2, 4) if C % n == 0)
    tap_memory = (L, K * per) if taps == "sram" else None
    rng = np.random.default_rng(C * 10 + K + 100 * (L - 1))
    w = rng.integers(-128, 128, (L, C, K))
    w[:, 0] = -128                                 # extreme products
    T = 14 if L == 1 else 24
    tokens = [rng.integers(-128, 128, C) for _ in range(T)]
    tokens[1][:] = -128
    if L == 1:
        layers, restarts = [0] * T, {0, 6, 7}
    else:
        layers = [int(v) for v in rng.integers(0, L, T)]
        layers[:4] = [L - 1, 0, L - 1, L - 1]     # a layer twice in a row, and back to one
        restarts = {0, 5, 6, 13} | {t for t in range(T) if layers[t] == 0 and t > 16}
    want = conv_reference(w, tokens, restarts, layers).reshape(-1)
    dut = ShortConv(C, K, clock_period_ns=TINY_CLOCK_NS, layers=L, memory=memory, always_ready=always_ready,
                    tap_memory=tap_memory)
    assert (dut.macros is not None) == (memory == "sram" and K > 1)
    if (C, K, L) == (40, 4, 3):
        assert dut.macros.rows == 2
    got = []
    stall = random.Random(K)

    async def source(ctx):
        await ctx.tick()
        if tap_memory:                          # LOAD's writes, one word a cycle
            for n, word in enumerate(tap_words_of(w, tap_memory[1])):
                ctx.set(dut.tap_w.valid, 1)
                ctx.set(dut.tap_w.addr, n)
                ctx.set(dut.tap_w.data, word)
                await ctx.tick()
            ctx.set(dut.tap_w.valid, 0)
        for t, x in enumerate(tokens):
            l = layers[t]
            if tap_memory:
                if L > 1:                       # the token's layer of taps
                    ctx.set(dut.tap_layer, l)
            else:
                for c in range(C):              # the taps are a run-time input: the layer's
                    ctx.set(dut.taps[c], [int(v) for v in w[l][c]])
            if L > 1:
                ctx.set(dut.layer, l)
            if t in restarts:
                # a restart is a strobe between tokens, for the layer starting again
                ctx.set(dut.restart, 1 << l)
                await ctx.tick()
                ctx.set(dut.restart, 0)
            for c in range(C):
                while stall.random() < 0.3:
                    await ctx.tick()
                ctx.set(dut.i.payload, int(x[c]))
                ctx.set(dut.i.valid, 1)
                if always_ready:
                    await ctx.tick()
                else:
                    await ctx.tick().until(dut.i.ready)
                ctx.set(dut.i.valid, 0)

    async def sink(ctx):          # random back-pressure; the monitor records transfers
        if always_ready:
            return
        while len(got) < len(want):
            ctx.set(dut.o.ready, stall.random() < 0.6)
            await ctx.tick()
        ctx.set(dut.o.ready, 0)

    async def monitor(ctx):
        async for clk_edge, rst, valid, ready, payload in ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.payload):
            if valid and ready:
                got.append(payload)
            if len(got) == len(want):
                break

    simulate(dut, source, sink, processes=[monitor], cycles=4000 if C < 40 else 8000)
    assert got == [int(v) for v in want]


@pytest.mark.parametrize("memory", ["flops", "sram"])
@pytest.mark.parametrize("period", [0.8, 1.25, 2.5])
def test_short_conv_is_always_ready_at_full_rate(period, memory):
    """With ``o`` always ready, ``i`` takes a channel every cycle, tokens back to back: the
    KDA unit sends its rows without looking at ``ready`` (a row a cycle when d_model =
    lanes), so a not-ready cycle there is a lost channel.  The pipeline depth follows
    from the clock, so several periods."""
    C, K = 5, 4
    dut = ShortConv(C, K, clock_period_ns=period, memory=memory)
    not_ready, outs = [], []

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        for c in range(C):
            ctx.set(dut.taps[c], [1] * K)
        await ctx.tick()
        ctx.set(dut.i.valid, 1)
        for n in range(8 * C):
            ctx.set(dut.i.payload, n % 7 - 3)
            if not ctx.get(dut.i.ready):
                not_ready.append(n)
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for _ in range(40):
            await ctx.tick()

    async def monitor(ctx):
        async for clk_edge, rst, valid, payload in ctx.tick().sample(dut.o.valid, dut.o.payload):
            if valid:
                outs.append(payload)

    simulate(dut, bench, processes=[monitor], cycles=200)
    assert not_ready == [] and len(outs) == 8 * C, (not_ready, len(outs))
    # all taps 1: each sum is the channel's last K inputs (fewer at the start); at full
    # rate the SRAM history reads and writes a word every cycle
    x = [n % 7 - 3 for n in range(8 * C)]
    assert outs == [sum(x[n - j * C] for j in range(K) if n - j * C >= 0) for n in range(8 * C)]


# ---- requantisation with run-time (m, s) ---------------------------------------------

@pytest.mark.parametrize("period", [1.0, pytest.param(2.5, marks=pytest.mark.slow)])   # 2.5: shallow pipeline
def test_requantise_runtime_m_s_matches_model(period):
    """hw/arith/booth_multiply.py ``requantise`` with (m, s) per op as inputs against
    moekda.numerics.requantize, bit for bit: every op's own (m, s) and output width,
    s = 0, small and large shifts, shifts past the product width (0, as the model)."""
    from amaranth import Module, signed, unsigned
    from amaranth.lib import data, wiring
    from amaranth.lib.wiring import In, Out

    from hw.arith.booth_multiply import requantise
    from hw.arith.pipeline import Pipe, plan_pipeline
    from moekda.numerics import requantize

    vbits, mb, sbits, width, outs = 33, 16, 6, 51, (8, 8, 12)

    class Dut(wiring.Component):
        def __init__(self):
            super().__init__({"valid": In(1), "op": In(2), "value": In(signed(vbits)),
                              "m": In(data.ArrayLayout(unsigned(mb), 3)), "s": In(data.ArrayLayout(unsigned(sbits), 3)),
                              "out_valid": Out(1), "out_op": Out(2), "y": Out(signed(max(outs)))})

        def elaborate(self, platform):
            m = Module()
            pipe = Pipe(m, plan_pipeline(period), "t")
            live = requantise(pipe, {"valid": self.valid, "op": self.op}, self.value, "op",
                              [(self.m[k], self.s[k], outs[k]) for k in range(3)], width, "y")
            live = pipe.register(live)
            m.d.comb += [self.out_valid.eq(live["valid"]), self.out_op.eq(live["op"]), self.y.eq(live["y"])]
            return m

    dut = Dut()
    rng = np.random.default_rng(int(period * 10))
    settings = [((1, 1, 1), (0, 0, 0)), ((65535, 40000, 12345), (1, 22, 30)),
                ((65535, 65535, 65535), (47, 48, 49)), ((65535, 3, 65535), (50, 51, 63)),
                ((32768, 50000, 7), (23, 14, 5))]
    settings += [(tuple(int(v) for v in rng.integers(1, 1 << mb, 3)), tuple(int(v) for v in rng.integers(0, 64, 3)))
                 for _ in range(6)]
    lo, hi = -(1 << (vbits - 1)), (1 << (vbits - 1)) - 1
    mismatches = []

    async def bench(ctx):
        for ms, ss in settings:
            for k in range(3):
                ctx.set(dut.m[k], ms[k])
                ctx.set(dut.s[k], ss[k])
            ctx.set(dut.valid, 0)
            await ctx.tick().repeat(2)          # the parameters are registered once
            vals = [lo, hi, 0, -1, 1] + [int(v) >> int(rng.integers(0, 32)) for v in rng.integers(lo, hi, 40)]
            sent = [(n % 3, v) for n, v in enumerate(vals)]
            got = []
            for item in sent + [None] * 40:     # a value per cycle, then the pipeline drains
                ctx.set(dut.valid, item is not None)
                if item is not None:
                    ctx.set(dut.op, item[0])
                    ctx.set(dut.value, item[1])
                await ctx.tick()
                if ctx.get(dut.out_valid):
                    got.append(ctx.get(dut.y))
            want = [int(requantize(v, ms[op], ss[op], outs[op])) for op, v in sent]
            if got != want:
                mismatches.append((ms, ss, got, want))

    simulate(dut, bench)
    assert not mismatches, mismatches[0]
