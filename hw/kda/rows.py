"""The KDA unit's row stages after the engine (hw/kda/unit.py): the projections' results
requantised (``ProjectionRequantiser``), and q, k, v through their short convolution,
requantised and through SiLU (``QkvActivation``)."""
from __future__ import annotations

from amaranth.hdl import Array, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import requantise
from hw.arith.carry_save import pipelined_add
from hw.arith.pipeline import Pipe, plan_pipeline
from hw.arith.silu import silu
from hw.image.param_map import conv_taps_in_sram, param_layout, structural, tap_words
from hw.kda.short_conv import ShortConv, tap_write_signature
from moekda.formats import formats_for


class ProjectionRequantiser(wiring.Component):
    """The engine's raw accumulators (it is built accumulator-only) in projection order:
    a second (op, row) count walks the feeder's sequence (results come back in row order),
    R0 registers the accumulator and its bias (0 but f_up's, read from the parameters by
    row: an H d_k : 1 mux from the bank), then the bias add (a carry chain as wide as the
    accumulator), times M, round, shift, saturate over clock-derived stages
    (hw/arith/booth_multiply.py); the last register is R2 (``o_*``).  ``shapes``: (rows,
    beats) per op; ``fields``: each op's QKDA field (its (m, s)); ``bias_op``: f_up's op."""

    def __init__(self, cfg, shapes, fields, bias_op: int, acc_shape, op_shape, row_shape):
        self.cfg, self.shapes, self.fields, self.bias_op = cfg, shapes, fields, bias_op
        fm = self.fm = formats_for(cfg)
        super().__init__({"restart": In(1), "valid": In(1), "acc": In(acc_shape),
                          "params": In(param_layout(cfg, "kda")),
                          "o_valid": Out(1), "o_op": Out(op_shape), "o_row": Out(row_shape),
                          "o_y": Out(signed(max(fm.act_bits, fm.lut_in_bits)))})

    def elaborate(self, platform):
        m = Module()
        fm, P, st = self.fm, self.params, structural(self.cfg)
        hk = self.cfg.model.n_heads * self.cfg.model.head_dim
        res_op, res_row = Signal.like(self.o_op, name="res_op"), Signal.like(self.o_row, name="res_row")
        with m.If(self.valid):
            m.d.sync += res_row.eq(res_row + 1)
            with m.If(res_row == Array(Const(rows - 1) for rows, _ in self.shapes)[res_op]):
                m.d.sync += [res_row.eq(0), res_op.eq(res_op + 1)]
        with m.If(self.restart):
            m.d.sync += [res_op.eq(0), res_row.eq(0)]
        r0_valid, r0_op, r0_row = Signal(), Signal.like(res_op), Signal.like(res_row)
        r0_acc, r0_bias = Signal(signed(fm.acc_bits + 1)), Signal(signed(fm.acc_bits + 1))
        m.d.sync += [r0_valid.eq(self.valid), r0_op.eq(res_op), r0_row.eq(res_row),
                     r0_acc.eq(self.acc), r0_bias.eq(0)]
        with m.If(res_op == self.bias_op):
            m.d.sync += r0_bias.eq(P.f_up.bias[res_row[:max(1, (hk - 1).bit_length())]])
        rq = Pipe(m, plan_pipeline(self.cfg.hw.clock_period_ns), "rq")
        live = pipelined_add(rq, {"valid": r0_valid, "op": r0_op, "row": r0_row, "acc": r0_acc,
                                  "bias": r0_bias}, "acc", "bias", "biased", fm.acc_bits + 1)
        biased = Value.cast(live.pop("biased")).as_signed()
        live = requantise(rq, live, biased, "op",
                          [(getattr(P, f).m, getattr(P, f).s, st[f"kda.{f}.out_bits"]) for f in self.fields],
                          fm.acc_bits + 3 + fm.mult_bits, "y")
        live = rq.register(live)
        m.d.comb += [self.o_valid.eq(live["valid"]), self.o_op.eq(live["op"]), self.o_row.eq(live["row"]),
                     self.o_y.eq(live["y"])]
        return m


