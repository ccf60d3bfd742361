"""Small arithmetic of the MoE unit that hw/arith/carry_save.py does not cover.

``chunked_counter``: an event counter whose increment never crosses a chunk
that fits one clock stage (hw/arith/pipeline.py), for the unit's performance
counters.  Products and requantisers are hw/arith/booth_multiply.py's and the
matrix-vector engine's (hw/arith/matvec.py).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Value

from hw.arith.carry_save import prefix_add


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
            m.d.sync += part.eq(prefix_add(m, part, 1, name=f"{name}_inc{lo}", width=n))
        wrapped = Signal(name=f"{name}_wrap{lo}")
        m.d.sync += wrapped.eq(carry & (part == (1 << n) - 1))
        carry = wrapped
        parts.append(part)
    return Cat(*parts)
