"""The layer chip: one Kimi-style decoder layer, token stream in, token stream out.

Implements ``sim.models.int_layer.int_layer_step`` bit for bit:

    xn = RMSNorm(x);  h = x (+) KDA(xn);  hn = RMSNorm(h);  y = h (+) MoE(hn)

Block diagram (docs/chip.md has the long form)::

        i ──> X ──> norm (attn) ──> N ──> KdaUnit ──┐            (+) = ResidualAdd
              │                                     v
              └───────────────────────────────> res1 (+) ──> H ──> norm (mlp) ──> N ──> MoEUnit ──┐
                                                             │                                     v
                                                             └─────────────────────────> res2 (+) ──> X ──> o
        KdaUnit.wport ──┐
                        ├── WeightArbiter ──> wport (the one weight memory)
        MoEUnit.wport ──┘
        bus (Wishbone) ──> LayerCsr: RUN / CLEAR / counter reset, status, counters, config read-back

Ports
-----
``i``     stream, one beat per token: ``x`` (d_model x resid_bits signed, the
          residual stream) and ``first`` (a new sequence starts here).
``o``     stream, one beat per token: ``y`` (d_model x resid_bits signed).
``wport`` the weight port (hw/weight_port.py): every weight matrix of the layer
          is read from the external weight memory (hw/memory_map.py).
``bus``   Wishbone classic slave, the control and status registers (hw/csr.py).

The token is processed in phases, one after the other: the RMSNorms share one
normaliser (hw/kda_norm.py, two baked modes), the residual adds are
element-serial (hw/residual.py).  ``y`` is written over ``x`` (x is not needed
once ``h`` exists) and ``xn`` and ``hn`` share one int8 register vector (each
block latches its input token), so the top holds 2 x d resid words + d bytes.
A sequence starts when the token's ``first`` bit is set, after a CLEAR write,
and after reset (the KDA state memory has no reset: the first token after a
reset always starts a new sequence).
"""
from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from hw.csr import LayerCsr, WishboneSignature
from hw.kda import KdaUnit
from hw.kda_norm import Normalizer
from hw.memory_map import memory_map
from hw.moe import MoEUnit
from hw.residual import ResidualAdd
from hw.weight_arbiter import WeightArbiter
from hw.weight_port import WeightPortSignature
from moekda.formats import derived_widths, formats_for


def token_in_layout(cfg) -> data.StructLayout:
    fm = formats_for(cfg)
    return data.StructLayout({"x": data.ArrayLayout(signed(fm.resid_bits), cfg.model.d_model), "first": 1})


def token_out_layout(cfg) -> data.ArrayLayout:
    return data.ArrayLayout(signed(formats_for(cfg).resid_bits), cfg.model.d_model)


def macs_per_token(cfg) -> int:
    """Weight-matrix multiply-accumulates per token: one per weight element used (every
    KDA matrix, the router, the shared experts and the top_k chosen experts).  The
    short convolution, the norms and the state update are not counted."""
    mm = memory_map(cfg)
    m = cfg.model
    kda = sum(r.rows * r.cols for name, r in mm.regions.items() if name.startswith("kda."))
    router = mm["moe.router"].rows * mm["moe.router"].cols
    expert = sum(mm[f"moe.expert0.{t}"].rows * mm[f"moe.expert0.{t}"].cols for t in ("gate", "up", "down"))
    return kda + router + (m.n_shared + m.top_k) * expert


