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

Timing: the step is a loop (remainder -> subtract -> compare -> remainder),
so it cannot be pipelined; when the subtractor and the select do not fit one
clock stage (hw/arith/pipeline.py, e.g. 20 bits at 1 ns) the step takes two
cycles: the low half of the subtraction and its carry are registered first.
``cycles_per_bit`` says which.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.carry_save import prefix_add, zero_extend
from hw.arith.pipeline import plan_pipeline


class SequentialDivider(wiring.Component):
    def __init__(self, num_bits: int, den_bits: int, clock_period_ns: float):
        self.num_bits, self.den_bits = num_bits, den_bits
        d = plan_pipeline(clock_period_ns)
        step_ns = d.delays.adder(den_bits + 2) + d.delays.mux_level
        self.cycles_per_bit = 1 if step_ns <= d.budget_ns else 2
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
        not_den = Signal(self.den_bits + 2)   # ~den: shifted - den = shifted + ~den + 1
        step = Signal(range(nb + 1))
        busy = Signal()
        done = Signal()

        # one restoring step: bring down the next numerator bit, subtract if it fits
        trial = Signal(self.den_bits + 2)
        shifted = Signal(self.den_bits + 2)
        # shifted - den as shifted + ~den + 1: the +1 is the adder's carry in, ~den is
        # stored at the start, so no negation (a carry chain) is on any path
        m.d.comb += shifted.eq(Cat(quo[nb - 1], rem))
        width = len(trial)
        half = Signal()            # two-cycle step: the low half's sum is registered
        if self.cycles_per_bit == 1:
            m.d.comb += trial.eq(prefix_add(m, shifted, not_den, carry_in=1, name="trial")[:width])
            step_done = Const(1, 1)
        else:
            lo_bits = width // 2
            lo = prefix_add(m, shifted[:lo_bits], not_den[:lo_bits], carry_in=1, name="trial_lo")
            lo_sum, lo_carry = Signal(lo_bits), Signal()
            m.d.sync += [lo_sum.eq(lo[:lo_bits]), lo_carry.eq(lo[lo_bits])]
            hi = prefix_add(m, shifted[lo_bits:], not_den[lo_bits:], carry_in=lo_carry, name="trial_hi")
            m.d.comb += trial.eq(Cat(lo_sum, hi[:width - lo_bits]))
            step_done = half
            with m.If(busy):
                m.d.sync += half.eq(~half)
        fits = ~trial[-1]

        m.d.comb += [self.inp.ready.eq(~busy & ~done), self.out.valid.eq(done),
                     self.out.payload.quotient.eq(quo)]
        with m.If(self.inp.valid & self.inp.ready):
            m.d.sync += [quo.eq(self.inp.payload.num), den.eq(self.inp.payload.den), rem.eq(0),
                         not_den.eq(~zero_extend(self.inp.payload.den, len(not_den))),
                         step.eq(nb), busy.eq(1), half.eq(0)]
        with m.If(busy & step_done):
            m.d.sync += [rem.eq(Mux(fits, trial, shifted)), quo.eq(Cat(fits, quo[:nb - 1])),
                         step.eq(step - 1)]
            with m.If(step == 1):
                m.d.sync += [busy.eq(0), done.eq(1)]
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += done.eq(0)
        return m

