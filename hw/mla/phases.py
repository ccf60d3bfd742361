"""The MLA unit's phase control (hw/mla/unit.py "Schedule of one token"): ACCEPT, PROJ,
NORM, SCORE, UVO, OUTPUT."""
from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.proj.phases import accept, output, stream


class MlaPhases(wiring.Component):
    """In: ``valid`` (a token is offered), ``o_ready``; the projection sequencer's ``op`` /
    ``at_start`` and ``drained`` (hw/proj); ``norm_busy``; ``score_done`` (every head's
    context vector is in); ``wr_busy`` (the latent's cache row is being written).  Out:
    ``ready`` / ``take`` (the token is accepted this cycle), ``feed`` (the sequencer may
    stream), ``norm_start``, ``score_start``, ``more`` (open W_uv's and W_o's requests),
    ``finish`` (the token's last cycle before its offer), ``o_valid``, ``token_out`` (a
    cycle after the hand-over).  ``ops``: the ops W_uk, W_uv, W_o and their count."""

    def __init__(self, ops: tuple[int, int, int, int]):
        self.uk, self.uv, self.o, self.n_ops = ops
        super().__init__({
            "valid": In(1), "o_ready": In(1), "op": In(range(self.n_ops + 1)), "at_start": In(1),
            "drained": In(1), "norm_busy": In(1), "score_done": In(1), "wr_busy": In(1),
            "ready": Out(1), "take": Out(1), "feed": Out(1), "norm_start": Out(1), "score_start": Out(1),
            "more": Out(1), "finish": Out(1), "o_valid": Out(1), "token_out": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        op = self.op
        m.d.sync += self.token_out.eq(0)
        with m.FSM():
            accept(m, self, "PROJ")
            with m.State("PROJ"):
                # W_uk reads q: hold its first beat until q (and the gate codes) are stored
                with m.If(stream(m, self, self.uk, self.uv)):
                    m.d.comb += self.norm_start.eq(1)
                    m.next = "NORM"
            with m.State("NORM"):
                with m.If(~self.norm_busy & ~self.norm_start):
                    m.d.comb += self.score_start.eq(1)
                    m.next = "SCORE"
            with m.State("SCORE"):
                with m.If(self.score_done):
                    m.d.comb += self.more.eq(1)
                    m.next = "UVO"
            with m.State("UVO"):
                # W_o reads zo: hold its first beat until every o row is gated and stored
                with m.If(stream(m, self, self.o, self.n_ops) & ~self.wr_busy):
                    m.d.comb += self.finish.eq(1)
                    m.next = "OUTPUT"
            output(m, self)
        return m
