"""Multiply-add without long carry chains, for the MoE unit's requantisers.

Yosys maps ``a * b`` to a chain of adders, one per multiplier bit: far too
slow for one clock.  Here a product (plus any extra addends, e.g. the
rounding constant) is a list of partial products reduced by 3:2 carry-save
compressors to two words; the caller registers the pair and adds it in the
next stage, so each stage holds either a compressor tree or one adder.

All words are taken modulo 2**width: operands are sign-extended to width
first, so a result that fits ``width`` signed bits is exact.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Mux, Value


# Nangate45 planning delays (ns) of one 3:2 compressor level and of a register
# (clock-to-Q + setup + margin), as measured for hw/pipeline.py.
CSA_LEVEL_NS = 0.17
REGISTER_NS = 0.22


def csa_levels(clock_period_ns: float) -> int:
    """3:2 levels that fit one clock period, with a little room for the operand select."""
    return max(2, int((clock_period_ns - REGISTER_NS - 0.1) / CSA_LEVEL_NS))


def extend(value, width: int) -> Value:
    """``value`` sign- or zero-extended (by its shape) to ``width`` bits, as an unsigned word."""
    value = Value.cast(value)
    n = len(value)
    if n >= width:
        return value.as_unsigned()[:width]
    top = value[n - 1] if value.shape().signed else Const(0, 1)
    return Cat(value.as_unsigned(), top.replicate(width - n))


def partial_products(a, b, width: int) -> list[Value]:
    """Words whose sum mod 2**width is ``a * b`` (a, b signed or unsigned Values).

    Bit i of b selects ``a << i``; for a signed b the top bit weighs -2**i, and
    -x = ~x + 1, so it contributes the inverted word and a one.
    """
    a_w = extend(a, width)
    b = Value.cast(b)
    terms = []
    for i in range(len(b)):
        shifted = (a_w << i)[:width]
        if b.shape().signed and i == len(b) - 1:
            terms.append(Mux(b[i], ~shifted, 0)[:width])
            terms.append(extend(b[i], width))
        else:
            terms.append(Mux(b[i], shifted, 0)[:width])
    return terms


def const_products(a, k: int, width: int) -> list[Value]:
    """Words whose sum is ``a * k`` for a non-negative constant k (one word per set bit)."""
    a_w = extend(a, width)
    return [(a_w << i)[:width] for i in range(k.bit_length()) if (k >> i) & 1]


def carry_save(terms: list, width: int) -> tuple[Value, Value]:
    """Reduce words to two with the same sum mod 2**width (3:2 compressor levels)."""
    terms = [extend(t, width) for t in terms]
    if not terms:
        return Const(0, width), Const(0, width)
    while len(terms) > 2:
        nxt = []
        for i in range(0, len(terms) - 2, 3):
            x, y, z = terms[i:i + 3]
            nxt.append((x ^ y ^ z)[:width])
            nxt.append((((x & y) | (x & z) | (y & z)) << 1)[:width])
        nxt += terms[len(terms) - len(terms) % 3:]
        terms = nxt
    if len(terms) == 1:
        terms.append(Const(0, width))
    return terms[0], terms[1]


class Staged:
    """A value pipeline with a fixed number of register stages, and the
    control bits that must travel alongside (``ctl``: dict name -> Value).

    ``reduce(terms, width, levels)`` compresses the words with 3:2 levels,
    registering the live words every ``levels`` levels; ``add()`` registers
    the final carry-propagate sum.  ``delay(value)`` gives ``value`` delayed
    by the stages inserted so far, for control that was not in ``ctl``.
    """

    def __init__(self, m, name: str, ctl: dict):
        self.m, self.name, self.n = m, name, 0
        self.ctl = dict(ctl)

    def _reg(self, value, label):
        from amaranth.hdl import Signal
        value = Value.cast(value)
        r = Signal(value.shape(), name=f"{self.name}_{self.n}_{label}")
        self.m.d.sync += r.eq(value)
        return r

    def _wire(self, value, label):
        """A named net for ``value``: an expression used by several compressors
        would otherwise be repeated in each (exponential in the tree depth)."""
        from amaranth.hdl import Signal
        value = Value.cast(value)
        w = Signal(value.shape(), name=f"{self.name}_{self.n}_{label}")
        self.m.d.comb += w.eq(value)
        return w

    def register(self, words: list) -> list:
        self.n += 1
        self.ctl = {k: self._reg(v, k) for k, v in self.ctl.items()}
        return [self._reg(w, f"w{i}") for i, w in enumerate(words)]

    def reduce(self, terms: list, width: int, levels: int) -> tuple[Value, Value]:
        terms = [self._wire(extend(t, width), f"pp{i}") for i, t in enumerate(terms)]
        done = 0
        while len(terms) > 2:
            nxt = []
            for i in range(0, len(terms) - 2, 3):
                x, y, z = terms[i:i + 3]
                nxt.append((x ^ y ^ z)[:width])
                nxt.append((((x & y) | (x & z) | (y & z)) << 1)[:width])
            nxt += terms[len(terms) - len(terms) % 3:]
            done += 1
            terms = [self._wire(t, f"l{done}_{i}") for i, t in enumerate(nxt)]
            if done % levels == 0 and len(terms) > 2:
                terms = self.register(terms)
        if len(terms) == 1:
            terms.append(Const(0, width))
        s, c = self.register(terms)
        return s, c

    def add(self, s, c, shape) -> Value:
        width = len(Value.cast(s))
        (total,) = self.register([prefix_add(self.m, s, c, width, f"{self.name}_{self.n}_add")])
        from amaranth.hdl import Shape
        shape = Shape.cast(shape)
        return total[:shape.width].as_signed() if shape.signed else total[:shape.width]


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
