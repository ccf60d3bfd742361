"""A stream register slice (skid buffer): every signal it drives comes from a flop.

Used where a stream crosses the chip boundary.  At the top of a chip the
clock reaches a flop through the clock tree (0.58 ns of a 1.25 ns period on
the routed tiny layer), so a path from a flop to an output pin, or from an
input pin through logic to a flop, starts or ends late by that much on top of
the output/input delay of the constraints.  The worst path of the routed
tiny layer before this slice was the weight port's ``resp.ready``: a flop
deep in the MoE, the arbiter's selection, then the pin (-0.08 ns after global
routing).  With the slice the pins see only flops: ``i.ready``, ``o.valid``
and ``o.payload`` are registers, and ``i.valid``/``i.payload`` go straight
into registers.

Two entries, so the stream keeps its full rate: ``out`` holds the beat on
offer, ``skid`` catches the one beat that can arrive in the cycle ``o.ready``
falls (``i.ready`` is registered, so it falls a cycle late).  One cycle of
latency; order and content of the beats are unchanged.
"""
from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out


class SkidBuffer(wiring.Component):
    def __init__(self, shape):
        self.shape = shape
        super().__init__({
            "i": In(stream.Signature(shape)),
            "o": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        skid_valid = Signal()
        skid = Signal.like(self.i.payload)
        m.d.comb += self.i.ready.eq(~skid_valid)
        take = self.i.valid & ~skid_valid
        with m.If(~self.o.valid | self.o.ready):
            # the output register is free (or given away this cycle): refill it, the
            # caught beat first, since it came before anything now on ``i``
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.valid.eq(self.i.valid), self.o.payload.eq(self.i.payload)]
        with m.Elif(take):
            m.d.sync += [skid_valid.eq(1), skid.eq(self.i.payload)]
        return m
