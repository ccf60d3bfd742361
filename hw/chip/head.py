"""The model chip's head: x_L in, the next token id (and, on request, the logits) out (issue 14).

Implements ``model.int_model.int_head_step`` and ``int_argmax`` bit for bit:

    fn_u   = int_rmsnorm(x_L, final_norm)                    int8
    fn     = sat8(round_shift(fn_u * norm_w, norm_w_shift))  int8
    logits = requantize(W @ fn, head_m, head_s, resid_bits)  W = lm_head (V x d int8), or the embedding when tied
    next   = the lowest index of the largest logit

Every per-model value comes in on ``params`` (the head's block of the parameter bank,
hw/image/param_map.py ``head_param_fields``; a test drives ``region_value(cfg, flat, "head",
mixer="head")``), W from the weight memory (``lm_head``, or ``embedding`` when tied), so one
netlist serves every model of the config.  ``params`` must be stable while tokens are inside.

Ports
-----
``x``         stream, one beat per token: x_L, d_model x resid_bits signed.
``logits_en`` sampled with each token on ``x`` (the cycle it transfers): when high, all V logits
              of that token go out on ``logits`` (and the head waits for them); when low,
              none do and the head never looks at ``logits.ready``.
``next``      stream, one beat per token: ``token`` (``token_bits``) and ``logit`` (resid_bits
              signed), the argmax and its value.  From registers.
``logits``    stream, one beat per logit of an enabled token: ``index`` (0 .. V-1, in order) and
              ``value`` (resid_bits signed).  Through a register slice (hw/stream/skid.py): valid,
              payload and the ready it answers are flops.
``wport``     weight port (hw/stream/weight_port.py): per token V rows of beats_per_row(d) beats,
              the region read in one request (cut where the 16-bit ``beats`` field needs).
``params``    ``param_layout(cfg, "head", mixer="head")``.
``mac_beat``  the engine's ``beat``: one beat of hw.lanes MACs (the chip's MACS counter).

Schedule of one token
---------------------
1. x_L is taken into a register (``x.ready`` is its empty flag), so the producer is free at once.
2. The final RMSNorm (hw/kda/norm.py ``Normalizer``, as the layer's norm1/norm2) reads it by index
   and writes fn_u element by element into the product fn_u * norm_w[n] + 2**(s-1) (Booth tree),
   the barrel shift and the int8 saturation (hw/arith/booth_multiply.py), stages placed by the
   clock (hw/arith/pipeline.py); fn lands in its own register.  x's register is free again.
3. With fn complete the weight read goes out, and every response beat is one beat of ONE
   matrix-vector engine (hw/arith/matvec.py, requantised to resid_bits by (head_m, head_s),
   the token's logits_en as its row tag): rows in order, so a counter names each result.
4. Each result passes a register, where the running argmax takes it (replace the best only on
   a strictly larger value: the lowest index wins a tie) and, for an enabled token, the logits
   slice; after row V-1 the winner goes to ``next``.  The engine's output FIFO and its credit
   check hold the weight beats back while ``logits`` (enabled) or ``next`` is not taken.

Cycles per token
----------------
The port's bound is V * beats_per_row(d) beats at one per cycle (model-tiny 64 x 4 = 256,
model-small 256 x 4 = 1 024).  The RMSNorm needs all of x_L before its first output (2 passes
over d plus rsqrt), and the next token's RMSNorm starts only when the last beat of the current
token's fn entered the engine (fn has one register), so per token, tokens back to back without
stalls: RMSNorm + V * beats_per_row + 6..8 (the norm-weight stages, the request, the memory
latency); the engine's pipeline and the argmax overlap the next RMSNorm.  Measured (Icarus,
sim/cocotb/tb_head.py): model-tiny 355 = 256 + 93 + 6, model-small 1 239 = 1 024 + 207 + 8;
one token's latency, x taken to ``next`` offered, 369 and 1 257.  In the model chip the head
runs once per token after L layers of thousands of cycles, so a second fn register (the
RMSNorm under the previous token's beats) would buy nothing there and is not built.
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect
from amaranth.utils import ceil_log2

from hw.arith.booth_multiply import barrel_shift_saturate, booth_multiply, clamp_shift, rounding_word
from hw.arith.matvec import MatVecEngine, MatVecFormats
from hw.arith.pipeline import Pipe, plan_pipeline
from hw.chip.embed import require_vocab, token_bits
from hw.stream.skid import SkidBuffer
from hw.stream.weight_port import WeightPortSignature, split_request
from hw.image.memory_map import memory_map
from hw.image.param_map import head_param_fields, param_layout
from hw.kda.norm import Normalizer
from moekda.config import ConfigError
from moekda.formats import derived_widths, formats_for


def next_layout(cfg) -> data.StructLayout:
    return data.StructLayout({"token": token_bits(cfg), "logit": signed(formats_for(cfg).resid_bits)})


def logit_layout(cfg) -> data.StructLayout:
    return data.StructLayout({"index": token_bits(cfg), "value": signed(formats_for(cfg).resid_bits)})


def head_weights(cfg):
    """The memory-map region of W: the LM head, or the embedding table when tied."""
    mm = memory_map(cfg)
    return mm["embedding"] if cfg.model.tie_embedding else mm["lm_head"]


def head_beats_per_token(cfg) -> int:
    """Weight beats per token: V rows of beats_per_row(d_model), the port's bound on cycles."""
    return head_weights(cfg).beats


