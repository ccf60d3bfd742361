"""The KDA state memory: per head a d_k x d_v matrix of ``state_bits`` entries.

Layout (one source of truth: ``state_word``): the memory is ``lanes`` entries
wide (``hw.state_lanes``), and one word holds ``lanes`` consecutive *rows* of
one *column*:

    word (h, j, b) = ((h * d_v) + j) * (d_k / lanes) + b      b = i // lanes
    lane           = i % lanes

Column-major because every per-token operation of the delta rule reduces
over the key index i for a fixed value column j (``(S'^T k)_j``,
``(S^T q)_j``) and writes with a scalar per column (``u_j``): a word then
feeds a ``lanes``-input adder tree into ONE accumulator per column instead of
``d_v`` accumulators updated ``lanes`` at a time.

Clear: the state must read as zero at a new sequence.  Rather than spending
``words`` cycles writing zeros, a single flag ``cleared`` makes every read
return zero; it is set by ``clear`` and dropped by ``commit``.  This is
correct because each token rewrites every word of the state (S = S' + k u^T
touches all entries), so the controller pulses ``commit`` once the first
token after a clear has written the whole memory.

Ports (one read, one write per cycle; reads take one cycle):
``rd_en``/``rd_addr`` -> ``rd_data`` (``lanes`` signed entries) a cycle later;
``wr_en``/``wr_addr``/``wr_data``; ``clear``, ``commit`` strobes.  A write and
a read of the same word in one cycle returns the old contents.
"""
from __future__ import annotations

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out


def state_geometry(heads: int, d_k: int, d_v: int, lanes: int) -> int:
    """Number of memory words; checks that ``lanes`` divides ``d_k``."""
    if lanes < 1 or d_k % lanes:
        raise ValueError(f"hw.state_lanes = {lanes}: must divide model.head_dim ({d_k})")
    return heads * d_v * (d_k // lanes)


def state_word(h: int, i: int, j: int, d_k: int, d_v: int, lanes: int) -> tuple[int, int]:
    """(word, lane) of entry S_h[i, j]."""
    return (h * d_v + j) * (d_k // lanes) + i // lanes, i % lanes


class StateMemory(wiring.Component):
    def __init__(self, heads: int, d_k: int, d_v: int, lanes: int, width: int):
        self.heads, self.d_k, self.d_v, self.lanes, self.width = heads, d_k, d_v, lanes, width
        self.words = state_geometry(heads, d_k, d_v, lanes)
        word = data.ArrayLayout(signed(width), lanes)
        super().__init__({
            "rd_en": In(1),
            "rd_addr": In(range(self.words)),
            "rd_data": Out(word),
            "wr_en": In(1),
            "wr_addr": In(range(self.words)),
            "wr_data": In(word),
            "clear": In(1),
            "commit": In(1),
            "cleared": Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = memory.Memory(
            shape=data.ArrayLayout(signed(self.width), self.lanes), depth=self.words, init=[])
        rd = mem.read_port(domain="sync")
        wr = mem.write_port()
        m.d.comb += [
            rd.en.eq(self.rd_en), rd.addr.eq(self.rd_addr),
            wr.en.eq(self.wr_en), wr.addr.eq(self.wr_addr), wr.data.eq(self.wr_data),
        ]
        # the flag as it was when the read was issued, so a commit in the
        # cycle the data comes back cannot change what that read returns
        zero = Signal()
        with m.If(self.rd_en):
            m.d.sync += zero.eq(self.cleared)
        m.d.comb += self.rd_data.eq(Mux(zero, 0, rd.data.as_value()))
        with m.If(self.clear):
            m.d.sync += self.cleared.eq(1)
        with m.Elif(self.commit):
            m.d.sync += self.cleared.eq(0)
        return m
