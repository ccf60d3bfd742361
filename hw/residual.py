"""The two-scale residual add, one element per cycle, over clock-derived stages.

Implements ``sim.models.int_ops.int_residual_add`` element by element:

    y = sat_resid(round_shift(a * m_a + b * m_b, s))

``a`` is the residual stream (resid_bits), ``b`` the branch output (int8
from KDA, resid_bits from MoE); (m_a, m_b, s) come from a ``QResidual`` and
are constants of the generated RTL.

The owner hands over both whole vectors (its registers and the block's held
output) and streams indices ``(valid, idx)``; ``(wr_en, wr_idx, wr_y)``
come out a fixed number of cycles later, so the owner can write the sum over
its own input.  The vectors are read one cycle after the index: the owner
keeps each element unchanged until its sum is written back.  The pipeline,
with registers placed by ``hw/pipeline.Pipe`` (the depth follows from the
clock period):

1. element select: the index decoded to a registered one-hot select, then
   an AND-OR over the elements.  Done here, not as an ``Array`` read in the
   owner, because a d-way mux in front of the multiply was the layer's
   worst path (issue 7);
2. both constant products as canonical-signed-digit words (one shifted,
   possibly inverted copy of the operand per non-zero digit) plus one
   constant word holding the rounding 2**(s-1) and the +1s of the inverted
   copies, reduced by a 3:2 tree to two words;
3. one carry-propagate add, split where the clock needs it;
4. the shift by ``s`` (wires) and the saturation, registered.
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.carry_save import pipelined_add, reduce_to_two, sign_extend
from hw.matvec import saturate
from hw.pipeline import Pipe, plan_pipeline


def csd_digits(k: int) -> list[tuple[int, int]]:
    """Canonical signed digits of ``k >= 0``: ``[(shift, +1 or -1)]`` with sum d * 2**shift == k.
    No two digits are adjacent, so a w-bit constant needs at most w/2 + 1 of them."""
    if k < 0:
        raise ValueError(f"csd_digits: {k} < 0")
    out, shift = [], 0
    while k:
        if k & 1:
            d = 2 - (k & 3)          # +1 when k = 1 mod 4, -1 when k = 3 mod 4
            out.append((shift, d))
            k -= d
        k >>= 1
        shift += 1
    return out


def constant_product_words(x, k: int, width: int) -> tuple[list, int]:
    """Words whose sum, plus the returned integer, is ``x * k`` modulo 2**width.

    ``x`` is signed.  A digit +1 at i is ``x << i``; a digit -1 is ``~(x << i)``
    (ones in the low i bits), whose missing +1 of the two's complement is
    counted in the returned integer, for the caller's one constant word."""
    words, ones = [], 0
    for shift, d in csd_digits(k):
        if shift >= width:
            continue
        word = sign_extend(x, width - shift)
        low = 0
        if d < 0:
            word, low, ones = ~word, (1 << shift) - 1, ones + 1
        words.append(Cat(Const(low, shift), word) if shift else word)
    return words, ones


class ResidualAdd(wiring.Component):
    def __init__(self, res, a_bits: int, b_bits: int, out_bits: int, n: int,
                 clock_period_ns: float = 1.0):
        self.m_a, self.m_b, self.s = int(res.m_a), int(res.m_b), int(res.s)
        if self.s < 0:
            raise ValueError(f"residual add: shift {self.s} < 0")
        if self.m_a < 0 or self.m_b < 0:
            raise ValueError(f"residual add: multipliers must be >= 0 (m_a {self.m_a}, m_b {self.m_b})")
        self.a_bits, self.b_bits, self.out_bits, self.n = a_bits, b_bits, out_bits, n
        self.clock_period_ns = clock_period_ns
        # a*m_a + b*m_b + 2**(s-1) in signed bits, and at least out_bits above the shift
        self.width = max(a_bits + self.m_a.bit_length(), b_bits + self.m_b.bit_length(),
                         self.s + out_bits) + 2
        super().__init__({
            "valid": In(1), "idx": In(range(n)),
            "a": In(data.ArrayLayout(signed(a_bits), n)), "b": In(data.ArrayLayout(signed(b_bits), n)),
            "wr_en": Out(1), "wr_idx": Out(range(n)), "wr_y": Out(signed(out_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        plan = plan_pipeline(self.clock_period_ns)
        d, w = plan.delays, self.width
        pipe = Pipe(m, plan, "res")
        # 1. element select.  The index is decoded and the one-hot select registered, so
        # each select bit drives one element's bits (a binary index into a mux tree fans
        # out to half the vector per bit: a buffer chain of 0.46 ns in the first tiny
        # run), then an AND-OR over the elements.  The vectors are read a cycle after
        # the index: the owner holds them (an element changes only when its sum is
        # written back, well after it was read)
        onehot = Signal(self.n, name="res_onehot")
        m.d.comb += onehot.eq(Cat(*(self.idx == i for i in range(self.n))))
        live = pipe.register({"valid": self.valid, "idx": self.idx, "sel": onehot})
        live = pipe.spend(d.mux_level, live)          # the AND
        sel = live.pop("sel")
        words = {"a": [Mux(sel[i], self.a[i], 0) for i in range(self.n)],
                 "b": [Mux(sel[i], self.b[i], 0) for i in range(self.n)]}
        level = 0
        while len(words["a"]) > 1:
            live = pipe.spend(d.mux_level, {**live, **words})   # one OR level
            words = {}
            for key in ("a", "b"):
                merged = []
                for j in range(0, len(live[key]), 2):
                    pair = live[key][j:j + 2]
                    sig = Signal.like(pair[0], name=f"res_or_{key}_l{level}_{j // 2}")
                    m.d.comb += sig.eq(pair[0] | pair[1] if len(pair) == 2 else pair[0])
                    merged.append(sig)
                words[key] = merged
            level += 1
        # 2. the product words.  The select and the product tree do not share a stage:
        # registers on the two selected operands are cheaper than on the many words
        live = pipe.register({**live, "a": words["a"][0], "b": words["b"][0]})
        words_a, ones_a = constant_product_words(live["a"], self.m_a, w)
        words_b, ones_b = constant_product_words(live["b"], self.m_b, w)
        rounding = (1 << (self.s - 1)) if self.s else 0
        const = Const((rounding + ones_a + ones_b) % (1 << w), w)
        live = {k: v for k, v in live.items() if k not in ("a", "b")}
        live = reduce_to_two(pipe, {**live, "words": words_a + words_b + [const]}, "words", w)
        s_word, c_word = live.pop("words")

        # 3. the carry-propagate add
        live = pipelined_add(pipe, {**live, "sum_s": s_word, "sum_c": c_word}, "sum_s", "sum_c", "total", w)

        # 4. shift by s (wires), saturate, register
        live = pipe.spend(d.saturate, live)
        total = live.pop("total")
        y = Signal(signed(self.out_bits), name="res_y")
        m.d.comb += y.eq(saturate(total[self.s:], self.out_bits))
        live = pipe.register({**live, "y": y})
        self.latency = pipe.stages
        m.d.comb += [self.wr_en.eq(live["valid"]), self.wr_idx.eq(live["idx"]), self.wr_y.eq(live["y"])]
        return m
