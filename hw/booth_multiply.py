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

from amaranth.hdl import Array, Cat, Const, Signal, Value, signed, unsigned

from hw.carry_save import booth_partial_products, pipelined_add, reduce_to_two, sign_extend, zero_extend
from hw.matvec import saturate


def booth_multiply(pipe, live: dict, multiplicand, multiplier, width: int, out_key: str,
                   extra_words=()) -> dict:
    """``live[out_key] = multiplicand * multiplier + sum(extra_words)`` modulo 2**width.

    Operands are read by their Amaranth shape (signed or unsigned), extra
    words are non-negative.  They are read in the CURRENT stage of ``pipe``
    and carried through any register this call inserts, so they must be
    values of that stage.  The result must fit ``width`` signed bits to be read back exact.
    """
    a, b = Value.cast(multiplicand), Value.cast(multiplier)
    if not a.shape().signed:      # the Booth multiplicand is taken as signed: a zero on top
        a = Cat(a, Const(0, 1))
    b_signed = b.shape().signed
    # the operands (not the Booth words) go through the register ``spend`` may insert,
    # so the digit decode and select are in the stage the plan charged them to;
    # constant addends stay wires (a register of a constant is just area)
    ops = [a, b] + [Value.cast(w) for w in extra_words]
    varying = {f"bm_{n}": v for n, v in enumerate(ops) if not isinstance(v, Const)}
    live = pipe.spend(pipe.plan.delays.booth_select, {**live, **varying})
    ops = [live.pop(f"bm_{n}") if f"bm_{n}" in varying else v for n, v in enumerate(ops)]
    words = booth_partial_products(pipe.m, ops[0], ops[1], width, multiplier_signed=b_signed,
                                   name=f"{pipe.name}_{out_key}")
    words += [zero_extend(w, width) for w in ops[2:]]
    live = {**live, "words": words}
    live = reduce_to_two(pipe, live, "words", width)
    s, c = live.pop("words")
    return pipelined_add(pipe, {**live, f"{out_key}_s": s, f"{out_key}_c": c},
                         f"{out_key}_s", f"{out_key}_c", out_key, width)


def requantise(pipe, live: dict, value, op_key: str, table, width: int, out_key: str) -> dict:
    """``live[out_key] = sat(rs(value * m_k, s_k), bits_k)`` for ``k = live[op_key]``.

    ``table`` lists ``(m, s, bits)`` per op code (m unsigned, s >= 0), the
    numerics of moekda.numerics.requantize.  The rounding constant 2**(s-1)
    is a word of the product's tree; the shift is a per-op choice of wires,
    folded with the saturation into one mux per op.  ``value`` is read in
    the current stage, like ``booth_multiply``'s operands; the result is
    signed ``max(bits)`` wide and not registered (the caller decides).
    """
    d = pipe.plan.delays
    select = d.mux_level * max(1, (len(table) - 1).bit_length())   # an op-indexed mux
    live = pipe.spend(select, {**live, "rq_value": value})
    op = live[op_key]
    mults = Array(Const(int(mm), unsigned(max(1, max(int(t[0]) for t in table).bit_length())))
                  for mm, _, _ in table)
    rnds = Array(Const((1 << (s - 1)) if s else 0, width) for _, s, _ in table)
    mult, rnd = Signal.like(mults[0], name=f"{pipe.name}_mult"), Signal(width, name=f"{pipe.name}_rnd")
    pipe.m.d.comb += [mult.eq(mults[op]), rnd.eq(rnds[op])]
    live = booth_multiply(pipe, live, live.pop("rq_value"), mult, width, "rq_p", extra_words=[rnd])
    live = pipe.spend(d.saturate + select, live)
    p = live.pop("rq_p")
    y = Signal(signed(max(int(b) for _, _, b in table)), name=f"{pipe.name}_{out_key}")
    with pipe.m.Switch(live[op_key]):
        for k, (_, s, bits) in enumerate(table):
            with pipe.m.Case(k):
                y_k = Signal(signed(int(bits)), name=f"{pipe.name}_{out_key}_sat{k}")
                pipe.m.d.comb += [y_k.eq(saturate(sign_extend(p[int(s):], width), int(bits))), y.eq(y_k)]
    return {**live, out_key: y}
