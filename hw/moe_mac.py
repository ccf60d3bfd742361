"""Lane multiply-accumulate and requantiser of the MoE unit (interim engine).

The contract is the engine model of sim/models/matvec.py: a beat carries
``lanes`` int8 weights and activations and ``first``/``last`` framing; the
accumulator restarts on ``first`` and one result leaves after ``last``; the
result is ``requantize(acc, mult, shift, out_bits)`` of moekda.numerics.
It stays here until the shared engine (hw/matvec.py, H2) lands; the MoE unit
only needs: one beat per cycle in, a tag travelling with each row, and a
fixed latency out (no back-pressure: the MoE's result pipeline never stalls).

Pipeline: products | groups of 4 | group sum | accumulate | acc*mult as two
half products | sum + rounding constant | shift | saturate;
``RESULT_LATENCY`` cycles from the last beat of a row to ``y``.
"""
from __future__ import annotations

from amaranth.hdl import Const, Module, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out


def round_shift_value(value, shift, max_shift: int):
    """(value + 2**(shift-1)) >> shift, shift a runtime value; shift 0 = identity
    (moekda.numerics.round_shift)."""
    half = (Const(1, max_shift + 1) << shift) >> 1
    return (value + half) >> shift


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

    RESULT_LATENCY = 8

    def __init__(self, lanes: int, acc_bits: int, mult_bits: int, max_shift: int, tag_layout,
                 out_widths=(8,)):
        self.lanes, self.acc_bits, self.mult_bits, self.max_shift = lanes, acc_bits, mult_bits, max_shift
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
        tag_shape = self.tag.shape()

        def stage(name, shape, value):
            reg = Signal(shape, name=name)
            m.d.sync += reg.eq(value)
            return reg

        # the row framing, mult/shift and tag travel down the pipeline with each beat
        class Ctl:
            pass

        def carry(prefix, src):
            c = Ctl()
            c.valid = stage(f"{prefix}_valid", 1, src.valid)
            c.first = stage(f"{prefix}_first", 1, src.first)
            c.last = stage(f"{prefix}_last", 1, src.last)
            c.mult = stage(f"{prefix}_mult", unsigned(self.mult_bits), src.mult)
            c.shift = stage(f"{prefix}_shift", range(self.max_shift + 1), src.shift)
            c.out_sel = stage(f"{prefix}_out_sel", src.out_sel.shape(), src.out_sel)
            c.tag = stage(f"{prefix}_tag", tag_shape, src.tag)
            return c

        # 1: lane products
        p_ctl = carry("p", self)
        prods = [stage(f"p_prod{i}", signed(16), self.w[i] * self.x[i]) for i in range(L)]
        # 2-3: adder tree in two register stages (groups of four, then the groups)
        t_ctl = carry("t", p_ctl)
        groups = [prods[i:i + 4] for i in range(0, L, 4)]
        g_sums = [stage(f"t_group{j}", signed(18), sum(g)) for j, g in enumerate(groups)]
        u_ctl = carry("u", t_ctl)
        t_sum = stage("u_sum", signed(18 + max(1, (len(groups) - 1).bit_length())), sum(g_sums))
        # 4: accumulate, wrapping at acc_bits like the model's register
        acc = Signal(signed(self.acc_bits))
        with m.If(u_ctl.valid & u_ctl.first):
            m.d.sync += acc.eq(t_sum)
        with m.Elif(u_ctl.valid):
            m.d.sync += acc.eq(acc + t_sum)
        a_ctl = carry("a", u_ctl)
        a_done = Signal()
        m.d.comb += a_done.eq(a_ctl.valid & a_ctl.last)
        # 5: acc * mult as two half-width partial products (one multiplier is too slow)
        h = self.mult_bits // 2
        q_ctl = carry("q", a_ctl)
        q_done = stage("q_done", 1, a_done)
        q_lo = stage("q_lo", signed(self.acc_bits + h + 1), acc * a_ctl.mult[:h])
        q_hi = stage("q_hi", signed(self.acc_bits + self.mult_bits - h + 1), acc * a_ctl.mult[h:])
        # 6: sum with the rounding constant (round half up)
        r_ctl = carry("r", q_ctl)
        r_done = stage("r_done", 1, q_done)
        half = (Const(1, self.max_shift + 1) << q_ctl.shift) >> 1
        r_sum = stage("r_sum", signed(self.acc_bits + self.mult_bits + 2), q_lo + (q_hi << h) + half)
        # 7: shift
        s_ctl = carry("s", r_ctl)
        s_done = stage("s_done", 1, r_done)
        s_val = stage("s_val", signed(len(r_sum)), r_sum >> r_ctl.shift)
        # 8: saturate to the row's output range
        m.d.sync += [self.y_valid.eq(s_done), self.y_tag.eq(s_ctl.tag)]
        with m.Switch(s_ctl.out_sel):
            for i, bits in enumerate(self.out_widths):
                with m.Case(i):
                    y_i = Signal(signed(bits), name=f"y_sat{bits}")
                    saturate(m, s_val, bits, y_i)
                    m.d.sync += self.y.eq(y_i)
        return m

