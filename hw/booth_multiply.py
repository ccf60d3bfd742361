"""A signed multiply (plus optional extra addends) spread over clock-derived stages.

The KDA's one-off products (the normaliser's x*x and x*m_r, rsqrt's Newton
products, y*m) were single-cycle ``*`` operators: a carry-propagate
multiplier that no clock above ~450 MHz fits.  Here the same product is the
Booth partial products of hw/carry_save.py, a 3:2 tree and one split adder,
with registers placed by the ``Pipe`` the caller passes in (hw/pipeline.py),
so the stage count follows from the clock period of the config.

Extra addends (a rounding constant 2**(s-1), say) become more words of the
same tree: the product and the rounding share one carry-propagate add.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Value

from hw.carry_save import booth_partial_products, pipelined_add, reduce_to_two, zero_extend


def booth_multiply(pipe, live: dict, multiplicand, multiplier, width: int, out_key: str,
                   extra_words=()) -> dict:
    """``live[out_key] = multiplicand * multiplier + sum(extra_words)`` modulo 2**width.

    Operands are read by their Amaranth shape (signed or unsigned), extra
    words are non-negative.  They are read in the CURRENT stage of ``pipe``
    (before any register this call inserts), so they must be values of that
    stage.  The result must fit ``width`` signed bits to be read back exact.
    """
    a, b = Value.cast(multiplicand), Value.cast(multiplier)
    if not a.shape().signed:      # the Booth multiplicand is taken as signed: a zero on top
        a = Cat(a, Const(0, 1))
    words = booth_partial_products(pipe.m, a, b, width, multiplier_signed=b.shape().signed,
                                   name=f"{pipe.name}_{out_key}")
    words += [zero_extend(w, width) for w in extra_words]
    live = pipe.spend(pipe.plan.delays.booth_select, {**live, "words": words})
    live = reduce_to_two(pipe, live, "words", width)
    s, c = live.pop("words")
    return pipelined_add(pipe, {**live, f"{out_key}_s": s, f"{out_key}_c": c},
                         f"{out_key}_s", f"{out_key}_c", out_key, width)
