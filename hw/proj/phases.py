"""The states every unit's phase control has (the KDA's hw/kda/phases.py, the MLA's
hw/mla/phases.py): a token accepted, matrices streamed until one that reads an earlier
one's rows, the output offered.  Each is written into the unit's ``m.FSM()``; ``c`` is the
phase-control component, with the ports these read and drive: ``valid`` / ``ready`` /
``take`` (the token), ``op`` / ``at_start`` / ``drained`` / ``feed`` (the projection
sequencer, hw/proj/sequencer.py, and hw/proj/results.py ``PendingRows``), ``o_ready`` /
``o_valid`` / ``token_out`` (the output)."""
from __future__ import annotations


def accept(m, c, next_state: str) -> None:
    """ACCEPT: ready for a token; ``take`` the cycle one comes."""
    with m.State("ACCEPT"):
        m.d.comb += [c.ready.eq(1), c.take.eq(c.valid)]
        with m.If(c.valid):
            m.next = next_state


def stream(m, c, reader: int, end: int):
    """Inside a streaming state: ``feed`` the sequencer while ``op`` is below ``end``, but
    hold the first beat of op ``reader`` (it reads an earlier op's rows) until every row
    issued is stored.  Returns the condition that ops up to ``end`` are done and stored."""
    wait = (c.op == reader) & c.at_start & ~c.drained
    m.d.comb += c.feed.eq((c.op < end) & ~wait)
    return (c.op == end) & c.drained


def output(m, c) -> None:
    """OUTPUT: the token's output offered; ``token_out`` a cycle after it is taken."""
    with m.State("OUTPUT"):
        m.d.comb += c.o_valid.eq(1)
        with m.If(c.o_ready):
            m.d.sync += c.token_out.eq(1)
            m.next = "ACCEPT"
