"""A signed multiply (plus optional extra addends) spread over clock-derived stages.

The KDA's one-off products (the normaliser's x*x and x*m_r, rsqrt's Newton
products, y*m) were single-cycle ``*`` operators: a carry-propagate
multiplier that no clock above ~450 MHz fits.  Here the same product is the
Booth partial products of hw/arith/carry_save.py, a 3:2 tree and one split adder,
with registers placed by the ``Pipe`` the caller passes in (hw/arith/pipeline.py),
so the stage count follows from the clock period of the config.

Extra addends (a rounding constant 2**(s-1), say) become more words of the
same tree: the product and the rounding share one carry-propagate add.

Also the chip's one variable round-shift (``rounding_word`` + ``barrel_shift_saturate``:
the engine's requantiser in hw/arith/matvec.py, the KDA's requantisers, normaliser and
delta rule all use it) and ``requantise``, a requantiser whose (m, s) per op are
run-time inputs (the parameter bank, hw/image/param_map.py).
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Mux, Signal, Value, signed

from hw.arith.carry_save import (booth_partial_products, pipelined_add, reduce_to_two, sign_extend, static_booth_digits,
                            zero_extend)


def booth_multiply(pipe, live: dict, multiplicand, multiplier, width: int, out_key: str,
                   extra_words=(), digits=None) -> dict:
    """``live[out_key] = multiplicand * multiplier + sum(extra_words)`` modulo 2**width.

    Operands are read by their Amaranth shape (signed or unsigned), extra
    words are non-negative.  They are read in the CURRENT stage of ``pipe``
    and carried through any register this call inserts, so they must be
    values of that stage.  The result must fit ``width`` signed bits to be read back exact.
    ``digits``: the multiplier as Booth digits already decoded, (neg, one, two) per
    digit (hw.arith.carry_save.static_booth_digits); ``multiplier`` is then ignored.
    """
    a = Value.cast(multiplicand)
    if not a.shape().signed:      # the Booth multiplicand is taken as signed: a zero on top
        a = Cat(a, Const(0, 1))
    if digits is not None:
        b, b_signed = Cat(*(Cat(*d) for d in digits)), False
    else:
        b = Value.cast(multiplier)
        b_signed = b.shape().signed
    # the operands (not the Booth words) go through the register ``spend`` may insert,
    # so the digit decode and select are in the stage the plan charged them to;
    # constant addends stay wires (a register of a constant is just area)
    ops = [a, b] + [Value.cast(w) for w in extra_words]
    varying = {f"bm_{n}": v for n, v in enumerate(ops) if not isinstance(v, Const)}
    live = pipe.spend(pipe.plan.delays.booth_select, {**live, **varying})
    ops = [live.pop(f"bm_{n}") if f"bm_{n}" in varying else v for n, v in enumerate(ops)]
    given = None
    if digits is not None:
        given = [(ops[1][3 * i], ops[1][3 * i + 1], ops[1][3 * i + 2]) for i in range(len(digits))]
    words = booth_partial_products(pipe.m, ops[0], ops[1], width, multiplier_signed=b_signed,
                                   name=f"{pipe.name}_{out_key}", digits=given)
    words += [zero_extend(w, width) for w in ops[2:]]
    live = {**live, "words": words}
    live = reduce_to_two(pipe, live, "words", width)
    s, c = live.pop("words")
    return pipelined_add(pipe, {**live, f"{out_key}_s": s, f"{out_key}_c": c},
                         f"{out_key}_s", f"{out_key}_c", out_key, width)


def saturate(value, bits: int):
    """Signed ``value`` clamped to ``bits`` signed bits (moekda.numerics.saturate)."""
    value = Value.cast(value)
    hi, lo = (1 << (bits - 1)) - 1, -(1 << (bits - 1))
    top = value[bits - 1:]            # all equal to the sign bit exactly when value fits
    fits = (top == 0) | (top == (1 << len(top)) - 1)
    return Mux(fits, value[:bits].as_signed(), Mux(value[-1], Const(lo, signed(bits)), Const(hi, signed(bits))))


def rounding_word(shift, width: int) -> Value:
    """2**(s-1) for ``1 <= s <= width``, 0 for ``s == 0``: the rounding constant of a
    variable round-half-up shift as a one-hot decode of s-1, one more word of a tree."""
    s = Value.cast(shift)
    return Cat(*[s == k + 1 for k in range(width)])


def clamp_shift(shift, limit: int) -> Value:
    """``min(shift, limit)``: any shift from ``limit`` up gives the same result as ``limit``
    when the shifted value (with its rounding) fits ``limit + 1`` signed bits."""
    s = Value.cast(shift)
    if (1 << len(s)) - 1 <= limit:
        return s
    return Mux(s > limit, limit, s)


def barrel_shift_saturate(pipe, live: dict, value_key: str, shift, width: int, shift_bits: int,
                          out_key: str, out_widths=None, sel=None, fanout_levels: int = 0) -> dict:
    """``live[out_key] = sat_b(live[value_key] >> shift)`` (arithmetic shift).

    The one variable round-shift of the chip (the engine's requantiser, the KDA's
    requantisers, normaliser and delta rule): the rounding constant has already been
    added (``rounding_word`` in the product's tree), the shift is a barrel, one mux
    level per bit of the shift (its low ``shift_bits`` bits), each level charged to
    ``pipe`` (hw/arith/pipeline.py), so registers fall between levels where the clock needs.
    ``fanout_levels`` charges extra mux levels first (a shift bit steering a wide level).

    ``shift`` is a key of ``live`` (it travels with the value) or a value that is
    stable while the pipeline runs (a parameter register).  ``live[value_key]`` may be
    a list: lanes in lockstep, each shifted by the same amount, one level for all.
    ``out_widths``: None returns the shifted ``width``-bit word(s) unsaturated; one
    width saturates to it; several are saturated in parallel and ``sel`` (a key of
    ``live`` or a stable value) picks one: a mux level more.  The result is signed
    ``max(out_widths)`` bits (a list for lanes), not registered.
    """
    d = pipe.plan.delays
    m = pipe.m
    values = live.pop(value_key)
    lanes = isinstance(values, list)
    values = list(values) if lanes else [values]

    def amount_bit(live, bit):
        return Value.cast(live[shift] if isinstance(shift, str) else shift)[bit]
    if fanout_levels:
        live = pipe.spend(d.mux_level * fanout_levels, {**live, "bs_v": values})
        values = live.pop("bs_v")
    for bit in range(shift_bits):
        live = pipe.spend(d.mux_level, {**live, "bs_v": values})
        amount = 1 << bit
        nxt = []
        for n, v in enumerate(live.pop("bs_v")):
            v = Value.cast(v)
            moved = sign_extend(v[amount:], width) if amount < width else v[-1].replicate(width)
            s = Signal(width, name=f"{pipe.name}_{out_key}{n if lanes else ''}_shift{bit}")  # named: linear netlist
            m.d.comb += s.eq(Mux(amount_bit(live, bit), moved, v))
            nxt.append(s)
        values = nxt
    if out_widths is None:
        return {**live, out_key: values if lanes else values[0]}
    out_widths = [int(b) for b in out_widths]
    single = len(set(out_widths)) == 1
    # several widths: every width's clamp in parallel, then the pick: one mux level more
    live = pipe.spend(d.saturate + (0 if single else d.mux_level), {**live, "bs_v": values})
    outs = []
    for n, v in enumerate(live.pop("bs_v")):
        tag = f"{n}" if lanes else ""
        y = Signal(signed(max(out_widths)), name=f"{pipe.name}_{out_key}{tag}")
        if single:
            m.d.comb += y.eq(saturate(v, out_widths[0]))
        else:
            with m.Switch(live[sel] if isinstance(sel, str) else sel):
                for k, bits in enumerate(out_widths):
                    with m.Case(k):
                        y_k = Signal(signed(bits), name=f"{pipe.name}_{out_key}{tag}_sat{k}")
                        m.d.comb += [y_k.eq(saturate(v, bits)), y.eq(y_k)]
        outs.append(y)
    return {**live, out_key: outs if lanes else outs[0]}


def requantise(pipe, live: dict, value, op_key: str, table, width: int, out_key: str) -> dict:
    """``live[out_key] = sat(rs(value * m_k, s_k), bits_k)`` for ``k = live[op_key]``.

    ``table`` lists ``(m, s, bits)`` per op code, the numerics of
    moekda.numerics.requantize: ``m`` (unsigned) and ``s`` (>= 0) are run-time
    values (signals: the parameter bank, hw/image/param_map.py), ``bits`` a constant of
    the config.  The parameters are static while the unit runs: each op's m and
    clamped s are registered here once (a cycle behind their inputs, so no path
    runs from the bank through the op select into the product), then the op's
    pair is picked by an op-indexed mux.  The rounding constant 2**(s-1) is a
    one-hot word of the product's tree, the shift a barrel (``barrel_shift_saturate``),
    the saturation per op.  ``value * m`` must fit ``width - 2`` signed bits: a shift
    of ``width - 1`` or more then gives 0, as the model does.  ``value`` is read in
    the current stage, like ``booth_multiply``'s operands; the result is signed
    ``max(bits)`` wide and not registered (the caller decides).
    """
    d = pipe.plan.delays
    m = pipe.m
    limit = width - 1
    m_bits = max(len(Value.cast(mm)) if not isinstance(mm, int) else max(1, mm.bit_length()) for mm, _, _ in table)
    s_bits = max(len(Value.cast(ss)) if not isinstance(ss, int) else max(1, ss.bit_length()) for _, ss, _ in table)
    s_bits = min(s_bits, limit.bit_length())
    # each op's multiplier is decoded into Booth digits once, into registers: the op select
    # then picks digits, and no decode sits between it and the partial-product select
    # (small layer: the conv requantiser's select + decode + select was -0.048 ns at 1 ns)
    digit_sets, shifts = [], []
    for k, (mm, ss, _) in enumerate(table):
        mm = Const(mm, m_bits) if isinstance(mm, int) else Value.cast(mm)
        digit_sets.append(static_booth_digits(m, mm[:m_bits], False, f"{pipe.name}_m{k}"))
        sr = Signal(s_bits, name=f"{pipe.name}_s{k}", reset_less=True)
        m.d.sync += sr.eq(clamp_shift(ss, limit))
        shifts.append(sr)
    # an op-indexed mux, and a level for each selected digit's fan-out to a whole word
    select = d.mux_level * (max(1, (len(table) - 1).bit_length()) + 1)
    live = pipe.spend(select, {**live, "rq_value": value})
    op = live[op_key]
    n_digits = len(digit_sets[0])
    picked = Signal(3 * n_digits, name=f"{pipe.name}_digits")
    shift = Signal(s_bits, name=f"{pipe.name}_shift")
    m.d.comb += [picked.eq(Array(Cat(*(Cat(*t) for t in ds)) for ds in digit_sets)[op]),
                 shift.eq(Array(shifts)[op])]
    digits = [(picked[3 * i], picked[3 * i + 1], picked[3 * i + 2]) for i in range(n_digits)]
    # the one-hot rounding word is decoded beside the Booth select (both feed the tree)
    rnd = Signal(width, name=f"{pipe.name}_rnd")
    m.d.comb += rnd.eq(rounding_word(shift, width))
    live = {**live, "rq_shift": shift}
    live = booth_multiply(pipe, live, live.pop("rq_value"), None, width, "rq_p", extra_words=[rnd],
                          digits=digits)
    live = barrel_shift_saturate(pipe, live, "rq_p", "rq_shift", width, s_bits, out_key,
                                 [int(b) for _, _, b in table], sel=op_key)
    live.pop("rq_shift")
    return live
