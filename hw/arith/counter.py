"""A wide counter that adds a constant without a full-width carry chain.

The layer's latency counters and the CSR counters are 32 bits wide; ``c + 1``
as one adder came out of ABC as a 32-bit ripple of NAND4/NOR4 (1.2 ns: the
top's worst paths after the residual add, issue 7).  Here the counter is
cut into chunks of ``CHUNK_BITS``; for every chunk two registered flags say
whether adding the constant's chunk to it would generate a carry out (g)
or pass an incoming one on (p).  A cycle's carries into the chunks come
from these flags by a short look-ahead, so the longest path is one chunk's
add plus the flags of its new value, whatever the width.

The flags are a function of the value, so every write of the value writes
them too: ``load`` takes a value (a constant or another counter's ``next``)
and computes them, which for ``other.next`` is the same path as counting.

``event_counter`` is the same counter as one call: what the units' cycle, token, beat
and hit counters are (the chip's CSR, latency and loader counters use the class).
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, Value

CHUNK_BITS = 8


class ChunkedCounter:
    """``value`` (unsigned ``width``) becomes ``value + step`` (mod 2**width) in each cycle
    ``inc`` is high, or the ``load`` value.  ``next`` is the value after this cycle's
    count (comb), for owners that copy it.  Use ``elaborate(m)`` once, after the
    loads are declared."""

    def __init__(self, width: int, step: int = 1, name: str = "counter", step2: int | None = None):
        for s in (step, step2):
            if s is not None and not 0 <= s < 1 << width:
                raise ValueError(f"counter {name}: step {s} outside 0..2**{width}-1")
        self.width, self.step, self.name = width, step, name
        self.value = Signal(width, name=name)
        self.inc = Signal(name=f"{name}_inc")
        self.next = Signal(width, name=f"{name}_next")
        self._chunks = [(lo, min(width, lo + CHUNK_BITS)) for lo in range(0, width, CHUNK_BITS)]
        # each step has its own registered flags: chunk + step chunk overflows (g) or is all
        # ones (p: passes a carry on); the reset value's flags are their initial values
        self._steps = [step] + ([step2] if step2 is not None else [])
        self._flag_regs = []
        for n_, s in enumerate(self._steps):
            g0, p0 = self._flag_ints(0, s)
            sfx = "" if n_ == 0 else str(n_ + 1)
            self._flag_regs.append((Signal(len(self._chunks), name=f"{name}_g{sfx}", init=g0),
                                    Signal(len(self._chunks), name=f"{name}_p{sfx}", init=p0)))
        # ``inc2`` (only with ``step2``): add step2 instead of step this cycle (it wins over inc)
        self.inc2 = Signal(name=f"{name}_inc2") if step2 is not None else None
        self._loads: list[tuple[Value, Value]] = []

    def _step_chunk(self, k: int, step: int | None = None) -> int:
        lo, hi = self._chunks[k]
        return ((self.step if step is None else step) >> lo) & ((1 << (hi - lo)) - 1)

    def _flag_ints(self, value: int, step: int) -> tuple[int, int]:
        g = p = 0
        for k, (lo, hi) in enumerate(self._chunks):
            total = ((value >> lo) & ((1 << (hi - lo)) - 1)) + self._step_chunk(k, step)
            g |= (total >= 1 << (hi - lo)) << k
            p |= (total == (1 << (hi - lo)) - 1) << k
        return g, p

    def _flags(self, value, step: int) -> tuple[Value, Value]:
        """(g, p) of a value for ``step``, chunk by chunk: a compare of each chunk against constants."""
        value = Value.cast(value)
        g, p = [], []
        for k, (lo, hi) in enumerate(self._chunks):
            bits, c = hi - lo, self._step_chunk(k, step)
            chunk = value[lo:hi]
            g.append(chunk >= (1 << bits) - c if c else Const(0, 1))
            p.append(chunk == (1 << bits) - 1 - c)
        return Cat(*g), Cat(*p)

    def load(self, when, value) -> None:
        """Write ``value`` in the cycles ``when`` is high (the first load declared wins)."""
        self._loads.append((Value.cast(when), Value.cast(value)))

    def _sum(self, step: int, g, p) -> Value:
        """value + step, the carry into chunk k from the flags: some lower chunk generates
        and every chunk between passes."""
        carries = [Const(0, 1)]
        for k in range(1, len(self._chunks)):
            c = Const(0, 1)
            for j in range(k):
                term = g[j]
                for i in range(j + 1, k):
                    term = term & p[i]
                c = c | term
            carries.append(c)
        parts = []
        for k, (lo, hi) in enumerate(self._chunks):
            total = self.value[lo:hi] + self._step_chunk(k, step) + carries[k]
            parts.append(total[:hi - lo])
        return Cat(*parts)

    def elaborate(self, m) -> None:
        sums = [self._sum(s, g, p) for s, (g, p) in zip(self._steps, self._flag_regs)]
        nxt = Mux(self.inc, sums[0], self.value)
        if self.inc2 is not None:
            nxt = Mux(self.inc2, sums[1], nxt)
        m.d.comb += self.next.eq(nxt)

        def flag_writes(value):
            out = []
            for s, (g, p) in zip(self._steps, self._flag_regs):
                g_v, p_v = self._flags(value, s)
                out += [g.eq(g_v), p.eq(p_v)]
            return out
        chain = None
        for when, value in self._loads:
            branch = (m.If if chain is None else m.Elif)(when)
            with branch:
                m.d.sync += [self.value.eq(value), *flag_writes(value)]
            chain = True
        with (m.Else() if chain else m.If(1)):
            m.d.sync += [self.value.eq(self.next), *flag_writes(self.next)]


def event_counter(m: Module, event, name: str, width: int = 32, clear=None, clear_to: int = 0) -> Value:
    """A ``width``-bit count of the cycles ``event`` is high (``1``: every cycle), the one way
    the units build their event and performance counters: a ``ChunkedCounter``, so no carry
    chain longer than a chunk is in one cycle, and the count is exact in every cycle.
    ``clear``: the count restarts at ``clear_to`` in the cycles it is high (over the event);
    reset clears it."""
    counter = ChunkedCounter(width, name=name)
    m.d.comb += counter.inc.eq(event)
    if clear is not None:
        counter.load(clear, Const(clear_to, width))
    counter.elaborate(m)
    return counter.value
