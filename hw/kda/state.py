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

Layers (``layers`` = L, the layers of a model run on the one datapath,
hw/image/memory_map.py ``layer_count``): the memory holds L such states, one per
layer, and the layer index is the high part of the word address,

    address (l, w) = l * 2**word_bits + w          ``state_address``

(word_bits = the bits of a word index within a layer), so a layer's state is one
contiguous block when ``words`` is a power of two, and the delta rule's word
counters stay as wide as one layer's words.  With L = 1 the address is the word.

Clear: the state must read as zero at a new sequence.  Rather than spending
``words`` cycles writing zeros, a flag per layer, ``cleared[l]``, makes every read
of layer l return zero; it is set by ``clear[l]`` and dropped by ``commit[l]``.
This is correct because each token rewrites every word of its layer's state
(S = S' + k u^T touches all entries), so the controller pulses ``commit[l]`` once
the first token of layer l after a clear has written that layer's words; the
other layers' words and flags are untouched (a new sequence reaches each layer
with its own clear, token by token).  Reset sets every flag.

Read: a plain ``words``:1 read mux did not fit 1 ns on small (512 words: the
address bits fan out to 16k mux selects through ten buffer levels before
any logic).  So a read takes two cycles: the address is decoded into a
registered one-hot word select (a word's select fans out only to its own
``lanes * width`` AND gates), then an AND-OR tree of the words into the
read register.  Each layer's words are their own module (``StateWords``), so
synthesis maps the layers one by one; the layer bits are decoded into the
layer's registered select in the first cycle, so the second cycle stays one AND
and an OR tree (the layers' outputs ORed: log2 L levels deeper).  The read's
layer's cleared flag folds into the select: a read issued while its layer is
cleared selects no word and returns zero, whatever commit does meanwhile.

Ports (one read, one write per cycle; reads take ``READ_LATENCY`` cycles):
``rd_en``/``rd_addr`` -> ``rd_data`` (``lanes`` signed entries) ``READ_LATENCY``
cycles later; ``wr_en``/``wr_addr``/``wr_data`` (addresses as ``state_address``);
``clear``, ``commit``: L strobe bits, bit l for layer l; ``cleared``: the L flags.
A read sees the contents of the cycle after it is issued (the select
register's cycle): a write in the issue cycle is seen, one in the next
cycle is not.

``kind = "sram"`` (hw.state_memory): the same ports and latency on the platform's
1RW SRAM macros (hw/mem/fakeram.py).  One port per macro cannot serve a read and
a write in one cycle, so the words are split into two BANKS by address parity
(address a in bank a % 2, at a // 2: a word's bank is the parity of its index within
its layer), each bank the cheapest array of one macro kind for its L layers' words
(``choose_macros``, per bank: tiny one fakeram45_32x64, small 4 x 2 fakeram45_64x32;
model-tiny-sram (8 contexts: 4 layers x 2 sequence slots) 4 x 2 fakeram45_64x32,
model-small-sram (12 contexts) 3 x 2 fakeram45_1024x32: more contexts are more macro
rows, or deeper macros, whichever is cheaper).
A read and a write in one cycle must go to different banks; the delta rule's
schedule guarantees it (hw/kda/delta.py: reads issued on cycles of their bank's
parity, writes an odd number of cycles after their read).  Should both meet in
one bank anyway, the write wins and the read returns zero (``collision`` is high
that cycle: the tests watch it, and the integer-model checks would see the zeros).
Read: the macro's one cycle (address into the macro, ``rd_out`` after the edge),
then the bank and row select (registered with the read, the read's layer's cleared
flag folded in) as an AND-OR into the read register: two cycles, as for flip-flops.  Writes
are seen by a read issued the cycle after; a write and a read in one cycle are in
different banks, so which one the read sees does not arise.
"""
from __future__ import annotations

from amaranth import Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.reduce import or_tree
from hw.mem.fakeram import choose_macros, macro_row

STATE_MEMORY_KINDS = ("flops", "sram")


def state_geometry(heads: int, d_k: int, d_v: int, lanes: int) -> int:
    """Number of memory words of one layer's state; checks that ``lanes`` divides ``d_k``."""
    if lanes < 1 or d_k % lanes:
        raise ValueError(f"hw.state_lanes = {lanes}: must divide model.head_dim ({d_k})")
    return heads * d_v * (d_k // lanes)


def state_word(h: int, i: int, j: int, d_k: int, d_v: int, lanes: int) -> tuple[int, int]:
    """(word, lane) of entry S_h[i, j] within its layer's state."""
    return (h * d_v + j) * (d_k // lanes) + i // lanes, i % lanes


def word_bits(words: int) -> int:
    """Bits of a word index within one layer (the low part of a state address)."""
    return (words - 1).bit_length()


def state_address(layer: int, word: int, words: int) -> int:
    """The memory address of word ``word`` of layer ``layer``: the layer is the high part."""
    if not 0 <= word < words:
        raise ValueError(f"state word {word}: a layer has {words} words")
    return (layer << word_bits(words)) | word


class StateMemory(wiring.Component):
    READ_LATENCY = 2

    def __init__(self, heads: int, d_k: int, d_v: int, lanes: int, width: int, kind: str = "flops",
                 layers: int = 1):
        if kind not in STATE_MEMORY_KINDS:
            raise ValueError(f"state memory kind {kind!r}: one of {', '.join(STATE_MEMORY_KINDS)}")
        if layers < 1:
            raise ValueError(f"state memory: {layers} layers")
        self.heads, self.d_k, self.d_v, self.lanes, self.width = heads, d_k, d_v, lanes, width
        self.kind, self.layers = kind, layers
        self.words = state_geometry(heads, d_k, d_v, lanes)        # of one layer
        # the addresses in use, layer by layer, and the size of the address range
        self.addresses = [state_address(l, w, self.words) for l in range(layers) for w in range(self.words)]
        self.addr_space = self.addresses[-1] + 1
        # banks a read and a write of one cycle must not share (see the module doc)
        self.banks = 2 if kind == "sram" else 1
        self.macros = choose_macros((self.addr_space + 1) // 2, lanes * width) if kind == "sram" else None
        word = data.ArrayLayout(signed(width), lanes)
        extra = {"collision": Out(1)} if kind == "sram" else {}
        super().__init__({**extra,
            "rd_en": In(1),
            "rd_addr": In(range(self.addr_space)),
            "rd_data": Out(word),
            "wr_en": In(1),
            "wr_addr": In(range(self.addr_space)),
            "wr_data": In(word),
            "clear": In(layers),
            "commit": In(layers),
            "cleared": Out(layers, init=(1 << layers) - 1),
        })

    def elaborate(self, platform):
        m = Module()
        if self.kind == "sram":
            self._sram(m)
        else:
            self._flops(m)
        if self.layers == 1:
            with m.If(self.clear):
                m.d.sync += self.cleared.eq(1)
            with m.Elif(self.commit):
                m.d.sync += self.cleared.eq(0)
        else:
            for l in range(self.layers):
                with m.If(self.clear[l]):
                    m.d.sync += self.cleared[l].eq(1)
                with m.Elif(self.commit[l]):
                    m.d.sync += self.cleared[l].eq(0)
        return m

    def _cleared_at(self, addr):
        """The cleared flag of the layer ``addr`` is in (its high bits)."""
        if self.layers == 1:
            return self.cleared
        return self.cleared.bit_select(addr[word_bits(self.words):], 1)

    def _flops(self, m):
        # one StateWords per layer (context), each its own module: the same registers and
        # AND-OR tree as one flat array, but synthesis maps them context by context (one
        # module of model-small's 12 contexts, 3.4 mm2 of flip-flops and read tree, kept
        # ABC busy past Yosys's hour); the layer's part of the read is decoded into its
        # bank's registered select, so the second cycle is still one AND and an OR tree
        wb, wbits = self.lanes * self.width, word_bits(self.words)
        outs = []
        for l in range(self.layers):
            bank = StateWords(self.words, wb)
            m.submodules[f"layer{l}" if self.layers > 1 else "words"] = bank
            if self.layers == 1:
                rd_here, wr_here = self.rd_en, self.wr_en
            else:
                rd_here = self.rd_en & (self.rd_addr[wbits:] == l)
                wr_here = self.wr_en & (self.wr_addr[wbits:] == l)
            cleared = self.cleared if self.layers == 1 else self.cleared[l]
            m.d.comb += [bank.rd_en.eq(rd_here & ~cleared), bank.rd_word.eq(self.rd_addr[:wbits]),
                         bank.wr_en.eq(wr_here), bank.wr_word.eq(self.wr_addr[:wbits]),
                         bank.wr_data.eq(self.wr_data.as_value())]
            outs.append(bank.rd_data)
        # cycle 2: the banks' AND-OR outputs (all zero but the read's), registered
        rd_word = Signal(wb)
        m.d.sync += rd_word.eq(or_tree(outs))
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
        rd_cleared = self._cleared_at(self.rd_addr)
        m.d.comb += self.collision.eq(self.rd_en & self.wr_en & (rbank == wbank))
        # the read's macro group, registered with the read; a read issued while its layer
        # is cleared selects none and returns zero
        picks = []
        for b in range(2):
            for r in range(arr.rows):
                rd_here = Signal(name=f"b{b}r{r}_rd")
                wr_here = Signal(name=f"b{b}r{r}_wr")
                picked = Signal(name=f"b{b}r{r}_picked")
                m.d.comb += [rd_here.eq(self.rd_en & (rbank == b) & (rrow == r)),
                             wr_here.eq(self.wr_en & (wbank == b) & (wrow == r))]
                m.d.sync += picked.eq(rd_here & ~wr_here & ~rd_cleared)
                out = macro_row(m, arr, f"bank{b}_r{r}", ce=rd_here | wr_here, we=wr_here,
                                addr=Mux(wr_here, waddr, raddr), wd=self.wr_data.as_value(), mask=-1)
                picks.append(Mux(picked, out[:wb], 0))
        rd_word = Signal(wb)
        m.d.sync += rd_word.eq(or_tree(picks))
        m.d.comb += self.rd_data.eq(rd_word)


class StateWords(wiring.Component):
    """One layer's (context's) state words in flip-flops, for StateMemory's "flops" kind.

    ``wr_en``/``wr_word``/``wr_data``: a word written at the clock edge.  ``rd_en``/``rd_word``
    (the caller folds the layer and its cleared flag into ``rd_en``): cycle 1 registers the
    one-hot word select (a word's select fans out only to its own ``wb`` AND gates);
    ``rd_data`` is then, combinationally, the selected word, or zero when no read was
    issued, so the caller ORs the banks' outputs into its read register (cycle 2).
    """

    def __init__(self, words: int, wb: int):
        self.words, self.wb = words, wb
        super().__init__({
            "wr_en": In(1), "wr_word": In(range(words)), "wr_data": In(wb),
            "rd_en": In(1), "rd_word": In(range(words)), "rd_data": Out(wb),
        })

    def elaborate(self, platform):
        m = Module()
        store = [Signal(self.wb, name=f"word{w}") for w in range(self.words)]
        # one address comparison per word, not a Switch: a Switch's Verilog lists every
        # earlier case in each word's process, quadratic in the words
        for w, word in enumerate(store):
            with m.If(self.wr_en & (self.wr_word == w)):
                m.d.sync += word.eq(self.wr_data)
        select = Signal(self.words)
        m.d.sync += select.eq(Mux(self.rd_en, Const(1, self.words) << self.rd_word, 0))
        m.d.comb += self.rd_data.eq(or_tree(Mux(select[w], word, 0) for w, word in enumerate(store)))
        return m
