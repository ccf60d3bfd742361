"""Lane multiply-accumulate and requantiser of the MoE unit (interim engine).

The contract is the engine model of sim/models/matvec.py: a beat carries
``lanes`` int8 weights and activations and ``first``/``last`` framing; the
accumulator restarts on ``first`` and one result leaves after ``last``; the
result is ``requantize(acc, mult, shift, out_bits)`` of moekda.numerics.
It stays here until the shared engine (hw/matvec.py, H2) lands; the MoE unit
only needs: one beat per cycle in, a tag travelling with each row, and a
fixed latency out (no back-pressure: the MoE's result pipeline never stalls).

Pipeline (hw/moe_arith.py): input register | all lanes' partial products in one carry-save
tree, registered every ``levels`` 3:2 levels | one add | accumulate |
acc*mult + rounding constant in carry-save | one add | shift | saturate.
The latency follows from ``levels`` (from the clock period); nothing
downstream depends on it because the tag travels with the row.
"""
from __future__ import annotations

from amaranth.hdl import Const, Module, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.moe_arith import Staged, partial_products, prefix_add


def saturate(m, value, bits: int, out: Signal):
    """out = clamp(value, -2**(bits-1), 2**(bits-1)-1) (comb)."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    with m.If(value < lo):
        m.d.comb += out.eq(lo)
    with m.Elif(value > hi):
        m.d.comb += out.eq(hi)
    with m.Else():
        m.d.comb += out.eq(value)


class LaneMacRequant(wiring.Component):
    """Beats in (valid, w, x, first, last, mult, shift, out_sel, tag); per row out
    (y_valid, y, y_tag).  ``out_sel`` picks the row's signed output width from
    ``out_widths`` (e.g. a table code, an int8 activation, a 16-bit expert output)."""


    def __init__(self, lanes: int, acc_bits: int, mult_bits: int, max_shift: int, tag_layout,
                 out_widths=(8,), levels: int = 4):
        self.lanes, self.acc_bits, self.mult_bits, self.max_shift = lanes, acc_bits, mult_bits, max_shift
        self.levels = levels
        self.out_widths = tuple(out_widths)
        vec = data.ArrayLayout(signed(8), lanes)
        self.out_bits = max(self.out_widths)
        super().__init__({
            "valid": In(1), "w": In(vec), "x": In(vec), "first": In(1), "last": In(1),
            "mult": In(unsigned(mult_bits)), "shift": In(range(max_shift + 1)),
            "out_sel": In(range(max(2, len(self.out_widths)))),
            "tag": In(tag_layout),
            "y_valid": Out(1), "y": Out(signed(self.out_bits)), "y_tag": Out(tag_layout),
        })

    def elaborate(self, platform):
        m = Module()
        L = self.lanes
        levels = self.levels

        def stage(name, shape, value):
            reg = Signal(shape, name=name)
            m.d.sync += reg.eq(value)
            return reg

        # the dot product of one beat: every lane's partial products in one
        # carry-save tree (registered every ``levels`` levels), then one add
        dot_bits = 16 + max(1, (L - 1).bit_length()) + 1
        dot = Staged(m, "dot", {"valid": self.valid, "first": self.first, "last": self.last,
                                "mult": self.mult, "shift": self.shift, "out_sel": self.out_sel,
                                "tag": self.tag})
        # input register: the beat's operand selection (activation slice mux) gets its own stage
        w_r, x_r = dot.register([self.w.as_value(), self.x.as_value()])
        w_r = data.View(data.ArrayLayout(signed(8), L), w_r)
        x_r = data.View(data.ArrayLayout(signed(8), L), x_r)
        terms = [t for i in range(L) for t in partial_products(w_r[i], x_r[i], dot_bits)]
        s, c = dot.reduce(terms, dot_bits, levels)
        beat_sum = dot.add(s, c, signed(dot_bits))
        d = dot.ctl
        # accumulate, wrapping at acc_bits like the model's register
        acc = Signal(signed(self.acc_bits))
        with m.If(d["valid"] & d["first"]):
            m.d.sync += acc.eq(beat_sum)
        with m.Elif(d["valid"]):
            m.d.sync += acc.eq(prefix_add(m, acc, beat_sum, self.acc_bits, "acc_add"))
        a_done = stage("a_done", 1, d["valid"] & d["last"])
        a_mult = stage("a_mult", unsigned(self.mult_bits), d["mult"])
        a_shift = stage("a_shift", d["shift"].shape(), d["shift"])
        a_sel = stage("a_out_sel", d["out_sel"].shape(), d["out_sel"])
        a_tag = stage("a_tag", d["tag"].shape(), d["tag"])
        # requantise: acc * mult + 2**(shift-1) in carry-save, one add, shift, saturate
        rq_bits = self.acc_bits + self.mult_bits + 2
        rq = Staged(m, "rq", {"done": a_done, "shift": a_shift, "out_sel": a_sel, "tag": a_tag})
        half = (Const(1, self.max_shift + 1) << a_shift) >> 1
        s, c = rq.reduce(partial_products(acc, a_mult, rq_bits) + [half], rq_bits, levels)
        rounded = rq.add(s, c, signed(rq_bits))
        r = rq.ctl
        s_done = stage("s_done", 1, r["done"])
        s_sel = stage("s_out_sel", r["out_sel"].shape(), r["out_sel"])
        s_tag = stage("s_tag", r["tag"].shape(), r["tag"])
        s_val = stage("s_val", signed(rq_bits), rounded >> r["shift"])
        m.d.sync += [self.y_valid.eq(s_done), self.y_tag.eq(s_tag)]
        with m.Switch(s_sel):
            for i, bits in enumerate(self.out_widths):
                with m.Case(i):
                    y_i = Signal(signed(bits), name=f"y_sat{bits}")
                    saturate(m, s_val, bits, y_i)
                    m.d.sync += self.y.eq(y_i)
        return m
