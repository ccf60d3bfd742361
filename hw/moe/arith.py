"""Small arithmetic of the MoE unit that hw/arith/carry_save.py does not cover.

``prefix_add``: (a + b) mod 2**width as a Kogge-Stone network (the route
unit's sums, the divider's trial subtraction, the counters' increments).
``chunked_counter``: an event counter whose increment never crosses a chunk
that fits one clock stage (hw/arith/pipeline.py), for the unit's performance
counters.  Products and requantisers are hw/arith/booth_multiply.py's and the
matrix-vector engine's (hw/arith/matvec.py).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Value


def extend(value, width: int) -> Value:
    """``value`` sign- or zero-extended (by its shape) to ``width`` bits, as an unsigned word."""
    value = Value.cast(value)
    n = len(value)
    if n >= width:
        return value.as_unsigned()[:width]
    top = value[n - 1] if value.shape().signed else Const(0, 1)
    return Cat(value.as_unsigned(), top.replicate(width - n))


def prefix_add(m, a, b, width: int, name: str = "add") -> Value:
    """(a + b) mod 2**width with a Kogge-Stone carry tree: log2(width) levels of
    AND-OR instead of the ripple chain the synthesis flow makes of ``a + b``.
    Each level is a named net so the expression does not repeat."""
    from amaranth.hdl import Signal
    a_w, b_w = extend(a, width), extend(b, width)

    def wire(value, label):
        w = Signal(width, name=f"{name}_{label}")
        m.d.comb += w.eq(value)
        return w

    p0 = wire(a_w ^ b_w, "p")
    g, p = wire(a_w & b_w, "g0"), p0
    dist, level = 1, 0
    while dist < width:
        level += 1
        g_sh = (g << dist)[:width]
        p_sh = Cat(Const((1 << dist) - 1, dist), p)[:width]   # ones shifted in: the identity
        g, p = wire(g | (p & g_sh), f"g{level}"), wire(p & p_sh, f"p{level}")
        dist *= 2
    carries = (g << 1)[:width]        # carry into bit i = group generate of bits 0..i-1
    return wire(p0 ^ carries, "sum")


def chunked_counter(m, plan, width: int, enable, name: str) -> Value:
    """A ``width``-bit event counter (+1 on each cycle ``enable`` is high) that meets the clock.

    The count is cut into chunks as wide as one stage's adder (``plan``,
    hw/arith/pipeline.py); a chunk steps when the chunk below wrapped in the
    previous cycle (a registered carry), so no carry chain crosses a chunk.
    The price: for ``chunks - 1`` cycles after a chunk wraps the upper
    chunks lag behind; a value read after the events stopped is exact.
    Reset clears it.
    """
    from amaranth.hdl import Signal
    chunk = plan.adder_chunk_bits()
    carry = Value.cast(enable)
    parts = []
    for lo in range(0, width, chunk):
        n = min(chunk, width - lo)
        part = Signal(n, name=f"{name}_count{lo}")
        with m.If(carry):
            m.d.sync += part.eq(prefix_add(m, part, 1, n, f"{name}_inc{lo}"))
        wrapped = Signal(name=f"{name}_wrap{lo}")
        m.d.sync += wrapped.eq(carry & (part == (1 << n) - 1))
        carry = wrapped
        parts.append(part)
    return Cat(*parts)
