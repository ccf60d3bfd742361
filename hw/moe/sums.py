"""The MoE unit's products and running sums (stages O and U of its result pipeline).

Stage O: the product, SiLU * up for an up row (its SiLU value from ``sbuf``), or for a
down row weight * expert output + the row's running sum (one more word of the same
carry-save tree; the first contributing segment starts from zero); routed experts weigh
by their routing weight, shared ones (and a dense layer's chunks, and lat_up's rows) by
1.0 = 1 << wn_frac.  Every product is hw/arith/booth_multiply.py over stages that
hw/arith/pipeline.py places from the clock period.  Stage U: a down row's sum goes back
into the d_model accumulators (a registered value into a decoded write; the same row is
read again at least d_model results later); a LatentMoE token's routed experts sum into
``racc`` (l accumulators of their own, since the shared experts' sums sit in ``acc``).
Results leave on ``u_*`` (the up products to hw/moe/hidden.py, the sums to the combine).
"""
from __future__ import annotations

from amaranth.hdl import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import booth_multiply
from hw.arith.carry_save import sign_extend
from hw.arith.pipeline import Pipe
from hw.moe.phases import DOWN, LUP, PROD_BITS, UP, register


class ExpertSums(wiring.Component):
    """``q_*``: the rows for the products, in order; ``sbuf``: the gate rows' SiLU values;
    ``wt``: the chosen experts' routing weights (rank order).  ``u_*``: the product or sum
    of each row (``u_racc``: a LatentMoE routed sum, in racc)."""

    def __init__(self, unit, q_row_shape, q_seg_shape, q_y_shape, wt_bits: int):
        self.u = u = unit
        self.prod_bits = u.acc_bits + 1
        ports = {"q_valid": In(1), "q_kind": In(u.mat_bits), "q_row": In(q_row_shape), "q_seg": In(q_seg_shape),
                 "q_y": In(q_y_shape), "sbuf": In(data.ArrayLayout(u.silu_shape, u.f)),
                 "wt": In(unsigned(wt_bits)).array(u.k), **u.kind.port(),
                 "u_valid": Out(1), "u_kind": Out(u.mat_bits), "u_row": Out(q_row_shape), "u_seg": Out(q_seg_shape),
                 "u_racc": Out(1), "u_val": Out(signed(self.prod_bits))}
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        u, fm, plan = self.u, self.u.fm, self.u.plan
        S, k, d, f, lat, acc_bits = u.S, u.k, u.d, u.f, u.lat, u.acc_bits
        dense = u.kind.bit(self)
        q_kind, q_row, q_seg = self.q_kind, self.q_row, self.q_seg
        acc = Array(Signal(signed(acc_bits), name=f"acc{i}") for i in range(d))
        rank = (q_seg - 1 - S)[:max(1, (k - 1).bit_length())]
        # down: routed experts weigh by wt, shared ones by 1.0 (a dense layer's chunks all 1.0)
        weight = u.kind.pick(dense, 1 << fm.wn_frac, Mux(q_seg <= S, 1 << fm.wn_frac, Array(self.wt)[rank]))
        # lat_up's rows join the combine as a shared expert's down rows do (weight 1.0: segment 0)
        summed = (q_kind == DOWN) | (q_kind == LUP) if lat else q_kind == DOWN
        o_valid = register(m, "o_valid", 1, self.q_valid & ((q_kind == UP) | summed), reset_less=False)
        o_kind = register(m, "o_kind", u.mat_bits, q_kind)
        o_row = register(m, "o_row", q_row.shape(), q_row)
        o_seg = register(m, "o_seg", q_seg.shape(), q_seg)
        sbuf = Array(self.sbuf[j] for j in range(f))
        o_a = register(m, "o_a", signed(max(PROD_BITS + 1, u.widths["route_weight"] + 1)),
                       Mux(q_kind == UP, sbuf[q_row[:max(1, (f - 1).bit_length())]], weight))
        o_b = register(m, "o_b", self.q_y.shape(), self.q_y)
        # the running sum this row adds to, chosen here (a register into stage O's read mux):
        # the first contributing segment starts from zero; a LatentMoE token's routed experts
        # sum in racc (the first routed segment from zero), lat_up's rows in acc
        if lat:
            racc = Array(Signal(signed(acc_bits), name=f"racc{i}") for i in range(lat))
            routed_sum = (q_kind == DOWN) & u.kind.lat_tok(dense) & (q_seg > S)
            o_racc = register(m, "o_racc", 1, routed_sum)
            o_from_racc = register(m, "o_from_racc", 1, routed_sum & (q_seg != S + 1))
            o_from_acc = register(m, "o_from_acc", 1, ((q_kind == DOWN) & ~routed_sum & (q_seg != 1)) |
                                  ((q_kind == LUP) & (S > 0)))
        else:
            o_from_acc = register(m, "o_from_acc", 1, (q_kind == DOWN) & (q_seg != 1))

        # stage O: registers where the clock needs them (hw/arith/pipeline.py)
        mul = Pipe(m, plan, "mul")
        live = {"valid": o_valid, "kind": o_kind, "row": o_row, "seg": o_seg, "a": o_a, "b": o_b,
                "from_acc": o_from_acc}
        if lat:
            live.update(racc=o_racc, from_racc=o_from_racc)
        live = mul.spend(plan.delays.mux_level * max(1, (d - 1).bit_length()), live)
        prev = Signal(signed(acc_bits), name="mul_prev")
        m.d.comb += prev.eq(Mux(live.pop("from_acc"), acc[live["row"][:max(1, (d - 1).bit_length())]], 0))
        if lat:
            with m.If(live.pop("from_racc")):
                m.d.comb += prev.eq(racc[live["row"][:max(1, (lat - 1).bit_length())]])
        live = booth_multiply(mul, live, live.pop("a"), live.pop("b"), self.prod_bits, "p",
                              extra_words=[sign_extend(prev, self.prod_bits)])
        live = mul.register(live)
        u_valid, u_kind, u_row = live["valid"], live["kind"], live["row"]
        u_racc = live["racc"] if lat else Const(0, 1)
        u_val = live["p"].as_signed()
        m.d.comb += [self.u_valid.eq(u_valid), self.u_kind.eq(u_kind), self.u_row.eq(u_row),
                     self.u_seg.eq(live["seg"]), self.u_racc.eq(u_racc), self.u_val.eq(u_val)]

        # stage U, down: the running sum back into the accumulators
        u_summed = (u_kind == DOWN) | (u_kind == LUP) if lat else u_kind == DOWN
        with m.If(u_valid & u_summed & ~u_racc):
            for i in range(d):
                with m.If(u_row == i):
                    m.d.sync += acc[i].eq(u_val[:acc_bits])
        if lat:
            with m.If(u_valid & u_racc):
                for i in range(lat):
                    with m.If(u_row == i):
                        m.d.sync += racc[i].eq(u_val[:acc_bits])
        return m
