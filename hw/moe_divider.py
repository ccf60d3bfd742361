"""Sequential unsigned divider: ``quotient = floor(num / den)``, one bit per cycle.

The MoE weight normalisation divides by the sum of the chosen scores once per
chosen expert and token; that happens while the shared expert streams
through the engine, so a small restoring divider (one subtractor, no
multiplier) is the right size: ``num_bits`` cycles per division.
Rounding is the caller's business: floor(num/den) is the primitive, and
round-half-up is floor((num + den//2)/den).

Interface: ``inp`` stream {num, den}, ``out`` stream {quotient}; one division
at a time.  A zero denominator gives an all-ones quotient (the caller's model
never divides by zero; this only makes the behaviour defined).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.moe_arith import prefix_add


class SequentialDivider(wiring.Component):
    def __init__(self, num_bits: int, den_bits: int):
        self.num_bits, self.den_bits = num_bits, den_bits
        super().__init__({
            "inp": In(stream.Signature(data.StructLayout({"num": unsigned(num_bits), "den": unsigned(den_bits)}))),
            "out": Out(stream.Signature(data.StructLayout({"quotient": unsigned(num_bits)}))),
        })

    def elaborate(self, platform):
        m = Module()
        nb = self.num_bits
        rem = Signal(self.den_bits + 1)   # partial remainder, always < den after each step
        quo = Signal(nb)                  # shifts in quotient bits; holds the numerator bits still to use
        den = Signal(self.den_bits)
        neg_den = Signal(self.den_bits + 2)
        step = Signal(range(nb + 1))
        busy = Signal()
        done = Signal()

        # one restoring step: bring down the next numerator bit, subtract if it fits
        trial = Signal(self.den_bits + 2)
        shifted = Signal(self.den_bits + 2)
        # shifted - den as shifted + (-den): -den is fixed for the whole division
        m.d.comb += [shifted.eq(Cat(quo[nb - 1], rem)),
                     trial.eq(prefix_add(m, shifted, neg_den, len(trial), "trial"))]
        fits = ~trial[-1]

        m.d.comb += [self.inp.ready.eq(~busy & ~done), self.out.valid.eq(done),
                     self.out.payload.quotient.eq(quo)]
        with m.If(self.inp.valid & self.inp.ready):
            m.d.sync += [quo.eq(self.inp.payload.num), den.eq(self.inp.payload.den), rem.eq(0),
                         neg_den.eq(-self.inp.payload.den),
                         step.eq(nb), busy.eq(1)]
        with m.If(busy):
            m.d.sync += [rem.eq(Mux(fits, trial, shifted)), quo.eq(Cat(fits, quo[:nb - 1])),
                         step.eq(step - 1)]
            with m.If(step == 1):
                m.d.sync += [busy.eq(0), done.eq(1)]
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += done.eq(0)
        return m