class Head(wiring.Component):
    def __init__(self, cfg):
        require_vocab(cfg, "LM head", self)
        self.cfg = cfg
        self.fm = fm = formats_for(cfg)
        self.V, self.d = cfg.model.vocab, cfg.model.d_model
        self.pb = cfg.hw.weight_port_bytes
        if cfg.hw.lanes != self.pb:
            self._MustUse__silence = True
            raise ConfigError(f"hw.lanes = {cfg.hw.lanes}: the LM head needs lanes == hw.weight_port_bytes "
                              f"({self.pb}), one port beat per engine beat")
        self.region = head_weights(cfg)
        self.nb = self.region.row_beats
        self.requests = split_request(self.region.addr, self.region.beats, self.pb)
        # the logits are saturated to resid_bits by the engine's requantiser; the row tag is the
        # token's logits_en (the engine carries it from the row's last beat to the result)
        ef = MatVecFormats.from_config(cfg, out_widths=(fm.resid_bits,), tag_shape=unsigned(1))
        fields = {f.name: f for f in head_param_fields(cfg)}
        if fields["head.head_m"].bits > ef.mult_bits or fields["head.head_s"].bits > ef.shift_bits:
            self._MustUse__silence = True
            raise ConfigError(f"parameters head.head_m/head_s: {fields['head.head_m'].bits}/"
                              f"{fields['head.head_s'].bits} bits do not fit the engine's "
                              f"({ef.mult_bits}/{ef.shift_bits})")
        self.engine = MatVecEngine(ef)
        super().__init__({
            "x": In(stream.Signature(data.ArrayLayout(signed(fm.resid_bits), self.d))),
            "logits_en": In(1),
            "next": Out(stream.Signature(next_layout(cfg))),
            "logits": Out(self.logits_signature(cfg)),
            "wport": Out(WeightPortSignature(self.pb)),
            "params": In(param_layout(cfg, "head", mixer="head")),
            "mac_beat": Out(1),
        })

    @staticmethod
    def logits_signature(cfg) -> stream.Signature:
        """The ``logits`` stream's signature (for a top that passes the stream on)."""
        return stream.Signature(logit_layout(cfg))

    def elaborate(self, platform):
        m = Module()
        cfg, fm, d, V, pb, nb = self.cfg, self.fm, self.d, self.V, self.pb, self.nb
        rb, a = fm.resid_bits, fm.act_bits
        plan = plan_pipeline(cfg.hw.clock_period_ns)
        prm = self.params

        # ---- 1. x_L into its register
        X = [Signal(signed(rb), name=f"x{n}") for n in range(d)]
        x_full, x_en = Signal(name="x_full"), Signal(name="x_en")
        m.d.comb += self.x.ready.eq(~x_full)
        with m.If(self.x.valid & ~x_full):
            m.d.sync += [Cat(*X).eq(self.x.payload.as_value()), x_en.eq(self.logits_en), x_full.eq(1)]

        # ---- 2. final RMSNorm, then fn = sat8(rs(fn_u * norm_w[n], norm_w_shift))
        m.submodules.norm = norm = Normalizer(fm, d, rb, derived_widths(cfg)["ss_rmsnorm"], [a],
                                              param_layout(cfg, "head.final_norm", mixer="head"),
                                              clock_period_ns=cfg.hw.clock_period_ns)
        m.d.comb += [norm.norms[0].eq(prm.final_norm), norm.rd_x.eq(Array(X)[norm.rd_idx])]
        # |fn_u * norm_w| < 2**(a + rb - 2): a shift of width - 1 or more gives 0, as the model's
        # does (clamp_shift); the shift and its rounding word are static, registered once
        width = a + rb + 1
        shift = Signal(range(width), name="nw_shift", reset_less=True)
        rnd = Signal(width, name="nw_rounding", reset_less=True)
        clamped = clamp_shift(prm.norm_w_shift, width - 1)
        m.d.sync += [shift.eq(clamped), rnd.eq(rounding_word(clamped, width))]
        nw = Pipe(m, plan, "nw")
        live = {"valid": norm.wr_en, "idx": norm.wr_idx, "u": norm.wr_y}
        live = nw.spend(plan.delays.mux_level * max(1, ceil_log2(d)), live)    # norm_w[idx]
        weight = Signal(signed(rb), name="nw_weight")
        m.d.comb += weight.eq(prm.norm_w[live["idx"]])
        # the int8 fn_u is the Booth multiplier (fewer digits than the 16-bit weight)
        live = booth_multiply(nw, live, weight, live.pop("u"), width, "p", extra_words=[rnd])
        live = barrel_shift_saturate(nw, {**live, "sh": shift}, "p", "sh", width, len(shift), "y", [a])
        live.pop("sh")
        live = nw.register(live)
        FN = [Signal(signed(a), name=f"fn{n}") for n in range(d)]
        with m.If(live["valid"]):
            m.d.sync += Array(FN)[live["idx"]].eq(live["y"])
        fn_done = Signal(name="fn_done")           # fn's last element is written this cycle
        m.d.comb += fn_done.eq(live["valid"] & (live["idx"] == d - 1))

        fn_full, fn_en = Signal(name="fn_full"), Signal(name="fn_en")
        with m.FSM(name="norm_phase"):
            with m.State("IDLE"):
                # the normaliser is idle whenever fn is free: its last write (fn_done) is a
                # couple of cycles before its own end, and fn stays full for V rows of beats
                with m.If(x_full & ~fn_full):
                    m.d.comb += norm.start.eq(1)
                    m.d.sync += fn_en.eq(x_en)
                    m.next = "RUN"
            with m.State("RUN"):
                with m.If(fn_done):
                    m.d.sync += [fn_full.eq(1), x_full.eq(0)]
                    m.next = "IDLE"

        # ---- 3. the weight read and the engine
        m.submodules.engine = eng = self.engine
        m.d.comb += self.mac_beat.eq(eng.beat)
        req, resp = self.wport.req, self.wport.resp
        n_req = len(self.requests)
        rq_idx = Signal(range(n_req + 1), name="rq_idx")
        rq_busy = Signal(name="rq_busy")
        m.d.comb += [req.valid.eq(rq_busy),
                     req.payload.addr.eq(Array(Const(ad, 32) for ad, _ in self.requests)[rq_idx]),
                     req.payload.beats.eq(Array(Const(n, 16) for _, n in self.requests)[rq_idx])]
        with m.If(req.valid & req.ready):
            m.d.sync += rq_idx.eq(rq_idx + 1)
            with m.If(rq_idx == n_req - 1):
                m.d.sync += rq_busy.eq(0)
        c_busy = Signal(name="c_busy")
        c_row = Signal(range(V), name="c_row")
        c_beat = Signal(range(nb), name="c_beat")
        with m.If(fn_done):
            m.d.sync += [rq_busy.eq(1), rq_idx.eq(0), c_busy.eq(1), c_row.eq(0), c_beat.eq(0)]
        beat = Signal()
        m.d.comb += [resp.ready.eq(c_busy & eng.i.ready), beat.eq(resp.valid & resp.ready)]
        pad = [Const(0, signed(a))] * (nb * pb - d)
        slices = Array(Cat(*(FN + pad)[pb * j:pb * (j + 1)]) for j in range(nb))
        ei = eng.i.payload
        m.d.comb += [eng.i.valid.eq(c_busy & resp.valid),
                     ei.w.as_value().eq(resp.payload.data),
                     ei.x.as_value().eq(slices[c_beat]),
                     ei.first.eq(c_beat == 0), ei.last.eq(c_beat == nb - 1),
                     ei.mult.eq(prm.head_m), ei.shift.eq(prm.head_s), ei.tag.eq(fn_en)]
        with m.If(beat):
            m.d.sync += c_beat.eq(c_beat + 1)
            with m.If(c_beat == nb - 1):
                m.d.sync += [c_beat.eq(0), c_row.eq(c_row + 1)]
                with m.If(c_row == V - 1):
                    # fn is used up: the next token's RMSNorm may write it
                    m.d.sync += [c_busy.eq(0), fn_full.eq(0)]

        # ---- 4. results: one register, the argmax and the logits slice
        tb = token_bits(cfg)
        res_idx = Signal(range(V), name="res_idx")      # the row of the engine's next result
        r_valid, r_en = Signal(name="r_valid"), Signal(name="r_en")
        r_first, r_last = Signal(name="r_first"), Signal(name="r_last")
        r_idx, r_y = Signal(tb, name="r_idx"), Signal(signed(rb), name="r_y")
        best_idx, best_y = Signal(tb, name="best_idx"), Signal(signed(rb), name="best_y")
        next_valid = Signal(name="next_valid")
        next_tok, next_logit = Signal(tb, name="next_tok"), Signal(signed(rb), name="next_logit")
        m.submodules.logits_slice = lslice = SkidBuffer(logit_layout(cfg))
        connect(m, lslice.o, wiring.flipped(self.logits))
        # a result leaves the register when its logit (if wanted) is taken and, for row V-1,
        # when the last winner has been taken from ``next``; neither condition can fall back
        # while it waits (next_valid is set only by such a drain), so the slice's valid holds
        free = ~r_last | ~next_valid
        m.d.comb += [lslice.i.valid.eq(r_valid & r_en & free),
                     lslice.i.payload.index.eq(r_idx), lslice.i.payload.value.eq(r_y)]
        drain = Signal()
        m.d.comb += drain.eq(r_valid & free & (~r_en | lslice.i.ready))
        m.d.comb += eng.o.ready.eq(~r_valid | drain)
        with m.If(drain):
            m.d.sync += r_valid.eq(0)
        with m.If(eng.o.valid & eng.o.ready):
            m.d.sync += [r_valid.eq(1), r_en.eq(eng.o.payload.tag), r_y.eq(eng.o.payload.y),
                         r_idx.eq(res_idx), r_first.eq(res_idx == 0), r_last.eq(res_idx == V - 1),
                         res_idx.eq(Mux(res_idx == V - 1, 0, res_idx + 1))]
        take = Signal()
        m.d.comb += take.eq(r_first | (r_y > best_y))     # strictly larger: lowest index on ties
        win_idx, win_y = Mux(take, r_idx, best_idx), Mux(take, r_y, best_y)
        with m.If(drain):
            m.d.sync += [best_idx.eq(win_idx), best_y.eq(win_y)]
            with m.If(r_last):
                m.d.sync += [next_valid.eq(1), next_tok.eq(win_idx), next_logit.eq(win_y)]
        with m.If(self.next.valid & self.next.ready):
            m.d.sync += next_valid.eq(0)
        m.d.comb += [self.next.valid.eq(next_valid), self.next.payload.token.eq(next_tok),
                     self.next.payload.logit.eq(next_logit)]
        return m
