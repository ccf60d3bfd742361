"""The layer chip: one Kimi-style decoder layer, token stream in, token stream out.

Implements ``sim.models.int_layer.int_layer_step`` bit for bit:

    xn = RMSNorm(x);  h = x (+) KDA(xn);  hn = RMSNorm(h);  y = h (+) MoE(hn)

Block diagram (docs/chip.md has the long form)::

      stage A (token mixer)                          stage B (channel mixer)
  i -> XA -> norm1 -> NA -> KdaUnit -> res1 -> XA(h) => HB -> norm2 -> NB -> MoEUnit -> res2 -> HB(y) -> o
                               |                                             |
                               +----------> WeightArbiter <------------------+
                                                 |
                                               wport (the one weight memory)
  bus (Wishbone) -> LayerCsr: RUN / CLEAR / counter reset, status, counters, config read-back

The two stages are a two-token pipeline: while stage B runs the MoE of token
t, stage A already runs the RMSNorm and KDA of token t+1 (a token's KDA never
needs an earlier token's MoE), and the two blocks share the weight port
through the arbiter.  ``h`` moves from A to B in one cycle (``=>``) when B is
idle.

Ports
-----
``i``     stream, one beat per token: ``x`` (d_model x resid_bits signed, the
          residual stream) and ``first`` (a new sequence starts here).
``o``     stream, one beat per token: ``y`` (d_model x resid_bits signed) and ``seq``,
          the token's position in its sequence (token_out_layout).
``wport`` the weight port (hw/chip/weight_port.py): every weight matrix of the layer
          is read from the external weight memory (hw/image/memory_map.py).
``bus``   Wishbone classic slave, the control and status registers (hw/chip/csr.py).

Within a stage the phases run one after the other: RMSNorm (one normaliser
per stage, hw/kda/norm.py), the block, the element-serial residual add
(hw/chip/residual.py), which writes its sum over its own input (``h`` over ``x``,
``y`` over ``h``).  The top holds 2 x d resid words and 2 x d bytes.
Stage A's RMSNorm of the next token need not wait for the hand-over: it runs on
the token waiting on ``i`` as soon as the KDA has taken the current ``xn``, so the
KDA starts the next token, and its weight reads, right at acceptance.
A sequence starts when the token's ``first`` bit is set, after a CLEAR write,
and after reset (the KDA state memory has no reset: the first token after a
reset always starts a new sequence).
"""
from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from hw.arith.counter import ChunkedCounter
from hw.chip.csr import LayerCsr, WishboneSignature
from hw.kda.unit import KdaUnit
from hw.kda.norm import Normalizer
from hw.image.memory_map import memory_map
from hw.moe.unit import MoEUnit
from hw.image.param_map import param_layout
from hw.image.format import image_layout
from hw.chip.loader import ImageLoader
from hw.chip.residual import ResidualAdd
from hw.chip.skid import SkidBuffer
from hw.chip.weight_arbiter import WeightArbiter
from hw.chip.weight_port import WeightPortSignature, WeightRequest, response_layout
from moekda.formats import derived_widths, formats_for


def token_in_layout(cfg) -> data.StructLayout:
    fm = formats_for(cfg)
    return data.StructLayout({"x": data.ArrayLayout(signed(fm.resid_bits), cfg.model.d_model), "first": 1})


SEQ_BITS = 16     # the output tag's width (it wraps after 2**16 tokens of one sequence)


def token_out_layout(cfg) -> data.StructLayout:
    """One output token: ``y`` (d_model x resid_bits signed) and ``seq``, the chip's tag:
    the token's position in its sequence, 0 for the token that starts one (``first`` set,
    the first token after a CLEAR write, a LOAD or a reset: the tokens whose KDA state
    starts from zero), then 1, 2, ... for the tokens after it (mod 2**SEQ_BITS).  The
    bench maps each output to its input by this tag (sim/driver.py tag_indices), so
    order and duplicates are checked by what the chip says."""
    return data.StructLayout({"y": data.ArrayLayout(signed(formats_for(cfg).resid_bits), cfg.model.d_model),
                              "seq": SEQ_BITS})


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


def engine_macs_per_token(cfg) -> int:
    """What the MACS counter grows by per token: ``hw.lanes`` per beat the two matrix-vector
    engines take, i.e. every row of every matrix used, padded to whole beats (a row of C
    weights is ceil(C / lanes) beats).  Equals ``macs_per_token`` + ``padding_macs_per_token``."""
    mm = memory_map(cfg)
    m, lanes = cfg.model, cfg.hw.lanes
    kda = sum(r.beats for name, r in mm.regions.items() if name.startswith("kda."))
    router = mm["moe.router"].beats
    expert = sum(mm[f"moe.expert0.{t}"].beats for t in ("gate", "up", "down"))
    return lanes * (kda + router + (m.n_shared + m.top_k) * expert)


