"""The int8 matrix-vector engine: L lanes of int8 x int8, int32 accumulate, requantise.

Every projection of the layer (KDA q/k/v/f/gate/beta/W_o, the router, the
experts) streams its weight rows through this engine.  model/matvec.py
is its specification; the cocotb bench compares the two bit for bit.

Interface (amaranth.lib.stream, valid/ready):

* ``i`` carries beats: ``w`` and ``x`` (``lanes`` signed int8 each), ``first``
  (start the accumulator from zero with this beat), ``last`` (emit a result
  after this beat), and ``mult``/``shift``, the requantisation pair, read
  only from the ``last`` beat.  Carrying (M, s) with ``last`` lets every row
  have its own scale (per-channel quantisation) at no cost in bandwidth that
  matters; other beats may carry anything there.  A dot product of any
  length C is ceil(C/L) beats, the last one zero-padded.
* ``o`` carries one result per ``last`` beat: ``y`` = requantize(acc, M, s)
  (int8, moekda/numerics.py) and ``acc``, the wrapped ``acc_bits`` sum, for
  consumers that need the wide value (the KDA state path).

``beat`` (out, one bit) is high for one cycle per beat the engine takes, one cycle
after it was taken (the input register's valid): ``lanes`` multiply-accumulates
each, padding lanes included; a performance counter (the chip's MACS) counts it.

Options (docs/matvec.md): several output widths chosen per row (``out_sel``),
a ``tag`` carried from the ``last`` beat to the result, ``requantise=False``
(accumulator only) and ``always_ready`` (no FIFO, for a consumer that never
stalls).  The defaults give exactly the interface above.

Structure: an input register, ``DotProduct`` (Booth partial products of all
lanes merged in one carry-save tree), ``Accumulator`` (carry-save, so the
loop is one full-adder deep), ``Requantiser`` (carry-save multiply, one
rounding add, shift, saturate) and an output FIFO.  The pipeline itself never
stalls: ``i.ready`` is a registered credit check that admits a beat only if
the FIFO is sure to have room for every result in flight.  So back-pressure
costs no enable on the datapath registers, and no path runs combinationally
from ``o.ready`` to ``i.ready``.

Reset (the domain's synchronous reset) drops everything in flight: partial
sums, results not yet taken, the FIFO.  The cycle after reset the engine
is empty with ``i.ready`` low; it rises one cycle later.  A beat that a
producer was offering during reset is not taken; the accumulator restarts
from zero.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw.arith.booth_multiply import barrel_shift_saturate, rounding_word, saturate  # noqa: F401 (saturate: re-exported)
from hw.arith.carry_save import booth_partial_products, compress_3_2, pipelined_add, reduce_to_two, sign_extend
from hw.arith.pipeline import Pipe, PipelinePlan, plan_pipeline


def port_groups(vec, lanes: int, bits: int) -> list:
    """A vector of signed ``bits``-wide values cut into ``lanes``-wide groups, zero-padded:
    the engine's ``x`` for each beat of a row (one weight-port beat per engine beat)."""
    return [Cat(*[vec[g * lanes + k] if g * lanes + k < len(vec) else Const(0, signed(bits))
                  for k in range(lanes)]) for g in range(-(-len(vec) // lanes))]


class MatVecFormats:
    """The widths the engine needs, from a Config (one source of truth)."""

    def __init__(self, lanes: int, act_bits: int = 8, weight_bits: int = 8, acc_bits: int = 32,
                 mult_bits: int = 16, *, clock_period_ns: float, out_widths=None, tag_shape=None):
        """``clock_period_ns``: the config's hw.clock_period_ns, which sets the pipeline depth (no
        default: a caller that forgets it must fail, not get some other clock's pipeline).
        ``out_widths``: the signed widths a row may be saturated to, chosen per row by the
        beat's ``out_sel`` (index into the tuple); default one width, ``act_bits``, and no
        ``out_sel`` field.  ``tag_shape``: a value carried from a row's ``last`` beat to its
        result (``tag``), for consumers that route results by it; default none."""
        self.lanes = lanes
        self.act_bits = act_bits
        self.weight_bits = weight_bits
        self.acc_bits = acc_bits
        self.mult_bits = mult_bits
        self.out_widths = tuple(out_widths) if out_widths else (act_bits,)
        if any(not 2 <= w <= acc_bits + mult_bits for w in self.out_widths):
            raise ValueError(f"engine output widths {self.out_widths}: each must be 2 to acc_bits + mult_bits")
        self.out_bits = max(self.out_widths)
        self.tag_shape = tag_shape
        # acc * M needs acc_bits + mult_bits signed bits; any larger shift gives 0
        # (see Requantiser), so the shift field only has to count up to that.
        self.product_bits = acc_bits + mult_bits
        if self.product_bits + 1 > 62:
            # the hardware would be fine; its specification would not
            raise ValueError(f"formats.acc_bits + formats.requant_mult_bits = {self.product_bits}: at most 61 "
                             "(moekda.numerics.requantize, the model, computes in int64)")
        self.shift_bits = ceil_log2(self.product_bits + 1)
        # one beat's dot product: L products of at most 2**(a+w-2) magnitude
        self.dot_bits = act_bits + weight_bits + ceil_log2(lanes)
        self.clock_period_ns = clock_period_ns

    @classmethod
    def from_config(cls, cfg, out_widths=None, tag_shape=None) -> "MatVecFormats":
        f = cfg.formats
        return cls(lanes=cfg.hw.lanes, act_bits=f.act_bits, weight_bits=f.weight_bits,
                   acc_bits=f.acc_bits, mult_bits=f.requant_mult_bits,
                   clock_period_ns=cfg.hw.clock_period_ns, out_widths=out_widths, tag_shape=tag_shape)

    def row_fields(self) -> dict:
        """What a row's ``last`` beat tells the back end: (M, s), and if configured the
        output width selector and the tag."""
        fields = {"mult": unsigned(self.mult_bits), "shift": unsigned(self.shift_bits)}
        if len(self.out_widths) > 1:
            fields["out_sel"] = unsigned(ceil_log2(len(self.out_widths)))
        if self.tag_shape is not None:
            fields["tag"] = self.tag_shape
        return fields

    def beat_layout(self) -> data.StructLayout:
        return data.StructLayout({
            "w": data.ArrayLayout(signed(self.weight_bits), self.lanes),
            "x": data.ArrayLayout(signed(self.act_bits), self.lanes),
            "first": unsigned(1),
            "last": unsigned(1),
            **self.row_fields(),
        })

    def scale_layout(self) -> data.StructLayout:
        """The per-row fields of one result: (M, s) [, out_sel] [, tag]."""
        return data.StructLayout(self.row_fields())

    def framing_layout(self) -> data.StructLayout:
        """What travels with a beat's data down the pipeline."""
        return data.StructLayout({"first": unsigned(1), "last": unsigned(1), "scale": self.scale_layout()})

    def result_layout(self) -> data.StructLayout:
        fields = {"y": signed(self.out_bits), "acc": signed(self.acc_bits)}
        if self.tag_shape is not None:
            fields["tag"] = self.tag_shape
        return data.StructLayout(fields)


def _dry_build_stages(block) -> int:
    """Stage count of a Pipe-built block, from a build that is then thrown away."""
    module, stages = block._build()
    module._MustUse__silence = True   # built only to count stages, never elaborated
    return stages


class DotProduct(wiring.Component):
    """Sum of ``lanes`` signed products, pipelined; ``tag`` travels alongside.

    All lanes' Booth partial products go into ONE carry-save tree (rather
    than a multiplier per lane and an adder tree after) so there is a single
    carry-propagate add at the end.  Latency is ``self.latency`` cycles.
    """

    def __init__(self, fmt: MatVecFormats, plan: PipelinePlan, tag_shape):
        self.fmt, self.plan = fmt, plan
        super().__init__({
            "valid": In(1), "tag": In(tag_shape),
            "w": In(data.ArrayLayout(signed(fmt.weight_bits), fmt.lanes)),
            "x": In(data.ArrayLayout(signed(fmt.act_bits), fmt.lanes)),
            "out_valid": Out(1), "out_tag": Out(tag_shape), "dot": Out(signed(fmt.dot_bits)),
        })
        # the stage count (latency) is needed before elaboration: a dry build
        self.latency = _dry_build_stages(self)

    def _build(self):
        m = Module()
        width = self.fmt.dot_bits
        pipe = Pipe(m, self.plan, "dot")
        words = []
        for lane in range(self.fmt.lanes):
            words += booth_partial_products(m, self.w[lane], self.x[lane], width, multiplier_signed=True,
                                            name=f"lane{lane}")
        live = {"valid": self.valid, "tag": self.tag.as_value()}
        live = pipe.spend(self.plan.delays.booth_select, {**live, "words": words})
        live = reduce_to_two(pipe, live, "words", width)
        sum_, carry = live.pop("words")
        live = pipelined_add(pipe, {**live, "s": sum_, "c": carry}, "s", "c", "dot", width)
        live = pipe.register(live)   # a clean register boundary towards the accumulator
        m.d.comb += [self.out_valid.eq(live["valid"]), self.out_tag.eq(live["tag"]), self.dot.eq(live["dot"])]
        return m, pipe.stages

    def elaborate(self, platform):
        return self._build()[0]


class Accumulator(wiring.Component):
    """Carry-save accumulator: the loop is one full adder deep at any width.

    On a valid beat: (sum, carry) <- (first ? 0 : (sum, carry)) + dot.  The
    pair is resolved downstream only for the beats that emit (``last``).
    Latency 1; outputs hold the pair right after the beat was added.
    """

    def __init__(self, fmt: MatVecFormats):
        self.fmt = fmt
        self.latency = 1
        super().__init__({
            "valid": In(1), "framing": In(fmt.framing_layout()), "dot": In(signed(fmt.dot_bits)),
            "out_valid": Out(1), "out_scale": Out(fmt.scale_layout()),
            "acc_sum": Out(fmt.acc_bits), "acc_carry": Out(fmt.acc_bits),
        })

    def elaborate(self, platform):
        m = Module()
        width = self.fmt.acc_bits
        keep = ~self.framing.first.replicate(width)
        s_next, c_next = compress_3_2(self.acc_sum & keep, self.acc_carry & keep,
                                      sign_extend(self.dot, width), width)
        # the output ports are the registers: the running pair is state that
        # reset clears; out_valid marks the cycle after a `last` beat was added
        with m.If(self.valid):
            m.d.sync += [self.acc_sum.eq(s_next), self.acc_carry.eq(c_next)]
        m.d.sync += [self.out_valid.eq(self.valid & self.framing.last), self.out_scale.eq(self.framing.scale)]
        return m


class _ResultStage(wiring.Component):
    """The engine's back end after the accumulator: the carry-save pair in, ``y`` and
    ``acc`` out.  Subclasses give ``_build() -> (module, stages)``; the latency is
    counted from a dry build so the engine's FIFO depth follows the real pipeline."""

    def __init__(self, fmt: MatVecFormats, plan: PipelinePlan):
        self.fmt, self.plan = fmt, plan
        ports = {
            "valid": In(1), "acc_sum": In(fmt.acc_bits), "acc_carry": In(fmt.acc_bits),
            "scale": In(fmt.scale_layout()),
            "out_valid": Out(1), "y": Out(signed(fmt.out_bits)), "acc": Out(signed(fmt.acc_bits)),
        }
        if fmt.tag_shape is not None:
            ports["tag"] = Out(fmt.tag_shape)
        super().__init__(ports)
        self.latency = _dry_build_stages(self)

    def _tag(self) -> dict:
        """The row's tag as a live value (empty without one): it rides the back end's stages."""
        return {} if self.fmt.tag_shape is None else {"tag": Value.cast(self.scale.tag)}

    @staticmethod
    def _tag_of(live: dict) -> dict:
        return {"tag": live["tag"]} if "tag" in live else {}

    def _outputs(self, m, live: dict):
        m.d.comb += [self.out_valid.eq(live["valid"]), self.acc.eq(live["acc"])]
        if "y" in live:
            m.d.comb += self.y.eq(live["y"])
        if self.fmt.tag_shape is not None:
            m.d.comb += Value.cast(self.tag).eq(live["tag"])

    def elaborate(self, platform):
        return self._build()[0]


class Requantiser(_ResultStage):
    """y = sat8((acc * M + 2**(s-1)) >> s), s = 0: sat8(acc * M); also passes acc on.

    With several ``out_widths`` the row's ``out_sel`` picks the saturation width
    (sat_b instead of sat8) and ``y`` is the result sign-extended to ``out_bits``.

    The accumulator arrives in carry-save form and is resolved first (it is
    an output too).  acc * M is a Booth carry-save multiply in which the
    rounding constant 2**(s-1) is just one more word of the tree, so one
    carry-propagate add does both.  The product has ``product_bits`` signed
    bits; one more bit holds the rounding.  A shift s >= product_bits gives
    y = 0 exactly as the formula does, so s is clamped to product_bits.
    """

    def _build(self):
        m = Module()
        f, d = self.fmt, self.plan.delays
        pipe = Pipe(m, self.plan, "rq")
        width = f.product_bits + 1
        shift = Mux(self.scale.shift > f.product_bits, f.product_bits, self.scale.shift)
        live = {"valid": self.valid, "mult": self.scale.mult, "shift": shift,
                "s": self.acc_sum, "c": self.acc_carry, **self._tag()}
        if len(f.out_widths) > 1:
            live["out_sel"] = self.scale.out_sel
        live = pipelined_add(pipe, live, "s", "c", "acc", f.acc_bits)
        live = pipe.spend(d.booth_select, live)
        # 2**(s-1) for s >= 1, nothing for s == 0: one-hot decode of s-1.  Taken
        # from live AFTER spend(): a value from before a register boundary
        # would belong to the previous beat.
        rounding = Signal(width, name="rq_rounding")
        m.d.comb += rounding.eq(rounding_word(live["shift"], width))
        words = booth_partial_products(m, live["acc"], live["mult"], width, multiplier_signed=False,
                                       name="rq")
        live = reduce_to_two(pipe, {**live, "words": words + [rounding]}, "words", width)
        p_sum, p_carry = live.pop("words")
        live = pipelined_add(pipe, {**live, "ps": p_sum, "pc": p_carry}, "ps", "pc", "p", width)
        # arithmetic right shift by s, one barrel level per bit of s, and the saturation
        # (per row's out_sel with several widths): the shared helper of hw/arith/booth_multiply.py
        # several widths: the shift bits also steer the parallel saturations, and ABC buffered
        # the first level's select as four BUFs (model-small-mla's MLA engine, -0.030 ns at
        # 1 ns): one mux level more is charged for it.  One width (MoE, head): as before.
        live = barrel_shift_saturate(pipe, live, "p", "shift", width, f.shift_bits, "y", f.out_widths,
                                     sel="out_sel" if len(f.out_widths) > 1 else None,
                                     fanout_levels=1 if len(f.out_widths) > 1 else 0)
        y = live.pop("y")
        live = pipe.register({"valid": live["valid"], "acc": live["acc"], "y": y, **self._tag_of(live)})
        self._outputs(m, live)
        return m, pipe.stages


class AccResolver(_ResultStage):
    """The accumulator-only back end: the carry-save pair resolved, ``y`` = 0.

    For a consumer that requantises the wide ``acc`` itself (the KDA unit adds
    a bias first): no Booth multiply, no shift, no saturation.  Same ports and
    stream protocol as ``Requantiser``; the pair's add is split as the clock needs.
    """

    def _build(self):
        m = Module()
        pipe = Pipe(m, self.plan, "acc")
        live = {"valid": self.valid, "s": self.acc_sum, "c": self.acc_carry, **self._tag()}
        live = pipe.register(pipelined_add(pipe, live, "s", "c", "acc", self.fmt.acc_bits))
        self._outputs(m, live)
        return m, pipe.stages


class MatVecEngine(wiring.Component):
    """L-lane int8 matrix-vector engine with stream in/out; see the module docstring."""

    def __init__(self, cfg_or_fmt, requantise: bool = True, always_ready: bool = False):
        """``requantise=False``: results carry only ``acc`` (``y`` = 0; ``mult``/``shift``
        are ignored) and the requantiser is not built (``AccResolver`` instead).

        ``always_ready=True``: for a consumer that takes every result the cycle it
        appears (a fixed pipeline that never stalls).  Both streams are then
        ``always_ready``: no result FIFO and no credit counter are built, ``i.ready``
        is constant 1 (also right after reset) and a result leaves ``latency`` cycles
        after its ``last`` beat was taken."""
        fmt = cfg_or_fmt if isinstance(cfg_or_fmt, MatVecFormats) else MatVecFormats.from_config(cfg_or_fmt)
        self.fmt = fmt
        self.always_ready = always_ready
        self.plan = plan_pipeline(fmt.clock_period_ns)
        super().__init__({
            "i": In(stream.Signature(fmt.beat_layout(), always_ready=always_ready)),
            "o": Out(stream.Signature(fmt.result_layout(), always_ready=always_ready)),
            "beat": Out(1),
        })
        self.dot = DotProduct(fmt, self.plan, fmt.framing_layout())
        self.acc = Accumulator(fmt)
        self.rq = Requantiser(fmt, self.plan) if requantise else AccResolver(fmt, self.plan)
        # beat register + the three blocks; it sets the FIFO depth
        self.latency = 1 + self.dot.latency + self.acc.latency + self.rq.latency
        # every result that can be in flight, plus one cycle for the credit
        # to come back, so a consumer that is always ready sees full throughput
        self.fifo_depth = 0 if always_ready else self.latency + 2

    def elaborate(self, platform):
        m = Module()
        f = self.fmt
        m.submodules.dot_product = dot = self.dot
        m.submodules.accumulator = acc = self.acc
        m.submodules.requantiser = rq = self.rq

        if self.always_ready:
            take = self.i.valid
        else:
            m.submodules.result_fifo = fifo = SyncFIFO(width=f.result_layout().size, depth=self.fifo_depth)
            # credits: results accepted but not yet handed out; i.ready is a register
            outstanding = Signal(range(self.fifo_depth + 1))
            ready = Signal()
            take = self.i.valid & ready
            emits = take & self.i.p.last
            gives = fifo.r_en & fifo.r_rdy
            nxt = outstanding + emits - gives
            m.d.sync += [outstanding.eq(nxt), ready.eq(nxt < self.fifo_depth)]
            m.d.comb += self.i.ready.eq(ready)

        # input register: the ports see one flip-flop, nothing else
        w = Signal.like(self.i.p.w, name="w_q", reset_less=True)
        x = Signal.like(self.i.p.x, name="x_q", reset_less=True)
        framing = Signal(f.framing_layout(), name="framing_q", reset_less=True)
        beat_valid = Signal(name="beat_valid_q")
        p = self.i.p
        m.d.sync += [beat_valid.eq(take), w.eq(p.w), x.eq(p.x),
                     framing.first.eq(p.first), framing.last.eq(p.last)]
        m.d.sync += [getattr(framing.scale, name).eq(getattr(p, name)) for name in f.row_fields()]

        m.d.comb += [dot.valid.eq(beat_valid), dot.w.eq(w), dot.x.eq(x), dot.tag.eq(framing)]
        m.d.comb += self.beat.eq(beat_valid)     # a beat in the MAC lanes (performance counters)
        m.d.comb += [acc.valid.eq(dot.out_valid), acc.framing.eq(dot.out_tag), acc.dot.eq(dot.dot)]
        m.d.comb += [rq.valid.eq(acc.out_valid), rq.acc_sum.eq(acc.acc_sum), rq.acc_carry.eq(acc.acc_carry),
                     rq.scale.eq(acc.out_scale)]
        result = Signal(f.result_layout())
        m.d.comb += [result.y.eq(rq.y), result.acc.eq(rq.acc)]
        if f.tag_shape is not None:
            m.d.comb += Value.cast(result.tag).eq(Value.cast(rq.tag))
        if self.always_ready:
            m.d.comb += [self.o.valid.eq(rq.out_valid), self.o.p.eq(result)]
        else:
            m.d.comb += [fifo.w_en.eq(rq.out_valid), fifo.w_data.eq(result),
                         self.o.valid.eq(fifo.r_rdy), self.o.p.eq(fifo.r_data), fifo.r_en.eq(self.o.ready)]
        return m