class QkvActivation(wiring.Component):
    """q, k, v's rows (``valid`` / ``y``: R2 of the projections, channels in the order q,
    k, v) through their short convolution (hw/kda/short_conv.py: its history lives where
    the state does, hw.state_memory, one per context; ``restart`` clears a context's,
    ``layer`` is the token's context), requantised like R0 (CR1 registers each sum with its
    channel) and through SiLU = c * sigmoid (hw/arith/silu.py), by the channel's section:
    ``o_sec`` 0 q, 1 k, 2 v, ``o_idx`` the channel within it.  The convolution is built
    always ready: CR1 takes every sum the cycle it appears, so no output FIFO (and rows are
    sent without looking at ``ready`` anyway)."""

    CONV = ("conv_q", "conv_k", "conv_v")

    def __init__(self, cfg, y_shape, contexts: int, tap_layers: int = 1):
        self.cfg, self.fm, self.contexts = cfg, formats_for(cfg), contexts
        m_ = cfg.model
        self.hk = self.hv = m_.n_heads * m_.head_dim
        # the taps in SRAM (param_map conv_taps_in_sram): one block per KDA layer, written by
        # LOAD through ``tap_w``; ``tap_layer`` is the token's KDA layer (not its context)
        self.tap_memory = (tap_layers, cfg.hw.weight_port_bytes) if conv_taps_in_sram(cfg) else None
        taps = {}
        if self.tap_memory:
            taps["tap_w"] = In(tap_write_signature(tap_words(cfg), cfg.hw.weight_port_bytes))
            if tap_layers > 1:
                taps["tap_layer"] = In(range(tap_layers))
        super().__init__({"valid": In(1), "y": In(y_shape), "restart": In(contexts), **taps,
                          "layer": In(range(max(2, contexts))), "params": In(param_layout(cfg, "kda")),
                          "o_valid": Out(1), "o_sec": Out(2), "o_idx": Out(range(max(self.hk, self.hv))),
                          "o_silu": Out(signed(self.fm.qkv_bits))})

    def elaborate(self, platform):
        m = Module()
        fm, P, st, hk, hv = self.fm, self.params, structural(self.cfg), self.hk, self.hv
        cfg, C = self.cfg, self.contexts
        plan = plan_pipeline(cfg.hw.clock_period_ns)
        m.submodules.conv = conv = ShortConv(hk + hk + hv, cfg.model.conv_kernel, fm.act_bits, fm.weight_bits,
                                             clock_period_ns=cfg.hw.clock_period_ns, layers=C,
                                             memory=cfg.hw.state_memory, always_ready=True,
                                             tap_memory=self.tap_memory)
        if C > 1:
            m.d.comb += conv.layer.eq(self.layer)
        if self.tap_memory:
            wiring.connect(m, wiring.flipped(self.tap_w), conv.tap_w)
            if self.tap_memory[0] > 1:
                m.d.comb += conv.tap_layer.eq(self.tap_layer)
        else:
            for name, base_c, n in zip(self.CONV, (0, hk, 2 * hk), (hk, hk, hv)):
                m.d.comb += [conv.taps[base_c + c].eq(getattr(P, name).w[c]) for c in range(n)]
        m.d.comb += [conv.i.valid.eq(self.valid), conv.i.payload.eq(self.y), conv.restart.eq(self.restart)]
        c_chan = Signal(range(hk + hk + hv))
        with m.If(conv.o.valid):
            m.d.sync += c_chan.eq(Mux(c_chan == hk + hk + hv - 1, 0, c_chan + 1))
        c_sec = Signal(2)
        c_idx = Signal(range(max(hk, hv)))
        m.d.comb += [c_sec.eq(Mux(c_chan < hk, 0, Mux(c_chan < 2 * hk, 1, 2))),
                     c_idx.eq(Mux(c_chan < hk, c_chan, Mux(c_chan < 2 * hk, c_chan - hk, c_chan - 2 * hk)))]
        # CR1: the convolution sum registered with its channel; then requantised like R0
        cr1_valid, cr1_sec, cr1_idx = Signal(), Signal(2), Signal.like(c_idx)
        cr1_acc = Signal.like(conv.o.payload)
        m.d.sync += [cr1_valid.eq(conv.o.valid), cr1_sec.eq(c_sec), cr1_idx.eq(c_idx), cr1_acc.eq(conv.o.payload)]
        crq = Pipe(m, plan, "crq")
        live = crq.register(requantise(crq, {"valid": cr1_valid, "sec": cr1_sec, "idx": cr1_idx}, cr1_acc, "sec",
                                       [(getattr(P, c).m, getattr(P, c).s, st[f"kda.{c}.out_bits"])
                                        for c in self.CONV], conv.acc_bits + fm.mult_bits + 2, "code"))
        cr2_code = Signal(signed(fm.lut_in_bits))
        m.d.comb += cr2_code.eq(live["code"])
        # SiLU = c * sigmoid: q, k and v by the code's section
        sp = Pipe(m, plan, "silu")
        silus = [getattr(P, name) for name in ("silu_q", "silu_k", "silu_v")]
        s_live = silu(sp, {"valid": live["valid"], "sec": live["sec"], "idx": live["idx"], "code": cr2_code},
                      "code", "sec", [(p.t_m, p.t_s, p.m, p.s) for p in silus], fm.qkv_bits, fm)
        s_live = sp.register(s_live)
        m.d.comb += [self.o_valid.eq(s_live["valid"]), self.o_sec.eq(s_live["sec"]), self.o_idx.eq(s_live["idx"]),
                     self.o_silu.eq(s_live["silu"])]
        return m