def padding_macs_per_token(cfg) -> int:
    """The lanes a token's beats carry beyond its rows' last weight (zero weights): the
    difference between the MACS counter and the analytic MACs (tiny 0, small 1 024:
    f_up and g_up rows of gate_rank 8 on 16 lanes)."""
    mm = memory_map(cfg)
    m, lanes = cfg.model, cfg.hw.lanes

    def pad(r):
        return r.rows * (-r.cols % lanes)
    kda = sum(pad(r) for name, r in mm.regions.items() if name.startswith("kda."))
    expert = sum(pad(mm[f"moe.expert0.{t}"]) for t in ("gate", "up", "down"))
    return kda + pad(mm["moe.router"]) + (m.n_shared + m.top_k) * expert


class LayerTop(wiring.Component):
    def __init__(self, cfg):
        self.cfg = cfg
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
        cfg, fm, d = self.cfg, self.fm, self.d
        rb, a = fm.resid_bits, fm.act_bits

        # the parameter bank: every per-model value (hw/image/param_map.py), one field per
        # block (bank.kda, bank.moe, bank.attn_norm, ...), filled from the memory image by
        # LOAD (hw/chip/loader.py), which reads the weight port as the arbiter's third client
        m.submodules.loader = loader = ImageLoader(cfg)
        bank = loader.bank

        m.submodules.kda = kda = KdaUnit(cfg)
        m.d.comb += kda.params.eq(bank.kda)
        m.submodules.moe = moe = MoEUnit(cfg)
        m.d.comb += moe.params.eq(bank.moe)
        m.submodules.arbiter = arb = WeightArbiter(cfg.hw.weight_port_bytes, 3)
        connect(m, kda.wport, arb.up[0])
        connect(m, moe.wport, arb.up[1])
        connect(m, loader.wport, arb.up[2])
        # both directions of the port cross the chip boundary through a register slice
        # (hw/chip/skid.py): the grant logic of three clients plus a block's request logic
        # did not fit small's 1 ns with the output delay (-0.094 ns), and a block's
        # resp.ready through the arbiter to the pin was the routed tiny layer's worst path
        # once the clock tree's insertion delay was in it (-0.08 ns); one cycle of latency
        # each way, full rate
        m.submodules.req_slice = req_slice = SkidBuffer(WeightRequest)
        m.submodules.resp_slice = resp_slice = SkidBuffer(response_layout(cfg.hw.weight_port_bytes))
        connect(m, arb.down.req, req_slice.i)
        connect(m, req_slice.o, wiring.flipped(self.wport.req))
        connect(m, wiring.flipped(self.wport.resp), resp_slice.i)
        connect(m, resp_slice.o, arb.down.resp)
        ss_bits = derived_widths(cfg)["ss_rmsnorm"]
        period = cfg.hw.clock_period_ns
        m.submodules.norm1 = norm1 = Normalizer(fm, d, rb, ss_bits, [a], param_layout(cfg, "attn_norm"),
                                                clock_period_ns=period)
        m.d.comb += norm1.norms[0].eq(bank.attn_norm)
        m.submodules.norm2 = norm2 = Normalizer(fm, d, rb, ss_bits, [a], param_layout(cfg, "mlp_norm"),
                                                clock_period_ns=period)
        m.d.comb += norm2.norms[0].eq(bank.mlp_norm)
        m.submodules.res1 = res1 = ResidualAdd.for_config(cfg, a, d)
        m.submodules.res2 = res2 = ResidualAdd.for_config(cfg, moe.out_bits, d)
        m.d.comb += [res1.params.eq(bank.res1), res2.params.eq(bank.res2)]
        m.submodules.csr = csr = LayerCsr(cfg, macs_per_token(cfg), image_layout(cfg).length)
        connect(m, wiring.flipped(self.bus), csr.bus)

        # stage A (token mixer): x -> xn -> KDA -> h, all in place in XA / NA
        XA = [Signal(signed(rb), name=f"xa{n}") for n in range(d)]   # x, then h
        NA = [Signal(signed(a), name=f"na{n}") for n in range(d)]     # xn
        # stage B (channel mixer): h -> hn -> MoE -> y, in place in HB / NB
        HB = [Signal(signed(rb), name=f"hb{n}") for n in range(d)]   # h, then y
        NB = [Signal(signed(a), name=f"nb{n}") for n in range(d)]     # hn
        first = Signal()
        # the output tag (token_out_layout): the accepted token's position in its sequence,
        # moved to stage B with h
        seq_a, seq_b = Signal(SEQ_BITS), Signal(SEQ_BITS)
        clear_pending = Signal(init=1)
        # cycles since the stage's token was accepted (chunked: no 32-bit carry chain)
        lat_a, lat_b = ChunkedCounter(32, name="lat_a"), ChunkedCounter(32, name="lat_b")
        token_cycles = Signal(32)
        handoff = Signal()                      # h moves from stage A to stage B this cycle
        stage_b_idle = Signal()

        # norm1 early: once the KDA has taken NA (stage A past SEND), norm1 normalises the
        # token waiting on ``i`` straight from the stream's payload (held stable while
        # valid, the stream rule), so the next token goes to the KDA right at acceptance and
        # its weight reads fill the port while stage B's RMSNorm runs (docs/chip.md)
        pre_start, pre_run, pre_done = Signal(), Signal(), Signal()
        # (the source is chosen per element by the pre_run register, ahead of the index mux:
        # no extra level after it; norm1 reads nothing in its start cycle)
        m.d.comb += norm1.rd_x.eq(Array(Mux(pre_run, self.i.payload.x[n], XA[n]) for n in range(d))[norm1.rd_idx])
        with m.If(norm1.wr_en):
            m.d.sync += Array(NA)[norm1.wr_idx].eq(norm1.wr_y)
        m.d.comb += norm2.rd_x.eq(Array(HB)[norm2.rd_idx])
        with m.If(norm2.wr_en):
            m.d.sync += Array(NB)[norm2.wr_idx].eq(norm2.wr_y)
        # residual adds: they select element idx themselves (registered one-hot select) and write it
        # back a fixed number of cycles later, so the sum replaces its own input (x by h,
        # h by y); the block's output stays on its stream (ready low) until the last write
        m.d.comb += [res1.a.eq(Cat(*XA)), res1.b.eq(kda.o.payload),
                     res2.a.eq(Cat(*HB)), res2.b.eq(moe.out.payload)]
        with m.If(res1.wr_en):
            m.d.sync += Array(XA)[res1.wr_idx].eq(res1.wr_y)
        with m.If(res2.wr_en):
            m.d.sync += Array(HB)[res2.wr_idx].eq(res2.wr_y)
        with m.If(handoff):
            m.d.sync += [Cat(*HB).eq(Cat(*XA)), seq_b.eq(seq_a)]

        m.d.comb += [kda.i.payload.x.eq(Cat(*NA)), kda.i.payload.first.eq(first),
                     moe.tokens.payload.eq(Cat(*NB)), self.o.payload.y.eq(Cat(*HB)),
                     self.o.payload.seq.eq(seq_b)]

        accept = self.i.valid & self.i.ready
        # LOAD waits until no token is inside (nothing else then uses the weight port, and no
        # block is half way through a token with the old parameters); the next token starts a
        # new sequence (the state belongs to the old model)
        load_pending, loading, load_start = Signal(), Signal(), Signal()
        m.d.comb += loading.eq(load_pending | loader.busy)
        with m.If(csr.load):
            m.d.sync += load_pending.eq(1)
        with m.If(load_start):
            m.d.sync += load_pending.eq(0)
        m.d.comb += loader.start.eq(load_start)
        with m.If(accept):
            m.d.sync += clear_pending.eq(0)
        with m.Elif(csr.clear | load_start):
            m.d.sync += clear_pending.eq(1)

        with m.FSM(name="stage_a") as stage_a:
            with m.State("IDLE"):
                # not while norm1 runs early, nor before a good LOAD or while one is asked or runs
                m.d.comb += self.i.ready.eq(csr.run & ~pre_run & loader.loaded & ~loading)
                with m.If(accept):
                    starts = self.i.payload.first | clear_pending | csr.clear
                    m.d.sync += [Cat(*XA).eq(self.i.payload.x), first.eq(starts),
                                 seq_a.eq(Mux(starts, 0, seq_a + 1))]
                    with m.If(pre_done):
                        m.next = "SEND"
                    with m.Else():
                        m.next = "NORM_START"
            _norm_unit_residual(m, d, norm1, kda.i, kda.o, res1, then="HOLD", name="stage_a")
            with m.State("HOLD"):                         # h waits for stage B
                m.d.comb += handoff.eq(stage_b_idle)
                with m.If(stage_b_idle):
                    m.next = "IDLE"

        with m.FSM(name="stage_b") as stage_b:
            with m.State("IDLE"):
                with m.If(handoff):
                    m.next = "NORM_START"
            done_b = _norm_unit_residual(m, d, norm2, moe.tokens, moe.out, res2, then="OUTPUT", name="stage_b")
            with m.State("OUTPUT"):
                m.d.comb += self.o.valid.eq(1)
                with m.If(self.o.ready):
                    m.next = "IDLE"

        kda_has_na = Signal()
        m.d.comb += kda_has_na.eq(stage_a.ongoing("WAIT") | stage_a.ongoing("RES") |
                                  stage_a.ongoing("RES_DRAIN") | stage_a.ongoing("HOLD"))
        m.d.comb += pre_start.eq(kda_has_na & self.i.valid & ~pre_run & ~pre_done & ~norm1.busy)
        with m.If(pre_start):
            m.d.comb += norm1.start.eq(1)
            m.d.sync += pre_run.eq(1)
        # a token withdrawn from ``i`` (never on a well-behaved stream; a producer reset) voids
        # the early result, even if valid is back with another token before norm1 ends
        pre_ok = Signal()
        with m.If(pre_start):
            m.d.sync += pre_ok.eq(1)
        with m.If(pre_run & ~norm1.busy):
            m.d.sync += [pre_run.eq(0), pre_done.eq(pre_ok & self.i.valid)]
        with m.If(accept | ~self.i.valid | load_start):       # used, withdrawn, or parameters change
            m.d.sync += [pre_done.eq(0), pre_ok.eq(0)]

        busy_a, busy_b = ~stage_a.ongoing("IDLE"), ~stage_b.ongoing("IDLE")
        m.d.comb += load_start.eq(load_pending & ~busy_a & ~busy_b & ~pre_run & ~loader.busy)
        m.d.comb += stage_b_idle.eq(stage_b.ongoing("IDLE"))
        # a stage counts every cycle it is not idle, the cycle of its last step included,
        # so "lat + 1" at the handoff and at the end is the counter's own next value
        m.d.comb += [lat_a.inc.eq(busy_a), lat_b.inc.eq(busy_b)]
        lat_a.load(accept, 1)
        lat_b.load(handoff, lat_a.next)
        lat_a.elaborate(m)
        lat_b.elaborate(m)
        with m.If(done_b):
            m.d.sync += token_cycles.eq(lat_b.next)

        # a weight beat is counted a cycle after it arrives: the port's ready comes from deep in
        # a block, and the CSR counter must not lengthen that path (WEIGHT_BYTES is read when idle)
        beat_r = Signal()
        m.d.sync += beat_r.eq(self.wport.resp.valid & self.wport.resp.ready)
        m.d.comb += [csr.busy.eq(busy_a | busy_b), csr.clear_pending.eq(clear_pending),
                     csr.in_waiting.eq(self.i.valid), csr.out_waiting.eq(self.o.valid),
                     csr.ev_token.eq(self.o.valid & self.o.ready),
                     csr.ev_beat.eq(beat_r),
                     csr.ev_mac.eq(Cat(kda.mac_beat, moe.mac_beat)),
                     csr.token_cycles.eq(token_cycles),
                     csr.loading.eq(loading), csr.loaded.eq(loader.loaded),
                     csr.load_errors.eq(loader.errors), csr.load_cycles.eq(loader.cycles)]
        return m


