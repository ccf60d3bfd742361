"""Routing weights of the chosen experts, exactly as ``model.int_moe.int_route``:

    w_i  = s[idx_i]                       (the un-biased score, U0.score_frac)
    tot  = sum_i w_i
    wn_i = floor((w_i << wn_frac) / max(tot, 1))     restoring divider
    wt_i = round_shift(wn_i * rs, rs_frac)           routed_scaling, the input ``rs``

The selection arrives from hw/moe/topk.py as one beat of k entries (index, key,
tag = score).  The indices are available at once (``idx_valid``) so the
weight fetch of the chosen experts can start; the weights follow after
``k`` cycles of summing and ``k`` divisions of ``div_num`` cycles each
(``wt_valid``), while the shared expert streams through the engine.  The
sum runs one entry per cycle and also bumps the per-expert hit counters, so
no k-wide adder tree or k x E comparator array is needed.

``release`` (one cycle) empties the unit for the next token.  ``rs`` (the
parameter bank's ``moe.rs``, ``rs_bits`` wide) is static while tokens flow.

Timing: the scaling product wn * rs is a Booth tree over stages the clock
decides (hw/arith/pipeline.py), a quotient at a time (divisions are sequential,
so the products never overlap); the hit counters are chunked counters (hw/arith/counter.py).
"""
from __future__ import annotations

from amaranth.hdl import Array, Const, Module, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import booth_multiply
from hw.arith.carry_save import prefix_add
from hw.arith.counter import event_counter
from hw.moe.divider import SequentialDivider
from hw.arith.pipeline import Pipe, plan_pipeline
from hw.moe.topk import index_bits, selection_layout


class RouteWeights(wiring.Component):
    def __init__(self, n_experts: int, k: int, key_bits: int, score_bits: int, *, wn_frac: int,
                 rs_bits: int, rs_frac: int, div_num_bits: int, div_den_bits: int, weight_bits: int,
                 counter_bits: int = 32, clock_period_ns: float):
        self.plan = plan_pipeline(clock_period_ns)
        self.clock_period_ns = clock_period_ns
        self.counter_bits = counter_bits
        self.E, self.k = n_experts, k
        self.score_bits, self.wn_frac, self.rs_bits, self.rs_frac = score_bits, wn_frac, rs_bits, rs_frac
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
            "rs": In(unsigned(rs_bits)),
            "hits": Out(unsigned(counter_bits)).array(n_experts),
        })

    def elaborate(self, platform):
        m = Module()
        k = self.k
        m.submodules.div = div = SequentialDivider(self.div_num_bits, self.div_den_bits, self.clock_period_ns)

        score = Array(Signal(self.score_bits, name=f"score{i}") for i in range(k))
        idx = Array(Signal.like(self.idx[i], name=f"idx{i}") for i in range(k))
        wt = Array(Signal.like(self.wt[i], name=f"wt{i}") for i in range(k))
        tot = Signal(self.div_den_bits)
        den = Signal(self.div_den_bits)
        step = Signal(range(k + 1))
        sent = Signal(range(k + 1))   # divisions issued
        got = Signal(range(k + 1))    # quotients received

        for i in range(k):
            m.d.comb += [self.idx[i].eq(idx[i]), self.wt[i].eq(wt[i])]
        # hit counters: one registered increment per chosen entry
        hit_e = Signal(range(self.E))
        hit_go = Signal()
        m.d.sync += hit_go.eq(0)
        for e in range(self.E):
            m.d.comb += self.hits[e].eq(event_counter(m, hit_go & (hit_e == e), f"hit{e}", self.counter_bits))

        # wt = round_shift(wn * rs, rs_frac): rs an input, the rounding one more word
        scale = Pipe(m, self.plan, "scale")
        quotient = Signal(self.div_num_bits)
        q_valid = Signal()
        q_slot = Signal(range(k))
        m.d.sync += [q_valid.eq(0)]
        prod_bits = self.div_num_bits + self.rs_bits + 1
        # rs is static: registered once (a cycle behind the bank), so its Booth digits
        # decode from a register, not from the bank through the select
        rs = Signal(self.rs_bits, name="rs_q", reset_less=True)
        m.d.sync += rs.eq(self.rs)
        live = booth_multiply(scale, {"valid": q_valid, "slot": q_slot}, quotient, rs,
                              prod_bits, "p", extra_words=[Const((1 << self.rs_frac) >> 1, prod_bits)])
        live = scale.register(live)
        with m.If(live["valid"]):
            m.d.sync += wt[live["slot"]].eq(live["p"][self.rs_frac:])
            with m.If(live["slot"] == k - 1):
                m.d.sync += self.wt_valid.eq(1)

        m.d.comb += self.sel.ready.eq(0)
        # operands driven in every state (only valid depends on the state): the
        # divider's input negation then starts at the den register, not at the FSM
        m.d.comb += [div.inp.payload.num.eq(score[sent] << self.wn_frac), div.inp.payload.den.eq(den)]
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
                m.d.sync += [tot.eq(prefix_add(m, tot, score[step], name="tot", width=len(tot))), hit_e.eq(idx[step]),
                             hit_go.eq(1), step.eq(step + 1)]
                with m.If(step == k - 1):
                    m.d.sync += [sent.eq(0), got.eq(0)]
                    m.next = "DENOMINATOR"
            with m.State("DENOMINATOR"):
                # max(tot, 1) into a register: the divider negates it on the way in
                m.d.sync += den.eq(tot | (tot == 0))
                m.next = "DIVIDE"
            with m.State("DIVIDE"):
                m.d.comb += [div.inp.valid.eq(sent < k), div.out.ready.eq(1)]
                with m.If(div.inp.valid & div.inp.ready):
                    m.d.sync += sent.eq(sent + 1)
                with m.If(div.out.valid):
                    # into the scaling product above; wt_valid rises when the last lands
                    m.d.sync += [quotient.eq(div.out.payload.quotient), q_slot.eq(got), q_valid.eq(1),
                                 got.eq(got + 1)]
                    with m.If(got == k - 1):
                        m.next = "DONE"
            with m.State("DONE"):
                with m.If(self.release):
                    m.d.sync += [self.idx_valid.eq(0), self.wt_valid.eq(0)]
                    m.next = "IDLE"
        return m
