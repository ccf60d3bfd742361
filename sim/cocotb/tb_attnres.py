"""cocotb bench of the Attention Residuals depth unit (hw/attnres/unit.py) against the integer
model (model/int_attn_res.py ``IntDepthResidual``), bit for bit.

Run through sim/tests/block/test_attnres.py (sim/cocotb_util.run_cocotb, top ``attnres``).  The
model is ``quick_model`` of the config (its queries, logit requantisers, key norm and x_0
requantiser, in its memory image on the weight memory and its ``params`` bits on the port)
with two query rows replaced by the int8 rails.  Each slot runs whole tokens: START x_0,
then MIX, ADD v_n for n = 1 .. N, then the output's MIX; the slots' commands interleave at
random.  The expectation of each MIX is ``IntDepthResidual`` of that slot's token, fed v_n
directly (out_m = 1, out_s = 0: what reaches the unit is already at the depth scale, from
the chip's residual add).  Corners: x_0 and v_n on the resid_bits rails (block partials
saturate), all zeros (a key of eps alone), one-hot vectors; the rest random of a residual
stream's spread.  Parameters (environment, cocotb_util.tb_param): MOEKDA_CONFIG,
MOEKDA_SEED, MOEKDA_TOKENS (per slot), MOEKDA_RESULT (json file for the measured cycles).
"""
from __future__ import annotations

import dataclasses
import json
import random

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge

from hw.attnres.kept import kept_vectors, sublayers
from hw.attnres.unit import Op, command_layout
from hw.image.memory_map import sequence_slots
from hw.image.param_map import region_value
from moekda.config import load_config
from moekda.formats import formats_for
from sim.cocotb.bench import BlockBench
from sim.cocotb.streams import LayoutCodec
from sim.cocotb.weight_memory import WeightMemory
from sim.cocotb_util import tb_param


def depth_model(cfg, seed: int):
    """(QModel with its queries' rails, its image): the unit's parameters and memory."""
    from model.image import qmodel_image
    from model.cases import quick_model
    qm = quick_model(cfg, seed)[1]
    qs = qm.attn_res.queries.copy()
    qs[0], qs[2] = 127, -128                 # the largest logits of either sign
    qm.attn_res = dataclasses.replace(qm.attn_res, queries=qs)
    return qm, qmodel_image(cfg, qm)


def token_vectors(cfg, rng, corner: int | None) -> np.ndarray:
    """x_0 and v_1 .. v_N of one token: (N + 1, d) resid_bits."""
    fm = formats_for(cfg)
    lo, hi = -(1 << (fm.resid_bits - 1)), (1 << (fm.resid_bits - 1)) - 1
    N, d = sublayers(cfg), cfg.model.d_model
    v = np.clip(rng.normal(0, 3000, (N + 1, d)).astype(np.int64), lo, hi)
    if corner == 0:
        v[:] = hi                              # every partial saturates
    elif corner == 1:
        v[:] = lo
    elif corner == 2:
        v[1::2] = 0                            # keys of eps alone
        v[0] = 0
    elif corner == 3:
        v[:] = 0
        for k in range(N + 1):
            v[k, k % d] = hi if k % 2 else lo  # one-hot values
    return v


def slot_commands(cfg, qar, vectors) -> list[tuple]:
    """(op, v, expected or None) of one slot's tokens, in order."""
    from model.int_attn_res import IntDepthResidual
    direct = dataclasses.replace(qar, out_m=np.ones_like(qar.out_m), out_s=np.zeros_like(qar.out_s))
    N = sublayers(cfg)
    out = []
    for v in vectors:
        r = IntDepthResidual(direct, cfg, v[0])
        out.append((Op.START, v[0], None))
        for n in range(1, N + 1):
            out.append((Op.MIX, None, [int(x) for x in r.input(n)]))
            r.add(n, v[n])
            out.append((Op.ADD, v[n], None))
        out.append((Op.MIX, None, [int(x) for x in r.output()]))
    return out


def interleave(per_slot: list[list], rng: random.Random) -> list[tuple]:
    """The slots' commands merged at random, each slot's in order: (slot, op, v, expected)."""
    pos = [0] * len(per_slot)
    out = []
    while any(p < len(c) for p, c in zip(pos, per_slot)):
        s = rng.choice([s for s, c in enumerate(per_slot) if pos[s] < len(c)])
        out.append((s, *per_slot[s][pos[s]]))
        pos[s] += 1
    return out


