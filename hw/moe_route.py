"""Routing weights of the chosen experts, exactly as ``sim.models.int_moe.int_route``:

    w_i  = s[idx_i]                       (the un-biased score, U0.score_frac)
    tot  = sum_i w_i
    wn_i = floor((w_i << wn_frac) / max(tot, 1))     restoring divider
    wt_i = round_shift(wn_i * rs, rs_frac)           routed_scaling, a constant

The selection arrives from hw/topk.py as one beat of k entries (index, key,
tag = score).  The indices are available at once (``idx_valid``) so the
weight fetch of the chosen experts can start; the weights follow after
``k`` cycles of summing and ``k`` divisions of ``div_num`` cycles each
(``wt_valid``), while the shared expert streams through the engine.  The
sum runs one entry per cycle and also bumps the per-expert hit counters, so
no k-wide adder tree or k x E comparator array is needed.

``release`` (one cycle) empties the unit for the next token.
"""
from __future__ import annotations

from amaranth.hdl import Array, Module, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.moe_arith import prefix_add
from hw.moe_divider import SequentialDivider
from hw.topk import index_bits, selection_layout


class RouteWeights(wiring.Component):
    def __init__(self, n_experts: int, k: int, key_bits: int, score_bits: int, *, wn_frac: int,
                 rs: int, rs_frac: int, div_num_bits: int, div_den_bits: int, weight_bits: int,
                 counter_bits: int = 32):
        self.E, self.k = n_experts, k
        self.score_bits, self.wn_frac, self.rs, self.rs_frac = score_bits, wn_frac, rs, rs_frac
        self.div_num_bits, self.div_den_bits, self.weight_bits = div_num_bits, div_den_bits, weight_bits
        if score_bits + wn_frac > div_num_bits:
            raise ValueError("route weights: score << wn_frac does not fit the divider numerator")
        super().__init__({
            "sel": In(stream.Signature(selection_layout(n_experts, k, key_bits, score_bits))),
            "idx": Out(unsigned(index_bits(n_experts))).array(k),
            "idx_valid": Out(1),
            "wt": Out(unsigned(weight_bits)).array(k),
            "wt_valid": Out(1),
            "release": In(1),
            "hits": Out(unsigned(counter_bits)).array(n_experts),
        })

    def elaborate(self, platform):
        m = Module()
        k = self.k
        m.submodules.div = div = SequentialDivider(self.div_num_bits, self.div_den_bits)

        score = Array(Signal(self.score_bits, name=f"score{i}") for i in range(k))
        idx = Array(Signal.like(self.idx[i], name=f"idx{i}") for i in range(k))
        wt = Array(Signal.like(self.wt[i], name=f"wt{i}") for i in range(k))
        hits = Array(Signal.like(self.hits[e], name=f"hits{e}") for e in range(self.E))
        tot = Signal(self.div_den_bits)
        step = Signal(range(k + 1))
        sent = Signal(range(k + 1))   # divisions issued
        got = Signal(range(k + 1))    # quotients received

        for i in range(k):
            m.d.comb += [self.idx[i].eq(idx[i]), self.wt[i].eq(wt[i])]
        for e in range(self.E):
            m.d.comb += self.hits[e].eq(hits[e])

        # hit counters: one registered increment per chosen entry, prefix adders
        hit_e = Signal(range(self.E))
        hit_go = Signal()
        m.d.sync += hit_go.eq(0)
        for e in range(self.E):
            with m.If(hit_go & (hit_e == e)):
                m.d.sync += hits[e].eq(prefix_add(m, hits[e], 1, len(hits[e]), f"hit{e}"))

        m.d.comb += self.sel.ready.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.sel.ready.eq(1)
                with m.If(self.sel.valid):
                    for i in range(k):
                        ent = self.sel.payload.entries[i]
                        m.d.sync += [idx[i].eq(ent.index), score[i].eq(ent.tag)]
                    m.d.sync += [tot.eq(0), step.eq(0), self.idx_valid.eq(1)]
                    m.next = "SUM"
            with m.State("SUM"):
                # one chosen entry per cycle: add its score, and (a cycle later,
                # through hit_e) count the expert
                m.d.sync += [tot.eq(prefix_add(m, tot, score[step], len(tot), "tot")), hit_e.eq(idx[step]), hit_go.eq(1),
                             step.eq(step + 1)]
                with m.If(step == k - 1):
                    m.d.sync += [sent.eq(0), got.eq(0)]
                    m.next = "DIVIDE"
            with m.State("DIVIDE"):
                den = Signal(self.div_den_bits)
                m.d.comb += [den.eq(tot | (tot == 0)),    # max(tot, 1)
                             div.inp.valid.eq(sent < k),
                             div.inp.payload.num.eq(score[sent] << self.wn_frac),
                             div.inp.payload.den.eq(den),
                             div.out.ready.eq(1)]
                with m.If(div.inp.valid & div.inp.ready):
                    m.d.sync += sent.eq(sent + 1)
                with m.If(div.out.valid):
                    # round_shift(wn * rs, rs_frac), round half up
                    scaled = div.out.payload.quotient * self.rs
                    if self.rs_frac:
                        scaled = (scaled + (1 << (self.rs_frac - 1))) >> self.rs_frac
                    m.d.sync += [wt[got].eq(scaled), got.eq(got + 1)]
                    with m.If(got == k - 1):
                        m.d.sync += self.wt_valid.eq(1)
                        m.next = "DONE"
            with m.State("DONE"):
                with m.If(self.release):
                    m.d.sync += [self.idx_valid.eq(0), self.wt_valid.eq(0)]
                    m.next = "IDLE"
        return m
