"""The KDA unit's phase control (hw/kda/unit.py "Schedule of one token"): ACCEPT, PROJ,
the norms of q and k head by head, DELTA, the o norm head by head, WO, OUTPUT."""
from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.proj.phases import accept, output, stream


class KdaPhases(wiring.Component):
    """In: ``valid`` (a token is offered), ``o_ready``; the projection sequencer's ``op`` /
    ``at_start`` and ``drained`` (hw/proj); ``norm_busy``, ``gate_empty`` (no gated o value
    on its way), ``delta_busy``, ``delta_done`` (every o column is stored).  Out: ``take``
    (the token is accepted this cycle: ``ready``), ``feed`` (the sequencer may stream),
    ``norm_start`` / ``norm_mode`` (0 q, 1 k, 2 o) / ``head``, ``delta_begin`` (the delta
    rule starts next: its o columns count from 0), ``delta_start``, ``more`` (open W_o's
    request), ``finish`` (the token's last cycle before its offer), ``o_valid``,
    ``token_out`` (a cycle after the hand-over).  ``ops``: (f_up's op, W_o's op, the op
    count); ``heads``: H."""

    def __init__(self, ops: tuple[int, int, int], heads: int):
        self.fu, self.wo, self.n_ops = ops
        self.heads = heads
        super().__init__({
            "valid": In(1), "o_ready": In(1), "op": In(range(self.n_ops + 1)), "at_start": In(1),
            "drained": In(1), "norm_busy": In(1), "gate_empty": In(1), "delta_busy": In(1), "delta_done": In(1),
            "ready": Out(1), "take": Out(1), "feed": Out(1), "norm_start": Out(1), "norm_mode": Out(2),
            "head": Out(range(heads)), "delta_begin": Out(1), "delta_start": Out(1), "more": Out(1),
            "finish": Out(1), "o_valid": Out(1), "token_out": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        op, nh, mode = self.op, self.head, self.norm_mode
        m.d.sync += self.token_out.eq(0)
        with m.FSM():
            accept(m, self, "PROJ")
            with m.State("PROJ"):
                # f_up reads fd: hold its first beat until every earlier row is stored
                with m.If(stream(m, self, self.fu, self.wo)):
                    m.d.sync += [nh.eq(0), mode.eq(0)]
                    m.next = "NORM_START"
            with m.State("NORM_START"):
                m.d.comb += self.norm_start.eq(1)
                m.next = "NORM_WAIT"
            with m.State("NORM_WAIT"):
                with m.If(~self.norm_busy & self.gate_empty):
                    m.next = "NORM_START"
                    m.d.sync += nh.eq(nh + 1)
                    with m.If(nh == self.heads - 1):
                        m.d.sync += [nh.eq(0), mode.eq(mode + 1)]
                        with m.If(mode == 1):
                            m.d.comb += self.delta_begin.eq(1)
                            m.next = "DELTA_START"
                        with m.If(mode == 2):
                            m.d.comb += self.more.eq(1)
                            m.next = "WO"
            with m.State("DELTA_START"):
                m.d.comb += self.delta_start.eq(1)
                m.next = "DELTA"
            with m.State("DELTA"):
                with m.If(~self.delta_busy & self.delta_done):
                    m.next = "NORM_START"          # norm_mode is 2: the o norm
            with m.State("WO"):
                m.d.comb += self.feed.eq(op == self.wo)
                with m.If((op == self.n_ops) & self.drained):
                    m.d.comb += self.finish.eq(1)
                    m.next = "OUTPUT"
            output(m, self)
        return m
