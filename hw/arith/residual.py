"""The two-scale residual add, one element per cycle, over clock-derived stages.

Implements ``model.int_ops.int_residual_add`` element by element:

    y = sat_resid(round_shift(a * m_a + b * m_b, s))

``a`` is the residual stream (resid_bits), ``b`` the branch output (int8
from KDA, resid_bits from MoE); (m_a, m_b, s) come in on ``params`` (the
layout of hw/image/param_map.py's ``res1`` / ``res2`` fields: the chip's parameter
bank), so one netlist serves every model.  The parameters are static while
elements flow (the bank changes only at LOAD, with the chip idle): they are
registered once at the input (a cycle behind the bank) and read where they
are used, not carried through the pipeline registers.

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
2. both products as radix-4 Booth partial products (hw/arith/carry_save.py) plus
   one word holding the rounding 2**(s-1) (a one-hot decode of s - 1),
   reduced by a 3:2 tree to two words;
3. one carry-propagate add, split where the clock needs it;
4. the arithmetic shift by s (hw/arith/booth_multiply.py's barrel shifter, one
   mux level per bit of s; s is clamped to the sum's width, beyond which the
   result is 0 anyway) and the saturation, registered.
"""
from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import barrel_shift_saturate, clamp_shift, rounding_word
from hw.arith.carry_save import booth_partial_products, pipelined_add, reduce_to_two, static_booth_digits
from hw.image.param_map import SHIFT_BITS
from hw.arith.pipeline import Pipe, plan_pipeline


def residual_layout(mult_bits: int = 16, shift_bits: int = SHIFT_BITS) -> data.StructLayout:
    """The ``params`` port: hw/image/param_map.py's ``res1`` / ``res2`` fields (same shape)."""
    return data.StructLayout({"m_a": unsigned(mult_bits), "m_b": unsigned(mult_bits),
                              "s": unsigned(shift_bits)})


class ResidualAdd(wiring.Component):
    def __init__(self, a_bits: int, b_bits: int, out_bits: int, n: int, clock_period_ns: float,
                 mult_bits: int = 16, shift_bits: int = SHIFT_BITS):
        self.a_bits, self.b_bits, self.out_bits, self.n = a_bits, b_bits, out_bits, n
        self.mult_bits, self.shift_bits = mult_bits, shift_bits
        self.clock_period_ns = clock_period_ns
        # |a*m_a + b*m_b| < 2**(max(a, b) + mult_bits): ``sum_bits`` signed bits; one more
        # holds the rounding of a shift by sum_bits (a larger shift is clamped to it)
        self.sum_bits = max(a_bits, b_bits) + mult_bits + 1
        self.width = self.sum_bits + 1
        super().__init__({
            "valid": In(1), "idx": In(range(n)),
            "a": In(data.ArrayLayout(signed(a_bits), n)), "b": In(data.ArrayLayout(signed(b_bits), n)),
            "params": In(residual_layout(mult_bits, shift_bits)),
            "wr_en": Out(1), "wr_idx": Out(range(n)), "wr_y": Out(signed(out_bits)),
        })

    @classmethod
    def for_config(cls, cfg, b_bits: int, n: int) -> "ResidualAdd":
        """The layer's residual add of a ``b_bits`` branch: a and y are resid_bits wide."""
        from moekda.formats import formats_for
        fm = formats_for(cfg)
        return cls(fm.resid_bits, b_bits, fm.resid_bits, n, clock_period_ns=cfg.hw.clock_period_ns,
                   mult_bits=fm.mult_bits)

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
        # registers on the two selected operands are cheaper than on the many words.
        # The multipliers are static: their Booth digits decode outside the data path
        live = pipe.register({**live, "a": words["a"][0], "b": words["b"][0]})
        # The scales are static: registered once, a cycle behind the bank, with the
        # clamped shift and its rounding word decoded, so no path runs from the bank
        # through the decode into the tree; the Booth digits of the registered
        # multipliers are decoded outside the data path
        p = self.params
        shift = Signal(range(self.sum_bits + 1), name="res_shift", reset_less=True)
        rnd = Signal(w, name="res_rounding", reset_less=True)
        clamped = clamp_shift(p.s, self.sum_bits)
        m.d.sync += [shift.eq(clamped), rnd.eq(rounding_word(clamped, w))]
        # the multipliers' Booth digits decoded once into registers (a decode per element on
        # the data path was the tiny layer's worst path: -0.079 ns at 1.25 ns); each digit
        # still drives a whole word's select: its fan-out is charged as a mux level
        digits_a = static_booth_digits(m, p.m_a, False, "res_a")
        digits_b = static_booth_digits(m, p.m_b, False, "res_b")
        live = pipe.spend(d.booth_select + d.mux_level, live)
        words_a = booth_partial_products(m, live.pop("a"), None, w, name="res_a", digits=digits_a)
        words_b = booth_partial_products(m, live.pop("b"), None, w, name="res_b", digits=digits_b)
        live = reduce_to_two(pipe, {**live, "words": words_a + words_b + [rnd]}, "words", w)
        s_word, c_word = live.pop("words")

        # 3. the carry-propagate add
        live = pipelined_add(pipe, {**live, "sum_s": s_word, "sum_c": c_word}, "sum_s", "sum_c", "total", w)

        # 4. shift by s (barrel: hw/arith/booth_multiply.py's one variable round-shift), saturate, register
        # the shift travels with the value (a copy per stage, fewer fan-out buffers)
        live = barrel_shift_saturate(pipe, {**live, "res_s": shift}, "total", "res_s", w, len(shift), "y",
                                     out_widths=[self.out_bits])
        live.pop("res_s")
        y = live.pop("y")
        live = pipe.register({**live, "y": y})
        self.latency = pipe.stages
        m.d.comb += [self.wr_en.eq(live["valid"]), self.wr_idx.eq(live["idx"]), self.wr_y.eq(live["y"])]
        return m
