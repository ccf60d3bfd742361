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
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, Value

CHUNK_BITS = 8


class ChunkedCounter:
    """``value`` (unsigned ``width``) becomes ``value + step`` (mod 2**width) in each cycle
    ``inc`` is high, or the ``load`` value.  ``next`` is the value after this cycle's
    count (comb), for owners that copy it.  Use ``elaborate(m)`` once, after the
    loads are declared."""

    def __init__(self, width: int, step: int = 1, name: str = "counter"):
        if not 0 <= step < 1 << width:
            raise ValueError(f"counter {name}: step {step} outside 0..2**{width}-1")
        self.width, self.step, self.name = width, step, name
        self.value = Signal(width, name=name)
        self.inc = Signal(name=f"{name}_inc")
        self.next = Signal(width, name=f"{name}_next")
        self._chunks = [(lo, min(width, lo + CHUNK_BITS)) for lo in range(0, width, CHUNK_BITS)]
        n = len(self._chunks)
        g0, p0 = self._flag_ints(0)                  # the flags of the reset value 0
        self._g = Signal(n, name=f"{name}_g", init=g0)   # chunk + step chunk overflows
        self._p = Signal(n, name=f"{name}_p", init=p0)   # ... or is all ones (passes a carry on)
        self._loads: list[tuple[Value, Value]] = []

    def _step_chunk(self, k: int) -> int:
        lo, hi = self._chunks[k]
        return (self.step >> lo) & ((1 << (hi - lo)) - 1)

    def _flag_ints(self, value: int) -> tuple[int, int]:
        g = p = 0
        for k, (lo, hi) in enumerate(self._chunks):
            total = ((value >> lo) & ((1 << (hi - lo)) - 1)) + self._step_chunk(k)
            g |= (total >= 1 << (hi - lo)) << k
            p |= (total == (1 << (hi - lo)) - 1) << k
        return g, p

    def _flags(self, value) -> tuple[Value, Value]:
        """(g, p) of a value, chunk by chunk: a compare of each chunk against constants."""
        value = Value.cast(value)
        g, p = [], []
        for k, (lo, hi) in enumerate(self._chunks):
            bits, c = hi - lo, self._step_chunk(k)
            chunk = value[lo:hi]
            g.append(chunk >= (1 << bits) - c if c else Const(0, 1))
            p.append(chunk == (1 << bits) - 1 - c)
        return Cat(*g), Cat(*p)

    def load(self, when, value) -> None:
        """Write ``value`` in the cycles ``when`` is high (the first load declared wins)."""
        self._loads.append((Value.cast(when), Value.cast(value)))

    def elaborate(self, m) -> None:
        # the carry into chunk k: some lower chunk generates and every chunk between passes
        carries = [Const(0, 1)]
        for k in range(1, len(self._chunks)):
            c = Const(0, 1)
            for j in range(k):
                term = self._g[j]
                for i in range(j + 1, k):
                    term = term & self._p[i]
                c = c | term
            carries.append(c)
        parts = []
        for k, (lo, hi) in enumerate(self._chunks):
            total = self.value[lo:hi] + self._step_chunk(k) + carries[k]
            parts.append(total[:hi - lo])
        m.d.comb += self.next.eq(Mux(self.inc, Cat(*parts), self.value))
        g_next, p_next = self._flags(self.next)
        chain = None
        for when, value in self._loads:
            g_load, p_load = self._flags(value)
            branch = (m.If if chain is None else m.Elif)(when)
            with branch:
                m.d.sync += [self.value.eq(value), self._g.eq(g_load), self._p.eq(p_load)]
            chain = True
        with (m.Else() if chain else m.If(1)):
            m.d.sync += [self.value.eq(self.next), self._g.eq(g_next), self._p.eq(p_next)]


def sparse_event_count(m: Module, event, name: str) -> Value:
    """A 32-bit count of ``event``, which is never high in two cycles in a row, as two
    16-bit halves: the high half steps on a flag registered from the low half, so no
    32-bit carry chain is in one cycle (the plain 32-bit increment of ``tokens`` was
    mapped as 14 levels of ANDs in model-small-sram's kda synthesis: -0.023 ns at 1 ns).
    The flag has caught up with the low half by the next event."""
    lo, hi, wrap = Signal(16, name=f"{name}_lo"), Signal(16, name=f"{name}_hi"), Signal(name=f"{name}_wrap")
    m.d.sync += wrap.eq(lo == 0xFFFF)
    with m.If(event):
        m.d.sync += lo.eq(lo + 1)
        with m.If(wrap):
            m.d.sync += hi.eq(hi + 1)
    return Cat(lo, hi)