def mix_bound(cfg) -> float:
    """Cycles a command takes at the least, on average over a token's (the unit's roofline):
    a MIX's query beats, one engine beat group per kept value and the softmax's divider; a
    START / ADD's residual add and normaliser passes over d."""
    fm, m = formats_for(cfg), cfg.model
    K = kept_vectors(m.attn_res, sublayers(cfg), m.attn_res_block)
    d, W = m.d_model, cfg.hw.weight_port_bytes
    mix = -(-d // W) + K * -(-d // cfg.hw.lanes) + 2 * (fm.resid_bits + 1) + 1
    add = 3 * d + 20
    return (mix + add) / 2


class Bench(BlockBench):
    def __init__(self, dut, seed: int, stall: float, backpressure: float):
        super().__init__(dut, seed)
        self.seed = seed
        self.cfg = load_config(tb_param("config"))
        self.fm = formats_for(self.cfg)
        self.nrng = np.random.default_rng(seed)
        self.qm, self.image = depth_model(self.cfg, seed)
        self.codec = LayoutCodec(command_layout(self.cfg))
        self.out_codec = LayoutCodec(self.dut_o_layout())
        self.driver = self.stream_driver("i", self.codec, stall)
        self.monitor = self.stream_monitor("o", self.out_codec, backpressure)
        self.stall = stall
        self.wmem = None

    def dut_o_layout(self):
        from amaranth.lib import data
        from amaranth import signed
        return data.ArrayLayout(signed(self.fm.resid_bits), self.cfg.model.d_model)

    def commands(self, tokens: int, corners: bool) -> list[tuple]:
        slots = sequence_slots(self.cfg)
        per_slot = []
        for s in range(slots):
            vecs = [token_vectors(self.cfg, self.nrng, (s + 2 * t) if corners and s + 2 * t < 4 else None)
                    for t in range(tokens)]
            per_slot.append(slot_commands(self.cfg, self.qm.attn_res, vecs))
        return interleave(per_slot, self.rng)

    def send(self, cmds):
        d = self.cfg.model.d_model
        noise = lambda: [self.rng.randrange(-5000, 5000) for _ in range(d)]
        self.driver.send([{"op": op.value, "slot": s, "v": noise() if v is None else [int(x) for x in v]}
                          for s, op, v, _ in cmds])

    def setup(self):
        dut = self.dut
        dut.rst.value = 1
        dut.params.value = region_value(self.cfg, self.qm.to_flat(), "attn_res", mixer="head")
        self.start_streams(self.driver, self.monitor)
        self.start_memory()

    def start_memory(self):
        st = self.stall
        self.wmem = WeightMemory(self.dut, self.image, self.cfg.hw.weight_port_bytes,
                                 self.cfg.hw.weight_port_latency, req_stall=st * 0.6, resp_stall=st * 0.5,
                                 seed=self.rng.randrange(1 << 30)).start()

    async def wait_out(self, n: int, commands: int, what: str) -> int:
        """Until ``n`` mixes came out, within the limit of ``commands`` commands."""
        return await self.wait_for(self.monitor.items, n, mix_bound(self.cfg), f"depth unit {what}", inputs=commands)

    def check(self, what: str, cmds, done: int | None = None):
        want = [(s, e) for s, op, _, e in cmds if op == Op.MIX]
        got = self.monitor.items
        if done is not None:
            want = want[:done]
        for k, (g, (s, e)) in enumerate(zip(got, want)):
            assert list(g) == e, f"{what}: mix {k} (slot {s}): got {list(g)}, model {e}"
        assert len(got) == len(want), f"{what}: {len(got)} outputs for {len(want)} mixes"


@cocotb.test()
async def depth_bit_exact_with_stalls(dut):
    """Stalls on ``i`` and the weight port, back-pressure on ``o``, the slots interleaved; a
    first pass is cut by a reset after a few mixes, then every token runs again."""
    tb = Bench(dut, tb_param("seed", 1, int), stall=0.3, backpressure=0.4)
    await tb.start()
    first = tb.commands(2, corners=False)
    tb.send(first)
    await tb.wait_out(5, len(first), "first pass")
    tb.driver.flush()
    tb.wmem.stop()
    await tb.reset(tb.rng.randrange(1, 4))
    done = len(tb.monitor.items)
    tb.check("before the reset", first, done=done)
    tb.monitor.items.clear()
    tb.start_memory()
    cmds = tb.commands(tb_param("tokens", 3, int), corners=True)
    tb.send(cmds)
    mixes = sum(op == Op.MIX for _, op, _, _ in cmds)
    await tb.wait_out(mixes, len(cmds), "main pass")
    await ClockCycles(dut.clk, 60)                  # anything more would be extra
    tb.check("main pass", cmds)
    dut._log.info(f"{mixes} mixes bit-exact after a reset {done} mixes into the first pass")


@cocotb.test()
async def depth_no_stalls(dut):
    """One slot's tokens back to back, nothing stalls: cycles per token and per mix."""
    tb = Bench(dut, tb_param("seed", 1, int) + 5, stall=0.0, backpressure=0.0)
    await tb.start()
    per_slot = [slot_commands(tb.cfg, tb.qm.attn_res, [token_vectors(tb.cfg, tb.nrng, None) for _ in range(3)])]
    cmds = interleave(per_slot, tb.rng)
    taken, outs = [], []                # the cycle each command was taken, each mix came out

    async def watch():
        while True:
            await RisingEdge(dut.clk)
            taken.extend([tb.cycle] * (len(tb.driver.sent) - len(taken)))
            outs.extend([tb.cycle] * (len(tb.monitor.items) - len(outs)))
    cocotb.start_soon(watch())
    tb.send(cmds)
    mixes = sum(op == Op.MIX for _, op, _, _ in cmds)
    per_token = mixes // 3
    await tb.wait_out(per_token, len(cmds), "first token")
    c0 = tb.cycle
    await tb.wait_out(mixes, len(cmds), "no stalls")
    token = (tb.cycle - c0) / 2
    await ClockCycles(dut.clk, 20)
    tb.check("no stalls", cmds)
    m = tb.cfg.model
    # a MIX: from its acceptance to its output; a START or ADD: until the next command is taken
    ops = [op for _, op, _, _ in cmds]
    mix_at = [taken[k] for k, op in enumerate(ops) if op == Op.MIX]
    mix = float(np.mean([o - t for o, t in zip(outs, mix_at)]))
    add = float(np.mean([taken[k + 1] - taken[k] for k, op in enumerate(ops[:-1]) if op != Op.MIX]))
    dut._log.info(f"no stalls: {token:.0f} cycles per token ({per_token} mixes, {sublayers(tb.cfg)} adds, "
                  f"attn_res {m.attn_res}); {mix:.1f} cycles per mix (command to output), {add:.1f} per START/ADD")
    out = tb_param("result")
    if out:
        with open(out, "w") as f:
            json.dump({"cycles_per_token": token, "mixes_per_token": per_token, "adds_per_token": sublayers(tb.cfg) + 1,
                       "cycles_per_mix": mix, "cycles_per_add": add}, f)