class LayerTop(wiring.Component):
    def __init__(self, cfg, qlayer):
        self.cfg, self.q = cfg, qlayer
        self.fm = formats_for(cfg)
        self.d = cfg.model.d_model
        super().__init__({
            "i": In(stream.Signature(token_in_layout(cfg))),
            "o": Out(stream.Signature(token_out_layout(cfg))),
            "wport": Out(WeightPortSignature(cfg.hw.weight_port_bytes)),
            "bus": In(WishboneSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, q, fm, d = self.cfg, self.q, self.fm, self.d
        rb, a = fm.resid_bits, fm.act_bits

        m.submodules.kda = kda = KdaUnit(cfg, q.kda)
        m.submodules.moe = moe = MoEUnit(cfg, q.moe)
        m.submodules.arbiter = arb = WeightArbiter(cfg.hw.weight_port_bytes, 2)
        connect(m, kda.wport, arb.up[0])
        connect(m, moe.wport, arb.up[1])
        connect(m, arb.down, wiring.flipped(self.wport))
        m.submodules.norm = norm = Normalizer(fm, d, rb, derived_widths(cfg)["ss_rmsnorm"],
                                              [q.attn_norm, q.mlp_norm], a)
        m.submodules.res1 = res1 = ResidualAdd(q.res1, rb, a, rb, d)
        m.submodules.res2 = res2 = ResidualAdd(q.res2, rb, moe.out_bits, rb, d)
        m.submodules.csr = csr = LayerCsr(cfg, macs_per_token(cfg))
        connect(m, wiring.flipped(self.bus), csr.bus)

        X = [Signal(signed(rb), name=f"x{n}") for n in range(d)]   # x, then y
        H = [Signal(signed(rb), name=f"h{n}") for n in range(d)]
        N = [Signal(signed(a), name=f"n{n}") for n in range(d)]     # xn, then hn
        first = Signal()
        clear_pending = Signal(init=1)
        second = Signal()                 # the normaliser works on h (mlp norm), not x
        ridx = Signal(range(d))
        latency = Signal(32)
        token_cycles = Signal(32)
        busy = Signal()

        # the normaliser reads x or h by index and writes xn or hn
        m.d.comb += [norm.mode.eq(second),
                     norm.rd_x.eq(Mux(second, Array(H)[norm.rd_idx], Array(X)[norm.rd_idx]))]
        with m.If(norm.wr_en):
            m.d.sync += Array(N)[norm.wr_idx].eq(norm.wr_y)
        # the residual adds read x or h and the block's output (held on its stream) by index
        m.d.comb += [res1.idx.eq(ridx), res1.a.eq(Array(X)[ridx]), res1.b.eq(kda.o.payload[ridx]),
                     res2.idx.eq(ridx), res2.a.eq(Array(H)[ridx]), res2.b.eq(moe.out.payload[ridx])]
        with m.If(res1.wr_en):
            m.d.sync += Array(H)[res1.wr_idx].eq(res1.wr_y)
        with m.If(res2.wr_en):
            m.d.sync += Array(X)[res2.wr_idx].eq(res2.wr_y)

        m.d.comb += [kda.i.payload.x.eq(Cat(*N)), kda.i.payload.first.eq(first),
                     moe.tokens.payload.eq(Cat(*N)), self.o.payload.eq(Cat(*X))]

        accept = self.i.valid & self.i.ready
        with m.If(accept):
            m.d.sync += clear_pending.eq(0)
        with m.Elif(csr.clear):
            m.d.sync += clear_pending.eq(1)
        with m.If(busy):
            m.d.sync += latency.eq(latency + 1)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(csr.run)
                with m.If(accept):
                    m.d.sync += [Cat(*X).eq(self.i.payload.x),
                                 first.eq(self.i.payload.first | clear_pending | csr.clear),
                                 second.eq(0), latency.eq(1)]
                    m.next = "NORM_START"
            with m.State("NORM_START"):
                m.d.comb += [busy.eq(1), norm.start.eq(1)]
                m.next = "NORM_WAIT"
            with m.State("NORM_WAIT"):
                m.d.comb += busy.eq(1)
                with m.If(~norm.busy & second):
                    m.next = "MOE_SEND"
                with m.Elif(~norm.busy):
                    m.next = "KDA_SEND"
            with m.State("KDA_SEND"):
                m.d.comb += [busy.eq(1), kda.i.valid.eq(1)]
                with m.If(kda.i.ready):
                    m.next = "KDA_WAIT"
            with m.State("KDA_WAIT"):
                m.d.comb += busy.eq(1)
                with m.If(kda.o.valid):
                    m.d.sync += ridx.eq(0)
                    m.next = "RES1"
            with m.State("RES1"):
                m.d.comb += [busy.eq(1), res1.valid.eq(1)]
                m.d.sync += ridx.eq(ridx + 1)
                with m.If(ridx == d - 1):
                    m.next = "RES1_DRAIN"
            with m.State("RES1_DRAIN"):
                m.d.comb += busy.eq(1)
                with m.If(res1.wr_en & (res1.wr_idx == d - 1)):
                    m.d.comb += kda.o.ready.eq(1)        # the KDA output is used up
                    m.d.sync += second.eq(1)
                    m.next = "NORM_START"
            with m.State("MOE_SEND"):
                m.d.comb += [busy.eq(1), moe.tokens.valid.eq(1)]
                with m.If(moe.tokens.ready):
                    m.next = "MOE_WAIT"
            with m.State("MOE_WAIT"):
                m.d.comb += busy.eq(1)
                with m.If(moe.out.valid):
                    m.d.sync += ridx.eq(0)
                    m.next = "RES2"
            with m.State("RES2"):
                m.d.comb += [busy.eq(1), res2.valid.eq(1)]
                m.d.sync += ridx.eq(ridx + 1)
                with m.If(ridx == d - 1):
                    m.next = "RES2_DRAIN"
            with m.State("RES2_DRAIN"):
                m.d.comb += busy.eq(1)
                with m.If(res2.wr_en & (res2.wr_idx == d - 1)):
                    m.d.comb += moe.out.ready.eq(1)
                    m.d.sync += token_cycles.eq(latency + 1)
                    m.next = "OUTPUT"
            with m.State("OUTPUT"):
                m.d.comb += [busy.eq(1), self.o.valid.eq(1)]
                with m.If(self.o.ready):
                    m.next = "IDLE"

        m.d.comb += [csr.busy.eq(busy), csr.clear_pending.eq(clear_pending),
                     csr.in_waiting.eq(self.i.valid), csr.out_waiting.eq(self.o.valid),
                     csr.ev_token.eq(self.o.valid & self.o.ready),
                     csr.ev_beat.eq(self.wport.resp.valid & self.wport.resp.ready),
                     csr.token_cycles.eq(token_cycles)]
        return m


def default_qlayer(cfg, seed: int = 0):
    """The quantised seeded random layer (sim/models/params.py + quantize.py) whose
    constants the synthesised chip bakes in; tests of the netlist use the same one."""
    from sim.models.params import random_params
    from sim.models.quantize import quantize_layer
    return quantize_layer(random_params(cfg, seed), cfg)


def layer_for_config(cfg, seed: int = 0) -> LayerTop:
    return LayerTop(cfg, default_qlayer(cfg, seed))