def _norm_unit_residual(m, d: int, norm, unit_in, unit_out, res, then: str, name: str) -> Signal:
    """The states one stage runs per token, inside the caller's FSM, from NORM_START to
    ``then``: RMSNorm of the stage's vector, the block (``unit_in`` takes the normalised
    vector, ``unit_out`` gives the branch output), then the residual add over all d
    elements.  Returns ``done``: high in the cycle the last sum is written back, which
    is also when the block's output is released."""
    idx = Signal(range(d), name=f"{name}_idx")
    done = Signal()
    m.d.comb += res.idx.eq(idx)
    with m.State("NORM_START"):
        m.d.comb += norm.start.eq(1)
        m.next = "NORM_WAIT"
    with m.State("NORM_WAIT"):
        with m.If(~norm.busy):
            m.next = "SEND"
    with m.State("SEND"):
        m.d.comb += unit_in.valid.eq(1)
        with m.If(unit_in.ready):
            m.next = "WAIT"
    with m.State("WAIT"):
        with m.If(unit_out.valid):
            m.d.sync += idx.eq(0)
            m.next = "RES"
    with m.State("RES"):
        m.d.comb += res.valid.eq(1)
        m.d.sync += idx.eq(idx + 1)
        with m.If(idx == d - 1):
            m.next = "RES_DRAIN"
    with m.State("RES_DRAIN"):
        with m.If(res.wr_en & (res.wr_idx == d - 1)):
            m.d.comb += [done.eq(1), unit_out.ready.eq(1)]   # the block's output is used up
            m.next = then
    return done


def layer_for_config(cfg) -> LayerTop:
    """The chip for ``cfg``: one netlist for every model (the model is the image it LOADs)."""
    return LayerTop(cfg)
