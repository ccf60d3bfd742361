"""cocotb bench of the model chip's head (hw/chip/head.py) against the integer model.

Run through sim/tests/block/test_head.py (sim/cocotb_util.run_cocotb, top ``head``).  The model is
the quick quantised model of model/cases.py, with two rows of W made equal so that
one input has its largest logit twice (the lower index must win); its image (model/image.py)
is the weight memory (sim/cocotb/weight_memory.py: latency, random stalls) and its head block
the ``params`` port.  Expected values come only from model/int_model.py (int_head_step,
int_argmax).  Parameters (environment, cocotb_util.tb_param): MOEKDA_CONFIG, MOEKDA_SEED,
MOEKDA_TOKENS (inputs of the main test), MOEKDA_RESET_AFTER (outputs before the reset of the
first pass, 0: no reset pass), MOEKDA_RESULT (json file for the measured cycles).

Every test checks ``next`` (one beat per token: the argmax and its logit), ``logits`` (the V
logits of exactly the tokens sent with logits_en high, in order; nothing for the others), the
``mac_beat`` count (V beats_per_row beats per token) and the weight reads (the W region, once
per token).  Sinks flag a valid or payload that changes while waiting (streams.EdgeStreamSink).
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, FallingEdge, RisingEdge

from hw.chip.head import head_beats_per_token, head_weights, logit_layout, next_layout
from hw.image.param_map import region_value
from moekda.formats import formats_for
from sim.cocotb.bench import BlockBench
from sim.cocotb.streams import LayoutCodec
from sim.cocotb.weight_memory import WeightMemory
from sim.cocotb_util import tb_param


# ---- the case: model, inputs, expected outputs (also imported by sim/tests/block/test_head.py) ----

@dataclass
class HeadCase:
    cfg: object
    qm: object               # the quantised model (its head: the values under test)
    xs: np.ndarray           # (T, d) x_L inputs, resid_bits
    logits: np.ndarray       # (T, V) int_head_step
    next: np.ndarray         # (T,) int_argmax
    tie_token: int           # the input whose largest logit is at two rows, the lower above 0
    image: bytes

    @property
    def params(self) -> int:
        return region_value(self.cfg, self.qm.to_flat(), "head", mixer="head")


def _expect(cfg, qm, xs):
    from model.int_model import int_argmax, int_head_step
    logits = np.array([int_head_step(qm.head, cfg, x) for x in xs], dtype=np.int64)
    return logits, np.array([int_argmax(r) for r in logits], dtype=np.int64)


def head_inputs(cfg, qm, n: int, seed: int) -> np.ndarray:
    """Corners (zero: every logit equal; both rails; alternating rails; one element at a rail;
    a single 1), x_L of the integer stack on embedded random tokens (what the head really
    sees), then uniform resid_bits vectors and small ones (where eps matters)."""
    from model.int_model import int_embed, int_run_stack
    d, V = cfg.model.d_model, cfg.model.vocab
    rb = formats_for(cfg).resid_bits
    lo, hi = -(1 << (rb - 1)), (1 << (rb - 1)) - 1
    rng = np.random.default_rng(seed)
    onehot = np.zeros(d, dtype=np.int64)
    onehot[0] = hi
    single = np.zeros(d, dtype=np.int64)
    single[-1] = 1
    corners = [np.zeros(d, dtype=np.int64), np.full(d, hi), np.full(d, lo), np.where(np.arange(d) % 2, hi, lo),
               onehot, single]
    n_rest = max(0, n - len(corners))
    n_stack = max(2, n_rest // 2)
    toks = rng.integers(0, V, n_stack)
    stack = int_run_stack(qm, cfg, np.array([int_embed(qm.head, cfg, t) for t in toks]))
    n_rand = max(0, n_rest - n_stack)
    rand = [rng.integers(lo, hi + 1, d) if k % 2 == 0 else rng.integers(-40, 41, d) for k in range(n_rand)]
    xs = np.array(list(stack) + corners + rand, dtype=np.int64)   # stack first: the tie is among them
    return xs[:max(n, 1)]


def head_case(config: str, seed: int, n: int, hot: bool = False) -> HeadCase:
    """The bench's model and inputs.  ``hot``: the same model with head_m at its largest and
    norm_w tripled, so fn and the logits saturate (ties at the rail: the lowest index wins)."""
    from model.image import qmodel_image
    from model.cases import model_config, quick_model
    cfg = model_config(config)
    _, qm = quick_model(cfg, seed)
    qh = qm.head
    xs = head_inputs(cfg, qm, n, seed)
    logits, nxt = _expect(cfg, qm, xs)
    # a tie: the first input whose argmax r is at least 2 gets row r copied to row r // 2
    W = qh.emb if qh.lm_head is None else qh.lm_head
    tie = next((t for t in range(len(xs)) if nxt[t] >= 2), None)
    if tie is None:
        raise AssertionError("no input with its argmax at row 2 or above to make a tie with")
    r = int(nxt[tie])
    W[r // 2] = W[r]
    if hot:
        rb = formats_for(cfg).resid_bits
        qh.head_m = (1 << formats_for(cfg).mult_bits) - 1
        qh.head_s = 8
        qh.norm_w = np.clip(3 * qh.norm_w, -(1 << (rb - 1)), (1 << (rb - 1)) - 1)
    logits, nxt = _expect(cfg, qm, xs)
    return HeadCase(cfg, qm, xs, logits, nxt, tie, qmodel_image(cfg, qm))


# ---- the bench ------------------------------------------------------------------------------

class _WithEnable(LayoutCodec):
    """x_L's codec that also drives ``logits_en`` with the beat on offer (the head samples it
    when the beat transfers); items are (x, en)."""

    def __init__(self, layout, dut):
        super().__init__(layout)
        self.dut = dut

    def pack(self, value) -> int:
        x, en = value
        self.dut.logits_en.value = int(en)
        return super().pack([int(v) for v in x])


class Bench(BlockBench):
    def __init__(self, dut, case: HeadCase, seed: int, stall: float):
        super().__init__(dut, seed)
        self.case, self.stall = case, stall
        cfg = case.cfg
        self.cfg, self.V = cfg, cfg.model.vocab
        self.pb = cfg.hw.weight_port_bytes
        self.bound = head_beats_per_token(cfg)
        self.macs = 0
        self.logits_valid_seen = 0
        self.norm_start = self.norm_cycles = None
        self.x_codec = _WithEnable(self._x_layout(), dut)
        self.driver = None
        self.mem = None
        self.next_sink = self.logit_sink = None

    def _x_layout(self):
        from amaranth.hdl import signed
        from amaranth.lib import data
        return data.ArrayLayout(signed(formats_for(self.cfg).resid_bits), self.cfg.model.d_model)

    def setup(self):
        dut = self.dut
        dut.params.value = self.case.params
        dut.logits_en.value = 0
        dut.x__valid.value = 0
        cocotb.start_soon(self._count())

    async def _count(self):
        """Every cycle (at the falling edge, with the cycle count): the MACs, the RMSNorm's
        cycles, the logits offered, a random logits_en while no beat is offered."""
        dut = self.dut
        while True:
            await FallingEdge(dut.clk)
            self.macs += int(dut.mac_beat.value)
            # the RMSNorm's own cycles (start to idle), the part of a token the port does not set
            if int(dut.norm.start.value):
                self.norm_start = self.cycle
            elif self.norm_start is not None and not int(dut.norm.busy.value):
                self.norm_cycles, self.norm_start = self.cycle - self.norm_start, None
            self.logits_valid_seen += int(dut.logits__valid.value)
            if not int(dut.x__valid.value):
                dut.logits_en.value = self.rng.getrandbits(1)   # ignored unless a beat transfers

    def streams(self, mem_stall: float, backpressure: float, take_logits: bool = True, seed: int = 0):
        dut = self.dut
        self.mem = WeightMemory(dut, self.case.image, self.pb, self.cfg.hw.weight_port_latency,
                                req_stall=mem_stall, resp_stall=mem_stall, seed=seed).start()
        if self.driver is None:
            self.driver = self.stream_driver("x", self.x_codec, self.stall)
            self.start_streams(self.driver)
        self.next_sink = self.stream_sink("next", LayoutCodec(next_layout(self.cfg)), backpressure)
        if take_logits:
            self.logit_sink = self.stream_sink("logits", LayoutCodec(logit_layout(self.cfg)), backpressure)
        else:
            self.logit_sink = None
            dut.logits__ready.value = 0

    def stop(self):
        self.mem.stop()
        self.driver.flush()
        for sink in (self.next_sink, self.logit_sink):
            if sink is not None and sink._task is not None:
                sink._task.cancel()

    async def wait_next(self, n: int, what: str):
        return await self.wait_for(self.next_sink.items, n, self.bound, f"head {what}")

    def check(self, sent: list, what: str, logits_off: bool = False, done: int | None = None):
        """``sent``: (index into the case, logits_en) of every input, in order.  ``done``: only
        that many tokens are complete (a reset cut the run): their logits and any of the next
        token's that came out are checked."""
        case = self.case
        got = [(it["token"], it["logit"]) for it in self.next_sink.items]
        want = [(int(case.next[k]), int(case.logits[k][case.next[k]])) for k, _ in sent[:done]]
        for t, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"{what}: token {t} (input {sent[t][0]}): next {g}, model {w}"
        assert len(got) == len(want), f"{what}: {len(got)} next beats for {len(want)} tokens"
        if self.logit_sink is not None:
            got_l = [(it["index"], it["value"]) for it in self.logit_sink.items]
            want_l = [(i, int(case.logits[k][i])) for k, en in sent if en for i in range(self.V)]
            for n, (g, w) in enumerate(zip(got_l, want_l)):
                assert g == w, f"{what}: logit beat {n}: (index, value) {g}, model {w}"
            if done is None:
                assert len(got_l) == len(want_l), f"{what}: {len(got_l)} logit beats, model {len(want_l)}"
            else:
                complete = self.V * sum(en for _, en in sent[:done])
                assert complete <= len(got_l) <= complete + self.V, f"{what}: {len(got_l)} logit beats"
            assert not self.logit_sink.problems, self.logit_sink.problems[0]
        assert not self.next_sink.problems, self.next_sink.problems[0]
        if logits_off:
            assert self.logits_valid_seen == 0, "logits.valid rose while every token had logits_en low"

    def check_memory(self, tokens: int, what: str):
        reg = head_weights(self.cfg)
        log = self.mem.counters.log
        spans = [(a, b) for a, b in log]
        assert sum(b for _, b in spans) == tokens * reg.beats, f"{what}: {spans[:4]}... for {tokens} tokens"
        assert all(reg.addr <= a and a + b * self.pb <= reg.end for a, b in spans), f"{what}: read outside W"
        assert self.mem.counters.bytes == tokens * reg.nbytes


