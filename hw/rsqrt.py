"""Reciprocal square root: even-shift normalisation, seed table, Newton steps.

Implements ``moekda.numerics.rsqrt_fixed`` bit for bit: for an unsigned
integer ``a >= 1`` it returns ``(y, E)`` with ``1/sqrt(a) ~= y * 2**-E``:

1. ``bl`` = bit length of ``a`` (a leading-one detector); ``e`` and the
   normalising shift are constants per ``bl`` (a small case table), which
   brings ``a`` into ``a_norm`` in [2**(N-2), 2**N) by an even shift;
2. seed ``y`` from the top ``seed_bits`` bits of ``a_norm`` (a tiny ROM);
3. each Newton step ``y <- y (3 - u y^2) / 2`` is three products
   ``y*y``, ``a_norm*y2``, ``y*(3<<frac - uy2)``, each round-half-up shifted.

One multiplier (its product registered) does all products in turn: the unit is used a few times per
token (L2 norms of q and k, the output RMSNorm of each head), so latency is
cheap and area is not.  Latency: 1 (normalise) + 6 * newton_steps cycles.

Streams: ``i`` payload ``a`` (unsigned ``in_bits``); ``o`` payload
``{y, E}``.  One operation at a time (``i.ready`` is low while busy).
``a == 0`` (not allowed by the model) is treated as ``a == 1``.
"""
from __future__ import annotations

from amaranth import Array, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from moekda.formats import Formats


def rsqrt_out_layout(fm: Formats) -> data.StructLayout:
    return data.StructLayout({"y": unsigned(fm.rsqrt_frac + 2), "E": signed(8)})


class Rsqrt(wiring.Component):
    def __init__(self, fm: Formats, in_bits: int):
        self.fm = fm
        self.in_bits = in_bits
        N, frac = fm.rsqrt_norm_bits, fm.rsqrt_frac
        if N % 2:
            raise ValueError(f"rsqrt_norm_bits = {N}: must be even")
        # per bit length: (left shift, right shift, E); a_norm = a << l >> r
        self.norm_table = {}
        for bl in range(1, in_bits + 1):
            e = -((N - bl) // 2)
            self.norm_table[bl] = (max(-e, 0) * 2, max(e, 0) * 2, frac + N // 2 + e)
        if any(not -128 <= E < 128 for _, _, E in self.norm_table.values()):
            raise ValueError("rsqrt: exponent does not fit 8 signed bits")
        super().__init__({
            "i": In(stream.Signature(unsigned(in_bits))),
            "o": Out(stream.Signature(rsqrt_out_layout(fm))),
        })

    def elaborate(self, platform):
        m = Module()
        fm = self.fm
        N, frac, sb = fm.rsqrt_norm_bits, fm.rsqrt_frac, fm.rsqrt_seed_bits
        W = frac + 4                   # signed operand width: y <= 2**(frac+1), y2 and uy2 < 2**(frac+3)

        a = Signal(self.in_bits)
        a_norm = Signal(N)
        y = Signal(signed(W))
        y2 = Signal(signed(W + 2))
        uy2 = Signal(signed(W + 2))
        E = Signal(signed(8))
        step = Signal(range(max(2, fm.rsqrt_newton_steps + 1)))

        # leading-one detector: bit length of a (a == 0 counts as 1)
        bl = Signal(range(self.in_bits + 1))
        m.d.comb += bl.eq(1)
        for b in range(1, self.in_bits):
            with m.If(a[b]):
                m.d.comb += bl.eq(b + 1)

        norm = Signal(N)
        exp = Signal(signed(8))
        with m.Switch(bl):
            for k, (left, right, e_out) in self.norm_table.items():
                with m.Case(k):
                    m.d.comb += [norm.eq((a << left) >> right), exp.eq(e_out)]

        seed = Array(int(v) for v in fm.rsqrt_seed)
        seed_idx = (norm >> (N - sb)) - (1 << (sb - 2))

        # the one multiplier and its operands, chosen by the phase; its product is
        # registered, and the rounding shift happens in the next state
        op_a = Signal(signed(W + 2))
        op_b = Signal(signed(W + N // 2 + 2))
        prod = Signal(signed(2 * W + N + 4))
        m.d.sync += prod.eq(op_a * op_b)

        def rs(x, s):
            return (x + (1 << (s - 1))) >> s

        m.d.comb += [self.o.payload.y.eq(y), self.o.payload.E.eq(E)]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [a.eq(self.i.payload), step.eq(0)]
                    m.next = "NORM"
            with m.State("NORM"):
                m.d.sync += [a_norm.eq(norm), E.eq(exp), y.eq(seed[seed_idx])]
                m.next = "YY" if fm.rsqrt_newton_steps else "DONE"
            with m.State("YY"):
                m.d.comb += [op_a.eq(y), op_b.eq(y)]
                m.next = "YY_R"
            with m.State("YY_R"):
                m.d.sync += y2.eq(rs(prod, frac))
                m.next = "UY2"
            with m.State("UY2"):
                m.d.comb += [op_a.eq(y2), op_b.eq(a_norm)]
                m.next = "UY2_R"
            with m.State("UY2_R"):
                m.d.sync += uy2.eq(rs(prod, N))
                m.next = "STEP"
            with m.State("STEP"):
                m.d.comb += [op_a.eq((3 << frac) - uy2), op_b.eq(y)]
                m.next = "STEP_R"
            with m.State("STEP_R"):
                m.d.sync += [y.eq(rs(prod, frac + 1)), step.eq(step + 1)]
                with m.If(step == fm.rsqrt_newton_steps - 1):
                    m.next = "DONE"
                with m.Else():
                    m.next = "YY"
            with m.State("DONE"):
                m.d.comb += self.o.valid.eq(1)
                with m.If(self.o.ready):
                    m.next = "IDLE"
        return m
