"""A lane multiply-accumulate for the KDA unit's projections (interim engine).

The contract is the engine model of sim/models/matvec.py: a beat carries
``lanes`` int8 weights and activations and ``first``/``last`` framing; the
accumulator restarts on ``first`` and one result leaves after ``last``.
Unlike that model, this unit returns the raw accumulator only: the KDA unit
requantises itself because ``f_up`` adds a bias to the accumulator before
requantisation (QLinear.bias), which the engine contract does not carry.
A ``tag`` (which row of which tensor) travels with every beat.

It stays in hw/kda_* until the shared engine (hw/matvec.py) can take the
KDA unit's beats; it has no back-pressure: a result leaves two cycles after
its last beat, whatever happens downstream.
"""
from __future__ import annotations

from amaranth import Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out


class LaneMac(wiring.Component):
    def __init__(self, lanes: int, in_bits: int, acc_bits: int, tag_bits: int):
        self.lanes, self.in_bits, self.acc_bits = lanes, in_bits, acc_bits
        vec = data.ArrayLayout(signed(in_bits), lanes)
        super().__init__({
            "valid": In(1), "w": In(vec), "x": In(vec), "first": In(1), "last": In(1), "tag": In(tag_bits),
            "acc_valid": Out(1), "acc": Out(signed(acc_bits)), "acc_tag": Out(tag_bits),
        })

    def elaborate(self, platform):
        m = Module()
        L = self.lanes
        # stage 1: the lane products; stage 2: their sum
        p_valid, p_first, p_last = Signal(), Signal(), Signal()
        p_tag = Signal.like(self.tag)
        prods = [Signal(signed(2 * self.in_bits), name=f"p{i}") for i in range(L)]
        m.d.sync += [p_valid.eq(self.valid), p_first.eq(self.first), p_last.eq(self.last & self.valid),
                     p_tag.eq(self.tag)] + [prods[i].eq(self.w[i] * self.x[i]) for i in range(L)]
        s_valid, s_first, s_last = Signal(), Signal(), Signal()
        s_tag = Signal.like(self.tag)
        s_sum = Signal(signed(2 * self.in_bits + (L - 1).bit_length()))
        m.d.sync += [s_valid.eq(p_valid), s_first.eq(p_first), s_last.eq(p_last),
                     s_tag.eq(p_tag), s_sum.eq(sum(prods))]
        # stage 3: accumulate (wrapping at acc_bits, as the model's register)
        acc = Signal(signed(self.acc_bits))
        with m.If(s_valid & s_first):
            m.d.sync += acc.eq(s_sum)
        with m.Elif(s_valid):
            m.d.sync += acc.eq(acc + s_sum)          # truncation to acc_bits = the model's wrap
        m.d.sync += [self.acc_valid.eq(s_valid & s_last), self.acc_tag.eq(s_tag)]
        m.d.comb += self.acc.eq(acc)
        return m