def _items(case: HeadCase, rng: random.Random, en_pattern):
    return [(k, en_pattern(k, rng)) for k in range(len(case.xs))]


def _send(bench: Bench, sent):
    bench.driver.send([(bench.case.xs[k], en) for k, en in sent])


@cocotb.test()
async def head_bit_exact_with_stalls(dut):
    """Every input, logits_en random per token, stalls on every port; a first pass is cut by a
    reset while a token is inside, then everything runs again from the start."""
    seed = tb_param("seed", 1, int)
    case = head_case(tb_param("config"), seed, tb_param("tokens", 14, int))
    tb = Bench(dut, case, seed, stall=0.3)
    await tb.start()
    # on for the first token, off for the second, then at random
    sent = _items(case, tb.rng, lambda k, rng: k == 0 if k < 2 else rng.random() < 0.5)
    reset_after = tb_param("reset_after", 2, int)
    if reset_after:
        tb.streams(0.25, 0.3, seed=seed + 1)
        _send(tb, sent)
        await tb.wait_next(reset_after, "first pass")
        # a token inside: its weights are streaming (the memory has served part of them)
        beats0, inside = tb.mem.counters.beats, tb.rng.randrange(1, head_beats_per_token(tb.cfg))
        while tb.mem.counters.beats - beats0 < inside:
            await RisingEdge(dut.clk)
        done = len(tb.next_sink.items)
        tb.check(sent, "before the reset", done=done)
        tb.stop()
        await tb.reset(tb.rng.randrange(1, 4))
        assert len(tb.next_sink.items) == done
    tb.streams(0.25, 0.3, seed=seed + 2)
    macs0, c0 = tb.macs, tb.cycle
    _send(tb, sent)
    await tb.wait_next(len(sent), "main pass")
    await ClockCycles(dut.clk, 3 * head_beats_per_token(tb.cfg) // 2)   # anything more would be extra
    tb.check(sent, "main pass")
    tb.check_memory(len(sent), "main pass")
    assert tb.macs - macs0 == len(sent) * head_beats_per_token(tb.cfg), f"mac_beat {tb.macs - macs0}"
    assert int(case.next[case.tie_token]) > 0
    dut._log.info(f"{len(sent)} tokens with stalls: {(tb.cycle - c0) / len(sent):.0f} cycles per token")


@cocotb.test()
async def head_saturated_logits(dut):
    """fn and the logits at the rails (head_m at its largest, norm_w tripled): many rows tie at
    +max, the lowest wins; every token's logits on, with back-pressure."""
    seed = tb_param("seed", 1, int)
    case = head_case(tb_param("config"), seed, 6, hot=True)
    rb = formats_for(case.cfg).resid_bits
    top = (1 << (rb - 1)) - 1
    assert any(np.sum(r == top) > 1 and r[0] != top for r in case.logits), "no tie at the rail past row 0"
    assert (case.logits == -top - 1).any()
    tb = Bench(dut, case, seed + 10, stall=0.2)
    await tb.start()
    sent = _items(case, tb.rng, lambda k, rng: True)
    tb.streams(0.2, 0.5, seed=seed + 3)
    _send(tb, sent)
    await tb.wait_next(len(sent), "saturated")
    await ClockCycles(dut.clk, 50)
    tb.check(sent, "saturated")


@cocotb.test()
async def head_no_stalls_logits_off(dut):
    """Tokens back to back, no stalls, logits_en low and logits.ready held low: the head never
    waits for the logits stream (which stays quiet); the cycles per token are measured."""
    seed = tb_param("seed", 1, int)
    case = head_case(tb_param("config"), seed, 5)
    tb = Bench(dut, case, seed + 20, stall=0.0)
    await tb.start()
    sent = _items(case, tb.rng, lambda k, rng: False)
    tb.streams(0.0, 0.0, take_logits=False, seed=seed + 4)
    first_in = [None]

    async def stamp_inputs():
        while not tb.driver.sent:
            await RisingEdge(dut.clk)
        first_in[0] = tb.cycle
    cocotb.start_soon(stamp_inputs())
    _send(tb, sent)
    out_cycles = []
    for n in range(1, len(sent) + 1):
        await tb.wait_next(n, "no stalls")
        out_cycles.append(tb.cycle)
    await ClockCycles(dut.clk, 50)
    tb.check(sent, "no stalls", logits_off=True)
    tb.check_memory(len(sent), "no stalls")
    period = (out_cycles[-1] - out_cycles[1]) / (len(out_cycles) - 2)
    latency = out_cycles[0] - first_in[0]
    beats = head_beats_per_token(tb.cfg)
    # per token: the port's V * beats_per_row beats and the final RMSNorm (which needs all of
    # x_L before its first output); what the head adds to these two, the norm-weight stages,
    # the request and the memory latency, is a few cycles (hw/chip/head.py)
    overhead = period - beats - tb.norm_cycles
    assert 0 <= overhead <= tb.cfg.hw.weight_port_latency + 12, \
        f"{period} cycles per token: {beats} weight beats, {tb.norm_cycles} RMSNorm and {overhead} more"
    dut._log.info(f"no stalls: {period} cycles per token ({beats} weight beats + {tb.norm_cycles} RMSNorm "
                  f"+ {overhead}), latency {latency} cycles (input taken to next offered)")
    path = os.environ.get("MOEKDA_RESULT")
    if path:
        with open(path, "w") as fh:
            json.dump({"cycles_per_token": period, "weight_beats": beats, "norm_cycles": tb.norm_cycles,
                       "latency": latency}, fh)
