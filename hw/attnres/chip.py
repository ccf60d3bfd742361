"""The depth unit on the model chip (hw/chip/model.py): one job at a time, each a value kept
and the slot's next input mixed, in the order of ``int_model.int_attn_res_stack_step``.

A token's steps in its slot, each a job (a START or an ADD, then a MIX):

``x0``  the embedding row:       START(x_0), MIX -> stage A's input of layer 0
``ya``  stage A's residual add:  ADD(v_2l+1), MIX -> stage B's input (the datapath's HQ)
``yb``  stage B's residual add:  ADD(v_2l+2), MIX -> stage A's input of layer l + 1, or after
                                 the last layer x_L, the head's input

(The residual adds are requantize(branch, out_m, out_s): the image gives them m_a = 0,
hw/image/param_map.py attn_res_residuals.)  ``mix`` gives the mixed vector with its slot and
the job's source, which tells the top where it goes.  A slot's jobs come one after another
(its token is in one place at a time); between slots the depth unit keeps each slot's
values apart.  Stage A's job first (stage B waits for it), then stage B's, then the
embedding's: the ones nearer a token's end free a stage sooner.
"""
from __future__ import annotations

from amaranth import Module, Signal, signed
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from hw.attnres.unit import DepthUnit, Op
from hw.stream.weight_port import WeightPortSignature
from hw.image.memory_map import slot_bits
from hw.image.param_map import param_layout
from moekda.formats import formats_for


class Src(enum.Enum, shape=2):
    X0 = 0
    A = 1
    B = 2


def vec_layout(cfg) -> data.StructLayout:
    fm = formats_for(cfg)
    return data.StructLayout({"v": data.ArrayLayout(signed(fm.resid_bits), cfg.model.d_model),
                              "slot": slot_bits(cfg)})


class DepthSequencer(wiring.Component):
    def __init__(self, cfg):
        self.cfg = cfg
        lay = vec_layout(cfg)
        super().__init__({
            "x0": In(stream.Signature(lay)),
            "ya": In(stream.Signature(lay)),
            "yb": In(stream.Signature(lay)),
            "mix": Out(stream.Signature(data.StructLayout({**dict(lay.members), "src": Src}))),
            "wport": Out(WeightPortSignature(cfg.hw.weight_port_bytes)),
            "params": In(param_layout(cfg, "attn_res", mixer="head")),
            "mac_beat": Out(1),         # the unit's engine took a beat (the chip's MACS counter)
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = DepthUnit(self.cfg)
        connect(m, unit.wport, wiring.flipped(self.wport))
        m.d.comb += [unit.params.eq(self.params), self.mac_beat.eq(unit.mac_beat)]
        V = Signal.like(self.x0.payload.v)
        slot = Signal.like(self.x0.payload.slot)
        src = Signal(Src)
        m.d.comb += [unit.i.payload.slot.eq(slot), unit.i.payload.v.eq(V),
                     self.mix.payload.v.eq(unit.o.payload), self.mix.payload.slot.eq(slot),
                     self.mix.payload.src.eq(src)]
        with m.FSM():
            with m.State("IDLE"):
                # one source a cycle, by priority
                with m.If(self.ya.valid):
                    m.d.comb += self.ya.ready.eq(1)
                    m.d.sync += [V.eq(self.ya.payload.v), slot.eq(self.ya.payload.slot), src.eq(Src.A)]
                    m.next = "KEEP"
                with m.Elif(self.yb.valid):
                    m.d.comb += self.yb.ready.eq(1)
                    m.d.sync += [V.eq(self.yb.payload.v), slot.eq(self.yb.payload.slot), src.eq(Src.B)]
                    m.next = "KEEP"
                with m.Elif(self.x0.valid):
                    m.d.comb += self.x0.ready.eq(1)
                    m.d.sync += [V.eq(self.x0.payload.v), slot.eq(self.x0.payload.slot), src.eq(Src.X0)]
                    m.next = "KEEP"
            with m.State("KEEP"):
                m.d.comb += [unit.i.valid.eq(1), unit.i.payload.op.eq(Op.ADD)]
                with m.If(src == Src.X0):
                    m.d.comb += unit.i.payload.op.eq(Op.START)
                with m.If(unit.i.ready):
                    m.next = "MIX"
            with m.State("MIX"):
                m.d.comb += [unit.i.valid.eq(1), unit.i.payload.op.eq(Op.MIX)]
                with m.If(unit.i.ready):
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [self.mix.valid.eq(unit.o.valid), unit.o.ready.eq(self.mix.ready)]
                with m.If(unit.o.valid & self.mix.ready):
                    m.next = "IDLE"
        return m
