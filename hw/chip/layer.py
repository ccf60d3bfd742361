"""The layer chip: one Kimi-style decoder layer, token stream in, token stream out.

Implements ``model.int_layer.int_layer_step`` bit for bit:

    xn = RMSNorm(x);  h = x (+) KDA(xn);  hn = RMSNorm(h);  y = h (+) MoE(hn)

Block diagram (docs/chip.md has the long form)::

  i -> LayerDatapath (hw/chip/datapath.py: RMSNorm, KDA, residual | RMSNorm, MoE, residual) -> o
         kda_wport   moe_wport          ImageLoader (LOAD: the parameter bank)
             |           |                   |
             +------> WeightArbiter <--------+ -> register slices -> wport (the one weight memory)
  bus (Wishbone) -> LayerCsr: RUN / CLEAR / LOAD / counter reset, status, counters, config read-back

The datapath is a two-token pipeline (stage A runs the KDA of token t+1 while
stage B runs the MoE of token t, the two blocks sharing the weight port through
the arbiter); this top adds what makes it a chip: the parameter bank and LOAD,
the sequence rules (``first``, CLEAR, the output tag), RUN, and the counters.

Ports
-----
``i``     stream, one beat per token: ``x`` (d_model x resid_bits signed, the
          residual stream) and ``first`` (a new sequence starts here).
``o``     stream, one beat per token: ``y`` (d_model x resid_bits signed) and ``seq``,
          the token's position in its sequence (token_out_layout).
``wport`` the weight port (hw/stream/weight_port.py): every weight matrix of the layer
          is read from the external weight memory (hw/image/memory_map.py).
``bus``   Wishbone classic slave, the control and status registers (hw/chip/csr.py).

A sequence starts when the token's ``first`` bit is set, after a CLEAR write,
and after reset (the KDA state memory has no reset: the first token after a
reset always starts a new sequence).
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth import Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from hw.chip.csr import LayerCsr, WishboneSignature
from hw.chip.datapath import SEQ_BITS, LayerDatapath
from hw.image.memory_map import memory_map, moe_token_regions
from hw.image.format import image_layout
from hw.chip.loader import ImageLoader
from hw.stream.skid import SkidBuffer
from hw.chip.weight_arbiter import WeightArbiter
from hw.stream.weight_port import WeightPortSignature, WeightRequest, response_layout
from moekda.formats import formats_for


def token_in_layout(cfg) -> data.StructLayout:
    fm = formats_for(cfg)
    return data.StructLayout({"x": data.ArrayLayout(signed(fm.resid_bits), cfg.model.d_model), "first": 1})


def token_out_layout(cfg) -> data.StructLayout:
    """One output token: ``y`` (d_model x resid_bits signed) and ``seq``, the chip's tag:
    the token's position in its sequence, 0 for the token that starts one (``first`` set,
    the first token after a CLEAR write, a LOAD or a reset: the tokens whose KDA state
    starts from zero), then 1, 2, ... for the tokens after it (mod 2**SEQ_BITS).  The
    bench maps each output to its input by this tag (run/driver.py tag_indices), so
    order and duplicates are checked by what the chip says."""
    return data.StructLayout({"y": data.ArrayLayout(signed(formats_for(cfg).resid_bits), cfg.model.d_model),
                              "seq": SEQ_BITS})


def macs_per_token(cfg) -> int:
    """Weight-matrix multiply-accumulates per token: one per weight element used (every
    KDA matrix and the MoE's matrices a token reads, ``moe_token_regions``).  The
    short convolution, the norms and the state update are not counted."""
    mm = memory_map(cfg)
    kda = sum(r.rows * r.cols for name, r in mm.regions.items() if name.startswith("kda."))
    return kda + sum(mm[n].rows * mm[n].cols for n in moe_token_regions(cfg))


def engine_macs_per_token(cfg) -> int:
    """What the MACS counter grows by per token: ``hw.lanes`` per beat the two matrix-vector
    engines take, i.e. every row of every matrix used, padded to whole beats (a row of C
    weights is ceil(C / lanes) beats).  Equals ``macs_per_token`` + ``padding_macs_per_token``."""
    mm = memory_map(cfg)
    lanes = cfg.hw.lanes
    kda = sum(r.beats for name, r in mm.regions.items() if name.startswith("kda."))
    return lanes * (kda + sum(mm[n].beats for n in moe_token_regions(cfg)))


def padding_macs_per_token(cfg) -> int:
    """The lanes a token's beats carry beyond its rows' last weight (zero weights): the
    difference between the MACS counter and the analytic MACs (tiny 0, small 1 024:
    f_up and g_up rows of gate_rank 8 on 16 lanes)."""
    mm = memory_map(cfg)
    lanes = cfg.hw.lanes

    def pad(r):
        return r.rows * (-r.cols % lanes)
    kda = sum(pad(r) for name, r in mm.regions.items() if name.startswith("kda."))
    return kda + sum(pad(mm[n]) for n in moe_token_regions(cfg))


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
        cfg = self.cfg

        # the parameter bank: every per-model value (hw/image/param_map.py), filled from the
        # memory image by LOAD (hw/chip/loader.py), which reads the weight port as the
        # arbiter's third client; the datapath takes its fields from it
        m.submodules.loader = loader = ImageLoader(cfg)
        m.submodules.datapath = dp = LayerDatapath(cfg)
        m.d.comb += dp.bank.eq(loader.bank.as_value())
        if loader.tap_words:      # the short convolutions' taps, when in SRAM
            connect(m, loader.tap_w, dp.tap_w)
        m.submodules.arbiter = arb = WeightArbiter(cfg.hw.weight_port_bytes, 3)
        connect(m, dp.kda_wport, arb.up[0])
        connect(m, dp.moe_wport, arb.up[1])
        connect(m, loader.wport, arb.up[2])
        weight_port_slices(m, cfg, arb.down, self.wport)
        m.submodules.csr = csr = LayerCsr(cfg, macs_per_token(cfg), image_layout(cfg).length)
        connect(m, wiring.flipped(self.bus), csr.bus)

        # LOAD waits until no token is inside (nothing else then uses the weight port, and no
        # block is half way through a token with the old parameters); the next token starts a
        # new sequence (the state belongs to the old model)
        load_pending, loading, load_start = Signal(), Signal(), Signal()
        m.d.comb += loading.eq(load_pending | loader.busy)
        with m.If(csr.load):
            m.d.sync += load_pending.eq(1)
        with m.If(load_start):
            m.d.sync += load_pending.eq(0)
        m.d.comb += [loader.start.eq(load_start), dp.params_change.eq(load_start),
                     load_start.eq(load_pending & dp.idle & ~loader.busy)]

        # tokens go in only while RUN is set and a good LOAD holds (none asked or running)
        allowed = csr.run & loader.loaded & ~loading
        accept = self.i.valid & self.i.ready
        seq = sequence_rules(m, csr, self.i.payload.first, accept, load_start)
        m.d.comb += [dp.i.valid.eq(self.i.valid & allowed), self.i.ready.eq(dp.i.ready & allowed),
                     dp.i.payload.x.eq(self.i.payload.x), dp.i.payload.first.eq(seq.starts),
                     dp.i.payload.tag.eq(seq.tag), dp.i.payload.layer.eq(0)]
        m.d.comb += [self.o.valid.eq(dp.o.valid), dp.o.ready.eq(self.o.ready),
                     self.o.payload.y.eq(dp.o.payload.y), self.o.payload.seq.eq(dp.o.payload.tag)]
        connect_status(m, csr, self, loader, busy=dp.busy, loading=loading, clear_pending=seq.clear_pending,
                       mac_beats=dp.mac_beat, token_cycles=dp.token_cycles)
        return m


@dataclass
class SequenceRules:
    starts: Value          # the token on offer starts a new sequence
    tag: Value             # its position in its sequence, as the output tag carries it
    clear_pending: Value   # a CLEAR, LOAD or reset waits for the next token


def sequence_rules(m, csr, first, accept, load_start) -> SequenceRules:
    """When a token starts a sequence, both chips' rule: its ``first`` bit, a CLEAR write (now or
    pending), a LOAD or a reset since the last token.  The tag counts the tokens of the sequence
    from 0 (token_out_layout), taken at ``accept``."""
    seq = Signal(SEQ_BITS)
    clear_pending = Signal(init=1)
    starts, tag = Signal(), Signal(SEQ_BITS)
    m.d.comb += [starts.eq(first | clear_pending | csr.clear), tag.eq(Mux(starts, 0, seq + 1))]
    with m.If(accept):
        m.d.sync += [seq.eq(tag), clear_pending.eq(0)]
    with m.Elif(csr.clear | load_start):
        m.d.sync += clear_pending.eq(1)
    return SequenceRules(starts, tag, clear_pending)


def connect_status(m, csr, chip, loader, busy, loading, clear_pending, mac_beats, token_cycles) -> None:
    """The CSRs' status bits and event counters from a chip top (layer or model chip)."""
    # a weight beat is counted a cycle after it arrives: the port's ready comes from deep in
    # a block, and the CSR counter must not lengthen that path (WEIGHT_BYTES is read when idle)
    beat_r = Signal()
    m.d.sync += beat_r.eq(chip.wport.resp.valid & chip.wport.resp.ready)
    m.d.comb += [csr.busy.eq(busy), csr.clear_pending.eq(clear_pending),
                 csr.in_waiting.eq(chip.i.valid), csr.out_waiting.eq(chip.o.valid),
                 csr.ev_token.eq(chip.o.valid & chip.o.ready),
                 csr.ev_beat.eq(beat_r),
                 csr.ev_mac.eq(mac_beats),
                 csr.token_cycles.eq(token_cycles),
                 csr.loading.eq(loading), csr.loaded.eq(loader.loaded),
                 csr.load_errors.eq(loader.errors), csr.load_cycles.eq(loader.cycles)]


def weight_port_slices(m, cfg, inner, outer, prefix: str = "") -> None:
    """The chip's weight port ``outer`` from the arbiter's ``inner``, both directions through
    a register slice (hw/stream/skid.py): the grant logic of three clients plus a block's
    request logic did not fit small's 1 ns with the output delay (-0.094 ns), and a block's
    resp.ready through the arbiter to the pin was the routed tiny layer's worst path once
    the clock tree's insertion delay was in it (-0.08 ns); one cycle of latency each way,
    full rate.  ``prefix`` names the slices of a second port (the cache port's)."""
    req_slice, resp_slice = SkidBuffer(WeightRequest), SkidBuffer(response_layout(cfg.hw.weight_port_bytes))
    m.submodules[f"{prefix}req_slice"], m.submodules[f"{prefix}resp_slice"] = req_slice, resp_slice
    connect(m, inner.req, req_slice.i)
    connect(m, req_slice.o, wiring.flipped(outer.req))
    connect(m, wiring.flipped(outer.resp), resp_slice.i)
    connect(m, resp_slice.o, inner.resp)
