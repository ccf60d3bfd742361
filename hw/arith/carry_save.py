"""Multiply and add without carry chains: Booth partial products, 3:2 trees.

All arithmetic here is on *words* of one common width ``width`` taken modulo
2**width: every operand is sign-extended to ``width`` first, so a sum that
fits in ``width`` signed bits comes out exact no matter how the carry-save
pair splits it.  The sign-extension bits of different words are copies of one
net, so synthesis merges the duplicated compressors; writing the tree at word
level keeps this file short without costing area.

Functions that span several pipeline stages take a ``Pipe`` (hw/arith/pipeline.py)
and a ``live`` dict of everything that must travel alongside.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Mux, Signal, Value


def sign_extend(value, width: int) -> Value:
    """``value`` (taken as signed) widened or truncated to ``width`` bits, as an unsigned word."""
    value = Value.cast(value)
    n = len(value)
    if n >= width:
        return value[:width]
    return Cat(value, value[n - 1].replicate(width - n))


def zero_extend(value, width: int) -> Value:
    value = Value.cast(value)
    return value[:width] if len(value) >= width else Cat(value, Const(0, width - len(value)))


def extend(value, width: int) -> Value:
    """``value`` widened or truncated to ``width`` bits by its own shape: sign-extended if it
    is signed, zero-extended if not (an unsigned word either way)."""
    value = Value.cast(value)
    return sign_extend(value, width) if value.shape().signed else zero_extend(value, width)


def booth_digits(multiplier, signed: bool) -> list[tuple[Value, Value, Value]]:
    """Radix-4 Booth recoding of ``multiplier``: per digit (neg, one, two).

    Digit i is -2*b[2i+1] + b[2i] + b[2i-1] in {-2..2}; ``one``/``two`` select
    the magnitude and ``neg`` its sign.  A digit of -0 (bits 111) has neg = 0,
    so a negated partial product never needs a +1 with a zero magnitude.
    An unsigned multiplier gets one zero bit on top so its last digit is >= 0.
    """
    b = Value.cast(multiplier)
    bits = b if signed else Cat(b, Const(0, 1))
    if len(bits) % 2:
        bits = Cat(bits, bits[-1])   # sign (or the zero on top) extended to a whole digit
    digits = []
    for i in range(len(bits) // 2):
        lo = bits[2 * i - 1] if i else Const(0, 1)
        b0, b1 = bits[2 * i], bits[2 * i + 1]
        one = b0 ^ lo
        two = (b1 & ~b0 & ~lo) | (~b1 & b0 & lo)
        neg = b1 & ~(b0 & lo)
        digits.append((neg, one, two))
    return digits


def static_booth_digits(m, multiplier, signed: bool, name: str) -> list[tuple[Value, Value, Value]]:
    """The Booth digits of a multiplier that changes rarely (a loaded parameter), decoded and
    registered once: ``booth_partial_products(..., digits=...)`` then selects straight from
    flip-flops, with no decode on the data path.  Read one cycle after the multiplier."""
    out = []
    for i, bits in enumerate(booth_digits(multiplier, signed)):
        reg = Signal(3, name=f"{name}_digit{i}", reset_less=True)   # neg, one, two
        m.d.sync += reg.eq(Cat(*bits))
        out.append((reg[0], reg[1], reg[2]))
    return out


def booth_partial_products(m, multiplicand, multiplier, width: int, multiplier_signed: bool = True,
                           name: str = "booth", digits=None) -> list[Value]:
    """Words whose sum modulo 2**width is ``multiplicand * multiplier``.

    ``multiplicand`` is signed.  Each digit selects 0, +-a or +-2a; a negative
    digit is the inverted magnitude plus a one at the digit's weight.  That
    one is tucked into the zero low bits of the NEXT partial product (which is
    shifted two places further), so only the last digit's one needs a word of
    its own, and that word is a single bit.  ``digits``: the multiplier's digits
    already decoded (``static_booth_digits``); ``multiplier`` is then ignored.
    """
    a = Signal(width, name=f"{name}_a")
    m.d.comb += a.eq(sign_extend(multiplicand, width))
    a2 = Cat(Const(0, 1), a)[:width]
    if digits is None:
        digits = []
        for i, bits in enumerate(booth_digits(multiplier, multiplier_signed)):
            sig = Signal(3, name=f"{name}_digit{i}")   # neg, one, two
            m.d.comb += sig.eq(Cat(*bits))
            digits.append((sig[0], sig[1], sig[2]))
    words = []
    prev_neg = None
    for i, (neg, one, two) in enumerate(digits):
        shift = 2 * i
        if shift >= width:
            break
        mag = Mux(one, a, 0) | Mux(two, a2, 0)
        pp = (mag ^ neg.replicate(width))[:width - shift]
        low = Const(0, shift)
        if prev_neg is not None:   # the previous digit's +1 sits at bit shift-2
            low = Cat(Const(0, shift - 2), prev_neg, Const(0, 1))
        words.append(Cat(low, pp)[:width])
        prev_neg = neg
    last_shift = 2 * (len(words) - 1)
    words.append(Cat(Const(0, last_shift), prev_neg)[:width] if last_shift < width else Const(0, width))
    return words


def compress_3_2(a, b, c, width: int) -> tuple[Value, Value]:
    """One full-adder per bit: a + b + c == sum + carry (mod 2**width)."""
    s = (a ^ b ^ c)[:width]
    cy = ((a & b) | (a & c) | (b & c))[:width]
    return s, Cat(Const(0, 1), cy)[:width]


def reduce_to_two(pipe, live: dict, key: str, width: int) -> dict:
    """Carry-save tree over the word list ``live[key]`` until two words remain.

    One tree level at a time, each spending ``csa_level`` of the stage
    budget, so registers fall between levels wherever the clock requires.
    """
    cost = pipe.plan.delays.csa_level
    words = list(live[key])
    while len(words) > 2:
        live = pipe.spend(cost, {**live, key: words})
        words = live[key]
        nxt = []
        for j in range(0, len(words) - 2, 3):
            nxt += compress_3_2(words[j], words[j + 1], words[j + 2], width)
        nxt += words[len(words) - len(words) % 3:]
        # name each level: keeps expressions linear in size (the simulator
        # does not share common subexpressions) and readable in waveforms
        words = []
        for j, value in enumerate(nxt):
            sig = Signal(width, name=f"{pipe.name}_{key}_l{pipe.levels}_{j}")
            pipe.m.d.comb += sig.eq(value)
            words.append(sig)
        pipe.levels += 1
    while len(words) < 2:
        words.append(Const(0, width))
    return {**live, key: words}


def prefix_add(m, a, b, carry_in=None, name="add", width=None) -> Value:
    """a + b (+ carry_in) with a Kogge-Stone carry network: log2(n) levels.

    Written out because the default adder mapping of Yosys is a ripple chain
    that ABC does not restructure (measured: a 16-bit add took 0.62 ns).
    Each prefix level is a named signal so the expression stays linear in
    size.  Returns len(a) + 1 bits (carry out on top).

    ``width``: the modular form, (a + b + carry_in) mod 2**width in ``width`` bits, each
    operand first extended by its shape (``extend``) -- for operands of different widths
    and signs (a counter's +1, a running sum).  The carry out is then unused and synthesis
    drops its logic.
    """
    if width is not None:
        return prefix_add(m, extend(a, width), extend(b, width), carry_in, name)[:width]
    a, b = Value.cast(a), Value.cast(b)
    n = len(a)
    cin = Const(0, 1) if carry_in is None else Value.cast(carry_in)
    # position 0 stands for the carry in (generate = cin, propagate = 0),
    # position i+1 for bit i
    g = Signal(n + 1, name=f"{name}_g0")
    p = Signal(n + 1, name=f"{name}_p0")
    m.d.comb += [g.eq(Cat(cin, a & b)), p.eq(Cat(Const(0, 1), a ^ b))]
    half = p[1:]
    dist, level = 1, 0
    while dist <= n:
        level += 1
        g_next = Signal(n + 1, name=f"{name}_g{level}")
        p_next = Signal(n + 1, name=f"{name}_p{level}")
        m.d.comb += [
            g_next.eq(Cat(g[:dist], g[dist:] | (p[dist:] & g[:n + 1 - dist]))),
            p_next.eq(Cat(p[:dist], p[dist:] & p[:n + 1 - dist])),
        ]
        g, p = g_next, p_next
        dist *= 2
    # g[i] is now the carry into bit i (position i = carry out of bit i-1)
    return Cat(half ^ g[:n], g[n])


def pipelined_add(pipe, live: dict, a_key: str, b_key: str, out_key: str, width: int) -> dict:
    """``live[out_key] = (live[a_key] + live[b_key]) mod 2**width``, split as the clock needs.

    When a ``width``-bit adder does not fit one stage it is cut into chunks of
    ``plan.adder_chunk_bits()``; each chunk's carry is registered into the
    next stage (the chunks already done travel along in ``live``).
    """
    d = pipe.plan.delays
    chunk = width if d.adder(width) <= pipe.plan.budget_ns else pipe.plan.adder_chunk_bits()
    done_key, carry_key = f"{out_key}_lo", f"{out_key}_carry"
    live = {**live, carry_key: Const(0, 1)}
    parts = []
    for lo in range(0, width, chunk):
        hi = min(width, lo + chunk)
        live = pipe.spend(d.adder(hi - lo), {**live, done_key: Cat(*parts) if parts else Const(0, 0)})
        parts = [live[done_key]] if lo else []
        a, b = Value.cast(live[a_key]), Value.cast(live[b_key])
        total = prefix_add(pipe.m, a[lo:hi], b[lo:hi], live[carry_key], name=f"{pipe.name}_{out_key}{lo}")
        parts.append(total[:hi - lo])
        live = {**live, carry_key: total[hi - lo]}
    out = dict(live)
    for k in (done_key, carry_key, a_key, b_key):
        out.pop(k)
    out[out_key] = Cat(*parts)
    return out


# ---- the same, over several independent operations side by side ---------------------
# Lanes of a datapath (the KDA delta rule's state_lanes) do the same arithmetic at the
# same time: their trees and adders must advance level by level together, so one Pipe
# stage holds the same level of every lane and a register cuts all lanes at once.

def reduce_all_to_two(pipe, live: dict, keys, widths) -> dict:
    """``reduce_to_two`` over every word list ``live[k]`` (``k`` in ``keys``, words
    ``widths[n]`` bits) in lockstep: one ``csa_level`` per level for all of them."""
    cost = pipe.plan.delays.csa_level
    widths = dict(zip(keys, widths))
    while any(len(live[k]) > 2 for k in keys):
        live = pipe.spend(cost, live)
        live = dict(live)
        for k in keys:
            words = list(live[k])
            if len(words) <= 2:
                continue
            nxt = []
            for j in range(0, len(words) - 2, 3):
                nxt += compress_3_2(words[j], words[j + 1], words[j + 2], widths[k])
            nxt += words[len(words) - len(words) % 3:]
            named = []
            for j, value in enumerate(nxt):
                sig = Signal(widths[k], name=f"{pipe.name}_{k}_l{pipe.levels}_{j}")
                pipe.m.d.comb += sig.eq(value)
                named.append(sig)
            live[k] = named
        pipe.levels += 1
    for k in keys:
        live[k] = list(live[k]) + [Const(0, widths[k])] * (2 - len(live[k]))
    return live


def pipelined_add_all(pipe, live: dict, jobs) -> dict:
    """``pipelined_add`` of every ``(a_key, b_key, out_key, width)`` in ``jobs`` side by
    side: chunk n of every sum sits in the same stage (one chunk width for all, so the
    slowest carry chain of the stage is one chunk)."""
    d = pipe.plan.delays
    widest = max(w for *_, w in jobs)
    chunk = widest if d.adder(widest) <= pipe.plan.budget_ns else pipe.plan.adder_chunk_bits()
    live = dict(live)
    for a_key, b_key, out_key, _ in jobs:
        live[f"{out_key}_lo"], live[f"{out_key}_carry"] = Const(0, 0), Const(0, 1)
    for lo in range(0, widest, chunk):
        live = dict(pipe.spend(d.adder(min(chunk, widest - lo)), live))
        for a_key, b_key, out_key, width in jobs:
            if lo >= width:
                continue
            hi = min(width, lo + chunk)
            a, b = Value.cast(live[a_key]), Value.cast(live[b_key])
            total = prefix_add(pipe.m, a[lo:hi], b[lo:hi], live[f"{out_key}_carry"],
                               name=f"{pipe.name}_{out_key}{lo}")
            live[f"{out_key}_lo"] = Cat(live[f"{out_key}_lo"], total[:hi - lo])
            live[f"{out_key}_carry"] = total[hi - lo]
    for a_key, b_key, out_key, _ in jobs:
        live[out_key] = live.pop(f"{out_key}_lo")
        for k in (f"{out_key}_carry", a_key, b_key):
            live.pop(k)
    return live
