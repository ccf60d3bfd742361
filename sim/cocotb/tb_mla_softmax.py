"""cocotb bench of the MLA layer's online softmax (hw/mla/softmax.py) against the integer model.

Run through sim/tests/block/test_mla_softmax.py (sim/cocotb_util.run_cocotb, top ``mla_softmax``).
Expected values come only from model/int_mla.py ``online_softmax``.  The heads
(``softmax_heads``): corners first (one position; equal scores: every position a maximum;
scores rising by whole powers of two, so every position rescales the sums; a jump past any
shift; the score rails; falling scores; the latent rails), then heads of random length with
scores of a softmax's usual spread and of a wide one.  Parameters (environment,
cocotb_util.tb_param): MOEKDA_CONFIG, MOEKDA_SEED, MOEKDA_HEADS, MOEKDA_RESULT (json file for
the measured cycles).
"""
from __future__ import annotations

import json

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge

from hw.mla.softmax import RESOLVE, mla_softmax
from moekda.config import load_config
from moekda.formats import derived_widths, formats_for
from sim.cocotb.bench import BlockBench
from sim.cocotb.streams import LayoutCodec
from sim.cocotb_util import tb_param


def softmax_heads(cfg, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(u (T,), c (T, r)) per head: the corners, then random heads up to ``n`` in all."""
    fm = formats_for(cfg)
    r, F = cfg.model.kv_rank, fm.mla_exp_frac
    ulo, uhi = -(1 << (fm.mla_u_bits - 1)), (1 << (fm.mla_u_bits - 1)) - 1
    clo, chi = -(1 << (fm.act_bits - 1)), (1 << (fm.act_bits - 1)) - 1
    rng = np.random.default_rng(seed)
    lat = lambda T: rng.integers(clo, chi + 1, (T, r))
    heads = [
        (np.array([5]), lat(1)),
        (np.full(20, 3 << F), lat(20)),
        (np.arange(16) << F, lat(16)),
        (np.array([-(40 << F), 0, 100 << F, 17]), lat(4)),
        (np.array([ulo, uhi, ulo, uhi, 0]), lat(5)),
        (np.array([uhi, uhi - 1, 0, ulo]), np.tile(np.array([chi, clo])[:, None], (2, r))),
        (-(np.arange(24) << (F - 2)), np.full((24, r), clo)),
        (np.zeros(12, dtype=np.int64), np.full((12, r), chi)),
    ]
    while len(heads) < n:
        T = int(rng.integers(1, 48))
        spread = (4 << F) if rng.random() < 0.7 else (60 << F)
        u = np.clip(rng.normal(0, spread, T).astype(np.int64) + int(rng.integers(-8, 9) << F), ulo, uhi)
        heads.append((u, lat(T)))
    return heads[:n]


def expected(cfg, heads) -> list[list[int]]:
    from model.int_mla import online_softmax
    fm, w = formats_for(cfg), derived_widths(cfg)
    return [[int(v) for v in online_softmax(u.astype(np.int64), c.astype(np.int64), fm, w["mla_sum"],
                                            w["mla_acc"], fm.act_bits)] for u, c in heads]


class Bench(BlockBench):
    def __init__(self, dut, seed: int, n: int, stall: float, backpressure: float):
        super().__init__(dut, seed)
        self.cfg = load_config(tb_param("config"))
        self.heads = softmax_heads(self.cfg, n, seed)
        self.want = expected(self.cfg, self.heads)
        unit = mla_softmax(self.cfg)
        self.in_codec, self.out_codec = LayoutCodec(unit.i.payload.shape()), LayoutCodec(unit.o.payload.shape())
        self.driver = self.stream_driver("i", self.in_codec, stall)
        self.backpressure = backpressure
        self.q_bits = unit.q_bits
        self.sink = None

    def setup(self):
        self.start_streams(self.driver)

    async def start(self):
        await super().start()
        self.sink = self.stream_sink("o", self.out_codec, self.backpressure)   # once out of reset

    def send(self, heads):
        beats = []
        for u, c in heads:
            for j in range(len(u)):
                beats.append({"u": int(u[j]), "c": [int(v) for v in c[j]], "last": int(j == len(u) - 1)})
        self.driver.send(beats)

    def bound(self) -> float:
        """Cycles per head the unit cannot beat: its positions, or the divider's steps."""
        return max(max(len(u) for u, _ in self.heads), self.q_bits + 2) + 6

    async def wait_out(self, n: int, what: str) -> int:
        return await self.wait_for(self.sink.items, n, self.bound(), f"online softmax {what}")

    def check(self, what: str, done: int | None = None):
        got = self.sink.items
        want = self.want[:done] if done is not None else self.want
        for h, (g, w) in enumerate(zip(got, want)):
            u, _ = self.heads[h]
            assert list(g) == w, f"{what}: head {h} (T = {len(u)}, u[:4] = {list(u[:4])}): got {list(g)}, model {w}"
        assert len(got) == len(want), f"{what}: {len(got)} outputs for {len(want)} heads"
        assert not self.sink.problems, self.sink.problems[0]


@cocotb.test()
async def softmax_bit_exact_with_stalls(dut):
    """Stalls on ``i`` and back-pressure on ``o``; a first pass is cut by a reset in the middle
    of a head, then every head runs again from the start."""
    seed = tb_param("seed", 1, int)
    tb = Bench(dut, seed, tb_param("heads", 40, int), stall=0.3, backpressure=0.4)
    await tb.start()
    tb.send(tb.heads)
    await tb.wait_out(3, "first pass")
    sent = len(tb.driver.sent)
    while len(tb.driver.sent) < sent + 2:            # inside the next heads
        await RisingEdge(dut.clk)
    tb.driver.flush()
    await tb.reset(tb.rng.randrange(1, 4))
    done = len(tb.sink.items)
    tb.check("before the reset", done=done)
    tb.sink.items.clear()
    tb.sink.restart()
    tb.send(tb.heads)
    await tb.wait_out(len(tb.heads), "main pass")
    await ClockCycles(dut.clk, 40)                  # anything more would be extra
    tb.check("main pass")


@cocotb.test()
async def softmax_no_stalls(dut):
    """Heads of 32 positions back to back, ``o`` always ready: the cycles per head measured."""
    seed = tb_param("seed", 1, int) + 7
    tb = Bench(dut, seed, 8, stall=0.0, backpressure=0.0)
    rng = np.random.default_rng(seed)
    r = tb.cfg.model.kv_rank
    tb.heads = [(rng.integers(-(4 << 8), 4 << 8, 32), rng.integers(-128, 128, (32, r))) for _ in range(8)]
    tb.want = expected(tb.cfg, tb.heads)
    await tb.start()
    tb.send(tb.heads)
    await tb.wait_out(1, "first head")
    c0 = tb.cycle
    await tb.wait_out(len(tb.heads), "no stalls")
    per = (tb.cycle - c0) / (len(tb.heads) - 1)
    await ClockCycles(dut.clk, 20)
    tb.check("no stalls")
    # one position a cycle, RESOLVE + 1 per rise of the running maximum (resolve, shift), and
    # 2 RESOLVE + 1 between heads while the divider takes the sums (hw/mla/softmax.py)
    F = formats_for(tb.cfg).mla_exp_frac
    rises = np.mean([np.count_nonzero(np.diff(np.maximum.accumulate(-((-u) >> F)))) for u, _ in tb.heads[1:]])
    assert per <= 32 + (RESOLVE + 1) * rises + 2 * RESOLVE + 1, f"{per:.1f} cycles per head of 32 positions ({rises:.1f} rises of the maximum)"
    dut._log.info(f"no stalls: {per:.1f} cycles per head of 32 positions, {rises:.1f} rises of the maximum")
    out = tb_param("result")
    if out:
        with open(out, "w") as f:
            json.dump({"cycles_per_head": per, "positions": 32, "rises": rises}, f)


@cocotb.test(skip=tb_param("long") is None)     # only when asked for (the slow pytest)
async def softmax_long_head(dut):
    """One head over a cache of MOEKDA_LONG positions (the slow pytest: 4096, the sweep's
    longest context) with scores of a real softmax's spread and the latent rails among random latents,
    stalls and back-pressure: the sums at their widest, against the model."""
    seed = tb_param("seed", 1, int) + 11
    T = int(tb_param("long"))
    tb = Bench(dut, seed, 1, stall=0.1, backpressure=0.3)
    fm = formats_for(tb.cfg)
    rng = np.random.default_rng(seed)
    r = tb.cfg.model.kv_rank
    u = np.clip(rng.normal(0, 3 << fm.mla_exp_frac, T).astype(np.int64), -(1 << 23), (1 << 23) - 1)
    c = rng.integers(-128, 128, (T, r))
    c[: T // 2, 0] = 127                      # a column that leans on the top rail
    tb.heads = [(u, c), (u[:7], c[:7])]       # and a short head after it
    tb.want = expected(tb.cfg, tb.heads)
    await tb.start()
    tb.send(tb.heads)
    await tb.wait_out(2, f"a head of {T} positions")
    await ClockCycles(dut.clk, 20)
    tb.check(f"a head of {T} positions")
    dut._log.info(f"long head: {T} positions, out {tb.sink.items[0]}")
