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

Read: a plain ``words``:1 read mux did not fit 1 ns on small (512 words: the
address bits fan out to 16k mux selects through ten buffer levels before
any logic).  So a read takes two cycles: the address is decoded into a
registered one-hot word select (a word's select fans out only to its own
``lanes * width`` AND gates), then an AND-OR tree of the words into the
read register.  The cleared flag folds into the select: a read issued while
cleared selects no word and returns zero, whatever commit does meanwhile.

Ports (one read, one write per cycle; reads take ``READ_LATENCY`` cycles):
``rd_en``/``rd_addr`` -> ``rd_data`` (``lanes`` signed entries) ``READ_LATENCY``
cycles later; ``wr_en``/``wr_addr``/``wr_data``; ``clear``, ``commit`` strobes.
A read sees the contents of the cycle after it is issued (the select
register's cycle): a write in the issue cycle is seen, one in the next
cycle is not.

``kind = "sram"`` (hw.state_memory): the same ports and latency on the platform's
1RW SRAM macros (hw/mem/fakeram.py).  One port per macro cannot serve a read and
a write in one cycle, so the words are split into two BANKS by address parity
(word w in bank w % 2, at w // 2), each bank the cheapest array of one macro kind
(``choose_macros``: tiny one fakeram45_32x64 per bank, small 4 x 2 fakeram45_64x32).
A read and a write in one cycle must go to different banks; the delta rule's
schedule guarantees it (hw/kda/delta.py: reads issued on cycles of their bank's
parity, writes an odd number of cycles after their read).  Should both meet in
one bank anyway, the write wins and the read returns zero (``collision`` is high
that cycle: the tests watch it, and the integer-model checks would see the zeros).
Read: the macro's one cycle (address into the macro, ``rd_out`` after the edge),
then the bank and row select (registered with the read, the cleared flag folded
in) as an AND-OR into the read register: two cycles, as for flip-flops.  Writes
are seen by a read issued the cycle after; a write and a read in one cycle are in
different banks, so which one the read sees does not arise.
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.reduce import or_tree
from hw.mem.fakeram import FakeRam, choose_macros

STATE_MEMORY_KINDS = ("flops", "sram")


def state_geometry(heads: int, d_k: int, d_v: int, lanes: int) -> int:
    """Number of memory words; checks that ``lanes`` divides ``d_k``."""
    if lanes < 1 or d_k % lanes:
        raise ValueError(f"hw.state_lanes = {lanes}: must divide model.head_dim ({d_k})")
    return heads * d_v * (d_k // lanes)


def state_word(h: int, i: int, j: int, d_k: int, d_v: int, lanes: int) -> tuple[int, int]:
    """(word, lane) of entry S_h[i, j]."""
    return (h * d_v + j) * (d_k // lanes) + i // lanes, i % lanes


class StateMemory(wiring.Component):
    READ_LATENCY = 2

    def __init__(self, heads: int, d_k: int, d_v: int, lanes: int, width: int, kind: str = "flops"):
        if kind not in STATE_MEMORY_KINDS:
            raise ValueError(f"state memory kind {kind!r}: one of {', '.join(STATE_MEMORY_KINDS)}")
        self.heads, self.d_k, self.d_v, self.lanes, self.width = heads, d_k, d_v, lanes, width
        self.kind = kind
        self.words = state_geometry(heads, d_k, d_v, lanes)
        # banks a read and a write of one cycle must not share (see the module doc)
        self.banks = 2 if kind == "sram" else 1
        self.macros = choose_macros((self.words + 1) // 2, lanes * width) if kind == "sram" else None
        word = data.ArrayLayout(signed(width), lanes)
        extra = {"collision": Out(1)} if kind == "sram" else {}
        super().__init__({**extra,
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
        if self.kind == "sram":
            self._sram(m)
        else:
            self._flops(m)
        with m.If(self.clear):
            m.d.sync += self.cleared.eq(1)
        with m.Elif(self.commit):
            m.d.sync += self.cleared.eq(0)
        return m

    def _flops(self, m):
        P, wb = self.lanes, self.lanes * self.width
        store = [Signal(wb, name=f"word{w}") for w in range(self.words)]
        with m.If(self.wr_en):
            with m.Switch(self.wr_addr):
                for w in range(self.words):
                    with m.Case(w):
                        m.d.sync += store[w].eq(self.wr_data.as_value())
        # cycle 1: the one-hot select (cleared as it is when the read is issued)
        select = Signal(self.words)
        m.d.sync += select.eq(Mux(self.rd_en & ~self.cleared, Const(1, self.words) << self.rd_addr, 0))
        # cycle 2: AND-OR of the words, registered
        rd_word = Signal(wb)
        m.d.sync += rd_word.eq(or_tree(Mux(select[w], store[w], 0) for w in range(self.words)))
        m.d.comb += self.rd_data.eq(rd_word)

    def _sram(self, m):
        wb, arr = self.lanes * self.width, self.macros
        spec = arr.spec
        row_bits = max(0, (arr.rows - 1).bit_length())
        ab = spec.addr_bits

        def split(addr):
            """bank, row within the bank, address within the macro"""
            a = addr[1:] if len(addr) > 1 else Const(0, 1)
            return addr[0], (a >> spec.addr_bits) if row_bits else Const(0, 1), a[:ab]
        rbank, rrow, raddr = split(self.rd_addr)
        wbank, wrow, waddr = split(self.wr_addr)
        m.d.comb += self.collision.eq(self.rd_en & self.wr_en & (rbank == wbank))
        # the read's macro group, registered with the read; a read issued while cleared
        # selects none and returns zero
        picks = []
        for b in range(2):
            for r in range(arr.rows):
                rd_here = Signal(name=f"b{b}r{r}_rd")
                wr_here = Signal(name=f"b{b}r{r}_wr")
                picked = Signal(name=f"b{b}r{r}_picked")
                m.d.comb += [rd_here.eq(self.rd_en & (rbank == b) & (rrow == r)),
                             wr_here.eq(self.wr_en & (wbank == b) & (wrow == r))]
                m.d.sync += picked.eq(rd_here & ~wr_here & ~self.cleared)
                outs = []
                for c in range(arr.cols):
                    ram = FakeRam(spec)
                    m.submodules[f"bank{b}_r{r}_c{c}"] = ram
                    lo = c * spec.bits
                    m.d.comb += [ram.ce_in.eq(rd_here | wr_here), ram.we_in.eq(wr_here),
                                 ram.addr_in.eq(Mux(wr_here, waddr, raddr)),
                                 ram.wd_in.eq(self.wr_data.as_value()[lo:lo + spec.bits]),
                                 ram.w_mask_in.eq(-1)]
                    outs.append(ram.rd_out)
                picks.append(Mux(picked, Cat(*outs)[:wb], 0))
        rd_word = Signal(wb)
        m.d.sync += rd_word.eq(or_tree(picks))
        m.d.comb += self.rd_data.eq(rd_word)
