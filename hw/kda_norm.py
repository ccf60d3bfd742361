"""Vector normalisation by a per-vector multiplier: L2 norm of q and k, RMSNorm of o.

Implements ``sim.models.int_ops.int_normalize`` for one row ``x`` of ``n``
elements, bit for bit:

    ss      = max(sum x_i^2 + eps_int, 1)
    (y, E)  = rsqrt(ss)                               hw/rsqrt.py
    m_r     = rs(y * m, rsqrt_frac + 1);  s_r = E + s - rsqrt_frac - 1
    out_i   = sat_out(rs(x_i * m_r, s_r))             one element per cycle

(eps_int, m, s) come from a ``QNorm``; several are baked in and ``mode``
picks one per run, so the q, k and o norms share this unit and its rsqrt.

The unit reads its input by index (``rd_idx`` -> ``rd_x``, combinational, from
the owner's register file) and writes by index (``wr_en``, ``wr_idx``,
``wr_y``), because the owner keeps the vectors in registers anyway.
Elements go through a three-stage pipeline (read, multiply, accumulate or
shift); cycles per row: 2 n + rsqrt latency + 10.
"""
from __future__ import annotations

from amaranth import Array, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.kda_delta import round_shift, saturate
from hw.rsqrt import Rsqrt
from moekda.formats import Formats


class Normalizer(wiring.Component):
    def __init__(self, fm: Formats, n: int, in_bits: int, ss_bits: int, norms, out_bits):
        """``norms``: one QNorm per mode; ``out_bits``: one output width per mode (or one for all)."""
        if isinstance(out_bits, int):
            out_bits = [out_bits] * len(norms)
        if len(out_bits) != len(norms):
            raise ValueError("normalizer: one out_bits per norm")
        self.fm, self.n, self.in_bits, self.ss_bits = fm, n, in_bits, ss_bits
        self.mode_bits = list(out_bits)
        self.out_bits = out_bits = max(out_bits)
        self.norms = [(int(q.eps_int), int(q.m), int(q.s)) for q in norms]
        if any(eps < 0 for eps, _, _ in self.norms):
            raise ValueError("normalizer: eps_int must be >= 0")
        self.rs_bits = ss_bits + 1 + max(eps for eps, _, _ in self.norms).bit_length()
        super().__init__({
            "start": In(1),
            "mode": In(range(max(2, len(self.norms)))),
            "busy": Out(1),
            "rd_idx": Out(range(n)),
            "rd_x": In(signed(in_bits)),
            "wr_en": Out(1),
            "wr_idx": Out(range(n)),
            "wr_y": Out(signed(out_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        fm = self.fm
        frac = fm.rsqrt_frac
        m.submodules.rsqrt = rsq = Rsqrt(fm, self.rs_bits)

        mode = Signal.like(self.mode)
        idx = Signal(range(self.n))
        ss = Signal(self.ss_bits)
        m_r = Signal(fm.mult_bits + 1)
        # s_r = E + s - frac - 1 is at most this (E is largest for the widest ss)
        e_max = max(E for _, _, E in rsq.norm_table.values())
        s_max = e_max + max(sft for _, _, sft in self.norms) - frac - 1
        s_r = Signal(range(max(2, s_max + 1)))
        eps = Array(e for e, _, _ in self.norms)[mode]
        mul = Array(mm for _, mm, _ in self.norms)[mode]
        sft = Array(s for _, _, s in self.norms)[mode]

        # a three-stage element pipeline shared by both passes:
        #   [1] x = the owner's register read     [2] x*x or x*m_r     [3] accumulate / shift + saturate
        issue = Signal()
        scaling = Signal()                      # pass 2 (scale) rather than pass 1 (squares)
        m.d.comb += self.rd_idx.eq(idx)
        v1, i1, x1 = Signal(), Signal(range(self.n)), Signal(signed(self.in_bits))
        v2, i2 = Signal(), Signal(range(self.n))
        p2 = Signal(signed(2 * self.in_bits + fm.mult_bits + 2))
        m.d.sync += [v1.eq(issue), i1.eq(idx), x1.eq(self.rd_x),
                     v2.eq(v1), i2.eq(i1), p2.eq(x1 * Mux(scaling, m_r, x1))]
        half = Signal(max(1, s_max))  # 2**(s_r-1), the rounding constant
        m.d.comb += half.eq(Mux(s_r == 0, 0, 1 << (s_r - 1)[:len(s_r)]))
        y3 = Signal(signed(self.out_bits))
        w3, i3 = Signal(), Signal(range(self.n))
        m.d.sync += [w3.eq(v2 & scaling), i3.eq(i2)]
        with m.Switch(mode):
            for k, bits in enumerate(self.mode_bits):
                with m.Case(k):
                    m.d.sync += y3.eq(saturate((p2 + half) >> s_r, bits))
        with m.If(v2 & ~scaling):
            m.d.sync += ss.eq(ss + p2)
        m.d.comb += [self.wr_en.eq(w3), self.wr_idx.eq(i3), self.wr_y.eq(y3)]
        in_flight = v1 | v2 | w3

        total = Signal(self.rs_bits)
        m.d.comb += total.eq(ss + eps)
        y_times_m = Signal(2 * fm.mult_bits + 2)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [mode.eq(self.mode), idx.eq(0), ss.eq(0), scaling.eq(0)]
                    m.next = "SQUARES"
            with m.State("SQUARES"):
                m.d.comb += [self.busy.eq(1), issue.eq(1)]
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == self.n - 1):
                    m.d.sync += idx.eq(0)
                    m.next = "SQ_DRAIN"
            with m.State("SQ_DRAIN"):
                m.d.comb += self.busy.eq(1)
                with m.If(~in_flight):
                    m.next = "RSQRT"
            with m.State("RSQRT"):
                m.d.comb += [self.busy.eq(1), rsq.i.valid.eq(1), rsq.i.payload.eq(Mux(total == 0, 1, total))]
                with m.If(rsq.i.ready):
                    m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += [self.busy.eq(1), rsq.o.ready.eq(1)]
                with m.If(rsq.o.valid):
                    m.d.sync += [y_times_m.eq(rsq.o.payload.y * mul),
                                 s_r.eq(rsq.o.payload.E + sft - frac - 1)]
                    m.next = "MULT"
            with m.State("MULT"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [m_r.eq(round_shift(y_times_m, frac + 1)), scaling.eq(1)]
                m.next = "SCALE"
            with m.State("SCALE"):
                m.d.comb += [self.busy.eq(1), issue.eq(1)]
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == self.n - 1):
                    m.d.sync += idx.eq(0)
                    m.next = "SC_DRAIN"
            with m.State("SC_DRAIN"):
                m.d.comb += self.busy.eq(1)
                with m.If(~in_flight):
                    m.next = "IDLE"
        return m
