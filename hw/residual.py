"""The two-scale residual add, one element per cycle.

Implements ``sim.models.int_ops.int_residual_add`` element by element:

    y = sat_resid(round_shift(a * m_a + b * m_b, s))

``a`` is the residual stream (resid_bits), ``b`` the branch output (int8
from KDA, resid_bits from MoE); (m_a, m_b, s) come from a ``QResidual`` and
are constants of the generated RTL (constant multipliers).  Two stages
(products; sum, round, shift, saturate) so neither the constant multiply
nor the wide add sits in one path with the saturation.  The owner streams
``(valid, idx, a, b)`` in and writes ``(wr_en, wr_idx, wr_y)`` two cycles
later: its vectors live in its own registers, as for the normaliser.
"""
from __future__ import annotations

from amaranth import Const, Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.kda_delta import round_shift, saturate


class ResidualAdd(wiring.Component):
    def __init__(self, res, a_bits: int, b_bits: int, out_bits: int, n: int):
        self.m_a, self.m_b, self.s = int(res.m_a), int(res.m_b), int(res.s)
        if self.s < 0:
            raise ValueError(f"residual add: shift {self.s} < 0")
        self.a_bits, self.b_bits, self.out_bits, self.n = a_bits, b_bits, out_bits, n
        super().__init__({
            "valid": In(1), "idx": In(range(n)), "a": In(signed(a_bits)), "b": In(signed(b_bits)),
            "wr_en": Out(1), "wr_idx": Out(range(n)), "wr_y": Out(signed(out_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        ma = Const(self.m_a, signed(max(2, self.m_a.bit_length() + 1)))
        mb = Const(self.m_b, signed(max(2, self.m_b.bit_length() + 1)))
        pa = Signal(signed(self.a_bits + len(ma)))
        pb = Signal(signed(self.b_bits + len(mb)))
        v1, i1 = Signal(), Signal(range(self.n))
        m.d.sync += [v1.eq(self.valid), i1.eq(self.idx), pa.eq(self.a * ma), pb.eq(self.b * mb)]
        total = Signal(signed(max(len(pa), len(pb)) + 1))
        m.d.comb += total.eq(pa + pb)
        m.d.sync += [self.wr_en.eq(v1), self.wr_idx.eq(i1),
                     self.wr_y.eq(saturate(round_shift(total, self.s), self.out_bits))]
        return m
