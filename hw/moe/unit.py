"""The MoE channel mixer: one int8 token in, one int8 token out, weights streamed.

Implements ``model.int_moe.int_moe_step`` bit for bit, and on a model
whose config has dense layers (``model.mixers``) ``int_dense_step`` for the
tokens of those layers.  The RTL is a function of the config alone: the weight
matrices live in the external weight memory (hw/image/memory_map.py) and are
read through ``wport``; every other per-model value (requantisation (m, s) per
matrix, the selection bias, the SiLU requantisations, routed_scaling, the
combine (m, s)) comes in on ``params``, the MoE's slice of the chip's parameter
bank (hw/image/param_map.py, ``param_layout(cfg, "moe")``; a test drives
``region_value(cfg, flat, "moe")``), and for a dense layer on ``dense_params``.
The parameters are static while a token is inside the unit (the bank changes
only between tokens: at LOAD, and on a model when the chip loads the next
layer's block), so they are read where they are used and not carried through
pipeline registers.

Layers (issue 14)
-----------------
On a model the L layers of the stack run one after another on this one unit.
The token's layer index comes in on ``layer`` and is registered when the token
is accepted; everything of the token follows that register, so the top may
change ``layer`` afterwards.  Every weight address is a per-layer constant of
the memory map (``layer_prefix``): the router's and each bank's address are a
lookup of constants by (layer, bank), into a request address register (a
request goes a cycle after the previous one is taken, hidden behind its beats;
the token's first address is loaded at acceptance), and the layer's mixer kind
is a constant bit per layer, registered (``dense_r``) with the index.  On the
layer chip (one layer) ``layer`` is unused and the logic is the one-layer
unit's, the request address combinational as before.

A dense layer (int_dense_step) runs no router and no routed expert: its C =
d_ff_dense / d_ff chunks are segments 1..C, each exactly a shared expert
(weight 1 << wn_frac, no wait for a routing weight), read from
``layers.<l>.dense.chunk<c>.*``.  They use the same engine, SiLU pipeline,
products, exponent, conversion and combine; what the mode changes is the
segment count (the last segment is C instead of S + k), the bank of a segment
(banks E + S .. E + S + C - 1: the chunks' (m, s) from ``dense_params``), the
combine (m, s), and the SiLU's requantisations (``dense_params``' pair, picked
by ``dense_r`` in the SiLU pipeline's op select).  With the C more banks the bank
index is a register (the next segment's computed a cycle ahead), so the (m, s)
muxes start at a flop.  The accumulators are
``dense_combine_bits`` wide when the chunks' sum needs more than the MoE's.

LatentMoE (issue 15)
--------------------
With ``model.moe_latent`` = l > 0 a MoE layer's token is ``int_moe_step`` with
``lat_down`` / ``lat_up``: two more phases, LD (``moe.lat_down``, l x d, after the
router: its rows, clamped to int8, fill ``z``) and LU (``moe.lat_up``, d x l, last).  A
routed expert's gate and up rows take z (l wide: ``c_routed``, a register set as its
phases begin, picks the row length and the vector) and wait for it (``z_ok``); its down
rows are l long and sum into ``racc``, l accumulators of their own, since the shared
experts' sums sit in ``acc`` meanwhile.  The last routed expert's sums pass through the
combine's requantiser with (lat_m, lat_s) (its (m, s) registers take them until zr is
complete) into ``zr``, int8; LU's rows wait for it (``zr_ok``), stream on zr, and add
into ``acc`` with weight 1.0 as a shared expert's down rows do; then the combine as ever.
A dense layer's token on the same unit has no latent.  With K3's exit norm
(``model.latent_exit_norm``) the combine's requantiser gives the sum at resid_bits into
``zp``, and the unit's own normaliser (hw/kda/norm.py; ``moe.lat_norm``) writes zr from
it; zr_ok follows the norm.

Ports
-----
``tokens``  stream, one beat per token: d_model int8 (the normalised hn).
``out``     stream, one beat per token: d_model x resid_bits signed (the MoE
            output, at the scale the residual add takes).
``wport``   weight port (hw/chip/weight_port.py).
``params``  the per-model values (hw/image/param_map.py), one vector in the Verilog.
``dense_params`` (only when a layer of the config is dense) the dense layer's values,
            ``param_layout(cfg, "dense", mixer="dense")``; ``params`` is then unused for
            that layer's tokens, and ``dense_params`` for a MoE layer's.
``layer``   the token's layer, ``layer_bits(cfg)`` bits, sampled with the token
            (``tokens.valid & tokens.ready``); unused on the layer chip.  An index >= L
            is the top's error.  ``params`` / ``dense_params`` must hold the token's
            layer's values from acceptance until its output is taken.
``cycles``  free-running cycle counter; ``tokens_done`` tokens delivered;
``weight_bytes`` bytes received on the weight port; ``hits[e]`` how often
routed expert e was chosen.  For tests and reports.
``mac_beat`` the engine's ``beat``: one beat of hw.lanes MACs (the chip's MACS counter).

Schedule of one token
---------------------
Segments in this order: the router (E rows), the shared experts, then the k
chosen experts in rank order.  Each segment's gate, up and down matrices are
phases of their own, interleaved so that the engine never waits for an
expert's hidden vector while another expert has rows to stream:

    R, G1, U1, G2, D1, U2, G3, D2, U3, D3      (``next_phase``)

One request a phase, each issued as soon as the port takes the previous one;
a routed expert's requests wait for the top-k selector's indices (they come
while the shared experts stream, so the memory latency is hidden when
n_shared >= 1).  A dense layer's token: the C chunks, segments 1..C, in the
same order, its latency showing once per token.

Every projection (router, and gate, up, down of every shared and chosen
expert) runs on ONE matrix-vector engine (hw/arith/matvec.py), shared in time:
the weights arrive one port beat per cycle and the engine takes one beat per
cycle (hw.lanes == hw.weight_port_bytes), so the port is the roofline and a
second engine would only wait.  The engine saturates every row to the widest
consumer's width (16-bit expert output), a stage after it clamps the
narrower ones (table code, int8 up) from that value, and it
hands back a tag (matrix, row, segment) with each result, and is built
``always_ready`` (no FIFO: the pipeline after it never stalls).  A beat
waits only (a) before the first down-projection beat of an expert, until
that expert's hidden vector is complete (engine and product pipelines drain,
exponent, conversion: ~35 + d_ff/port_bytes cycles; behind the next expert's
gate rows, so only the last expert's down rows of a token see it), and (b)
for a routed expert, until its weight is known.  The SiLU values of the gate
rows and the products SiLU * up have a buffer each (``sbuf``, ``pbuf``): the
next expert's gate rows land while this expert's products are converted.

Results go through a fixed pipeline that never stalls: clamp -> router code ->
sigmoid table -> (+ bias) -> top-k; gate code -> SiLU (c * sigmoid,
hw/arith/silu.py, a few stages) -> sbuf; up ->
SiLU * up (15 bits) -> pbuf, OR of magnitudes; a cycle after the last up
row the hidden exponent sh = max(0, bitlen(max|prod|) - 7), then the
conversion hid = sat8(prod >> sh, rounded), port_bytes values per cycle; the
down projection's shift is down_s - sh.  Down results: weight * output +
running sum in one Booth tree into the d_model accumulators, and for the
last expert requantised (comb_m, comb_s): a Booth tree with the rounding
word, a barrel shift by comb_s, saturated in a stage of its own and shifted
into the output register (rows arrive in order: no decode).
Every product is hw/arith/booth_multiply.py over stages that hw/arith/pipeline.py places
from the clock period; the counters are chunked (hw/arith/counter.py).  Routing
weights (divisions) are computed by hw/moe/route.py while the shared
experts run.

Parts
-----
``MoEUnit.elaborate`` wires named parts, each a component of its own (and a module of
the Verilog): ``MoERequests`` (hw/moe/requests.py, one request a phase), ``MoEBeats``
(hw/moe/beats.py, instance ``feeder``: response beats -> engine beats on the shared
``RowBeatCounter`` of hw/proj/sequencer.py), both walking the phase order of
hw/moe/phases.py (``PhaseOrder``);
then the result pipeline: ``MoEActivations`` (hw/moe/activations.py: stages S, C, T, the
score and SiLU / SiTU tables, the choice keys to the top-k), ``ExpertSums``
(hw/moe/sums.py: stage O's products and the running sums), ``HiddenVector``
(hw/moe/hidden.py: exponent and conversion) and ``MoECombine`` (hw/moe/combine.py: stage
V, the output, a LatentMoE's zr and exit norm).  The unit itself keeps the token's input,
the counters, and the engine's input (the beat's vector slice and the row's (m, s)).
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.matvec import MatVecEngine, MatVecFormats
from hw.arith.pipeline import plan_pipeline
from hw.stream.weight_port import MAX_BEATS, WeightPortSignature, beats_per_row
from hw.image.memory_map import layer_bits, layer_count, layer_mixer, layer_prefix, memory_map
from hw.image.param_map import EXPERT_MATS, param_layout, param_map, silu_fields, table_fields
from hw.moe.activations import MoEActivations
from hw.arith.counter import event_counter
from hw.moe.beats import MoEBeats
from hw.moe.combine import MoECombine
from hw.moe.hidden import HiddenVector
from hw.moe.phases import (DOWN, GATE, LDOWN, LUP, PROD_BITS, ROUTER, UP, TokenKind,  # noqa: F401 (the unit's names)
                           bank_of, per_bank)
from hw.moe.requests import MoERequests
from hw.moe.route import RouteWeights
from hw.moe.sums import ExpertSums
from hw.moe.topk import TopK
from moekda.config import ConfigError
from moekda.formats import derived_widths, formats_for
from moekda.tables import situ_in_bits



class MoEUnit(wiring.Component):
    def __init__(self, cfg, counter_bits: int = 32):
        self.cfg = cfg
        m = cfg.model
        self.fm = fm = formats_for(cfg)
        self.widths = derived_widths(cfg)
        self.E, self.k, self.S, self.d, self.f = m.n_experts, m.top_k, m.n_shared, m.d_model, m.d_ff
        self.pb = cfg.hw.weight_port_bytes
        if cfg.hw.lanes != self.pb:
            # one response beat is one engine beat: the port is the roofline and the engine keeps up
            raise ConfigError(f"hw.lanes = {cfg.hw.lanes}: the MoE unit needs lanes == hw.weight_port_bytes "
                              f"({self.pb}), one port beat per engine beat")
        if fm.act_bits != 8 or fm.weight_bits != 8:
            raise ConfigError("formats.act_bits/weight_bits: the MoE unit is built for 8-bit activations and weights")
        self.mmap = memory_map(cfg)
        self.nb_d = beats_per_row(self.d, self.pb)
        self.nb_f = beats_per_row(self.f, self.pb)
        self.router_beats = self.E * self.nb_d
        self.expert_beats = 2 * self.f * self.nb_d + self.d * self.nb_f
        # LatentMoE (model.moe_latent = l > 0): the routed experts at width l, and the two
        # projections lat_down (l x d) and lat_up (d x l) once a token
        self.lat = m.moe_latent
        self.nb_l = beats_per_row(self.lat, self.pb) if self.lat else 0
        self.routed_beats = 2 * self.f * self.nb_l + self.lat * self.nb_f if self.lat else self.expert_beats
        self.lat_beats = self.lat * self.nb_d + self.d * self.nb_l
        self.exit_norm = bool(self.lat) and m.latent_exit_norm    # K3's exit norm on the routed sum
        self.nmat = 6 if self.lat else 4
        self.mat_bits = (self.nmat - 1).bit_length()
        # the stack: L layers on this unit, each its mixer kind and its own addresses
        self.L = layer_count(cfg)
        self.mixers = [layer_mixer(cfg, l) for l in range(self.L)]
        self.has_dense = "dense" in self.mixers
        self.C = m.dense_chunks if self.has_dense else 0
        # banks: 0..E-1 routed experts, E..E+S-1 shared, E+S..E+S+C-1 dense chunks; per layer
        # the address of each bank that layer has (0 for the others: never requested)
        self.nbanks = self.E + self.S + self.C
        # per layer: the router's address, each bank's matrices' addresses (none for a bank
        # the layer lacks: never requested) and a LatentMoE's two projections'
        self.router_addr, self.bank_addr, self.lat_addr = [], [], []
        for l in range(self.L):
            pre = layer_prefix(cfg, l)
            banks: list[dict] = [{}] * self.nbanks
            lat = {}
            if self.mixers[l] == "moe":
                router = self.mmap[f"{pre}moe.router"]
                assert router.beats == self.router_beats
                self.router_addr.append(router.addr)
                names = [(b, f"{pre}moe.expert{b}") for b in range(self.E)] + \
                        [(self.E + j, f"{pre}moe.shared{j}") for j in range(self.S)]
                if self.lat:
                    lat = {LDOWN: self.mmap[f"{pre}moe.lat_down"].addr, LUP: self.mmap[f"{pre}moe.lat_up"].addr}
            else:
                self.router_addr.append(0)
                names = [(self.E + self.S + c, f"{pre}dense.chunk{c}") for c in range(self.C)]
            for b, p in names:
                _, nbytes = self.mmap.span([f"{p}.gate", f"{p}.up", f"{p}.down"])   # an expert is one block
                assert nbytes == (self.routed_beats if b < self.E else self.expert_beats) * self.pb
                banks[b] = {GATE: self.mmap[f"{p}.gate"].addr, UP: self.mmap[f"{p}.up"].addr,
                            DOWN: self.mmap[f"{p}.down"].addr}
            self.bank_addr.append(banks)
            self.lat_addr.append(lat)
        longest = max(self.router_beats, self.expert_beats, self.routed_beats, self.f * self.nb_d, self.d * self.nb_f)
        if longest > MAX_BEATS:
            raise ConfigError(f"model.d_ff = {self.f}: a matrix needs {longest} beats, more than one "
                              f"weight request carries ({MAX_BEATS}); use a smaller d_ff/d_model")
        # segments of a token: MoE 0 (router), 1..S shared, S+1..S+k chosen; dense 1..C
        self.nseg_moe = 1 + self.S + self.k
        self.nseg = max(self.nseg_moe, 1 + self.C)
        self.kind = TokenKind(self.mixers, self.C, self.nseg_moe, self.lat)
        self.plan = plan_pipeline(cfg.hw.clock_period_ns)
        # the parameter fields' widths (hw/image/param_map.py) size the datapath
        self.pmap = pm = param_map(cfg)
        tables = {name: (bits, sgn) for name, bits, sgn, _ in table_fields(cfg)}
        self.score_shape = (signed if tables["moe.score"][1] else unsigned)(tables["moe.score"][0])
        # SiTU-GLU (model.glu = "situ"): the gate code indexes the config's SITU table (int8 out);
        # the up code passes the cap (hw/arith/situ.py) before its product
        self.situ = m.glu == "situ"
        self.silu_shape = signed(fm.act_bits) if self.situ else \
            signed(dict((n, b) for n, b, _ in silu_fields(cfg))["moe.silu"])
        # ONE engine for every projection: the weights of router, gate, up, down and
        # shared experts arrive one port beat per cycle in sequence, and the engine
        # takes one beat per cycle, so a second engine would only wait.  The engine
        # saturates every row to the widest consumer's width (expert outputs, down);
        # the narrower ones (table codes of router and gate, int8 up) are clamped from
        # that value in the stage after the engine (sat_a(sat_b(x)) == sat_a(x) for
        # a <= b): a 16-bit clamp there is cheaper than a per-row pick between two
        # wide clamps after the engine's run-time barrel shift.  The tag routes each result.
        self.kind_bits = {ROUTER: fm.lut_in_bits, GATE: situ_in_bits(fm) if self.situ else fm.lut_in_bits,
                          UP: fm.act_bits, DOWN: fm.expert_out_bits}
        if self.lat:      # z = lat_down(hn) is int8; lat_up's rows join the combine as a down row's
            self.kind_bits.update({LDOWN: fm.act_bits, LUP: fm.expert_out_bits})
        out_widths = (max(self.kind_bits.values()),)
        tag = {"kind": unsigned(self.mat_bits), "row": range(max(self.E, self.d, self.f)), "seg": range(self.nseg)}
        if self.situ:     # the row's bank picks its up cap's (t_m, t_s) after the engine
            tag["bank"] = range(self.E + self.S + (m.dense_chunks if "dense" in m.mixers else 0))
        tag = data.StructLayout(tag)
        self.engine = MatVecEngine(MatVecFormats.from_config(cfg, out_widths=out_widths, tag_shape=tag),
                                   always_ready=True)
        ef = self.engine.fmt
        engine_fields = ["moe.router"] + [f"moe.{b}.{mat}" for b in ("routed", "shared")[:1 + (self.S > 0)]
                                          for mat in EXPERT_MATS] + ["moe.lat_down", "moe.lat_up"][:2 * bool(self.lat)]
        engine_fields = [(pm, name) for name in engine_fields]
        if self.has_dense:
            self.dmap = param_map(cfg, "dense")
            engine_fields += [(self.dmap, f"dense.chunks.{mat}") for mat in EXPERT_MATS]
        for fmap, name in engine_fields:
            mf, sf = (fmap[name + ".m"], fmap[name + ".s"]) if name in ("moe.router", "moe.lat_down", "moe.lat_up") else \
                (fmap[name + "_m"], fmap[name + "_s"])
            if mf.bits > ef.mult_bits or sf.bits > ef.shift_bits:
                raise ConfigError(f"parameter {mf.name}/{sf.name}: {mf.bits}/{sf.bits} bits do not fit the "
                                  f"engine's ({ef.mult_bits}/{ef.shift_bits})")
        # the combine accumulators: sum_i wt_i e_i + shared << wn_frac, and on a model with a
        # dense layer also sum_c e_c << wn_frac, which needs more bits for many chunks (model-tiny:
        # from C = 16 on; derived_widths dense_combine_acc, the integer model's width too)
        self.acc_bits = self.widths["moe_combine_acc"]
        if self.has_dense:
            self.acc_bits = max(self.acc_bits, self.widths["dense_combine_acc"])
            if self.dmap["dense.comb_m"].bits != pm["moe.comb_m"].bits:
                raise ConfigError("parameters dense.comb_m and moe.comb_m: the combine needs one width")
        # the output goes straight into the residual add: resid_bits wide
        self.out_bits = fm.resid_bits
        ports = {
            "tokens": In(stream.Signature(data.ArrayLayout(signed(fm.act_bits), self.d))),
            "out": Out(stream.Signature(data.ArrayLayout(signed(self.out_bits), self.d))),
            "wport": Out(WeightPortSignature(self.pb)),
            "cycles": Out(unsigned(counter_bits)),
            "tokens_done": Out(unsigned(counter_bits)),
            "weight_bytes": Out(unsigned(counter_bits + 8)),
            "hits": Out(unsigned(counter_bits)).array(self.E),
            "mac_beat": Out(1),
            "params": In(param_layout(cfg, "moe")),
            "layer": In(layer_bits(cfg)),
        }
        if self.has_dense:
            ports["dense_params"] = In(param_layout(cfg, "dense", mixer="dense"))
        super().__init__(ports)
        self.counter_bits = counter_bits

    # ---- analytic counts (the tests compare the port's counters against these) ----
    def bytes_per_token(self, mixer: str = "moe") -> int:
        """Weight bytes a token of a layer with channel mixer ``mixer`` fetches."""
        if mixer == "dense":
            return self.C * self.expert_beats * self.pb
        return (self.router_beats + self.S * self.expert_beats + self.k * self.routed_beats +
                self.lat_beats) * self.pb

    def dense_bytes_per_token(self) -> int:
        """What a dense layer running all E routed experts (+ shared) would fetch."""
        return (self.router_beats + self.S * self.expert_beats + self.E * self.routed_beats +
                self.lat_beats) * self.pb

    def elaborate(self, platform):
        m = Module()
        cfg, fm, plan = self.cfg, self.fm, self.plan
        E, k, S, pb, kind = self.E, self.k, self.S, self.pb, self.kind
        nb_d, nb_f, lat, nb_l = self.nb_d, self.nb_f, self.lat, self.nb_l
        prm = self.params
        dprm = self.dense_params if self.has_dense else None

        # ---- the token's mixer kind: registered when the token is accepted (nothing after
        # acceptance decodes the port); with one kind in the stack a constant, no logic
        start = Signal()     # the token is accepted (driven below, with tokens.ready)
        if kind.mixed:
            dense_now = Array(Const(int(mx == "dense"), 1) for mx in self.mixers)[self.layer]
            dense_r = Signal(name="dense_r")
            with m.If(start):
                m.d.sync += dense_r.eq(dense_now)
        else:
            dense_now = dense_r = Const(int(self.has_dense), 1)

        # ---- the parts (each its module: hw/moe/*.py, hw/proj/sequencer.py) ----
        key_bits = self.widths["router_choice"]
        m.submodules.topk = topk = TopK(E, k, key_bits, tag_bits=self.score_shape.width)
        m.submodules.route = route = RouteWeights(
            E, k, key_bits, self.score_shape.width, wn_frac=fm.wn_frac, rs_bits=self.pmap["moe.rs"].bits,
            rs_frac=fm.rs_frac, div_num_bits=self.widths["div_num"], div_den_bits=self.widths["div_den"],
            weight_bits=self.widths["route_weight"], counter_bits=self.counter_bits,
            clock_period_ns=cfg.hw.clock_period_ns)
        wiring.connect(m, topk.out, route.sel)
        m.d.comb += route.rs.eq(prm.rs)
        m.submodules.engine = eng = self.engine
        idx_shape = route.idx[0].shape()
        m.submodules.requests = rq = MoERequests(self, idx_shape)
        m.submodules.feeder = bt = MoEBeats(self, idx_shape)   # ("beats" is a counter's name here)
        m.submodules.activations = act = MoEActivations(self, key_bits)
        eo = eng.o.payload
        m.submodules.sums = sums = ExpertSums(self, eo.tag.row.shape(), eo.tag.seg.shape(), eo.y.shape(),
                                              len(route.wt[0]))
        m.submodules.hidden = hid = HiddenVector(self)
        m.submodules.combine = comb = MoECombine(self, eo.tag.row.shape(), eo.tag.seg.shape(), sums.prod_bits)
        for part in (rq, bt, act, sums, comb):
            if kind.mixed:
                m.d.comb += part.dense.eq(dense_r)
        for part in (act, comb):
            m.d.comb += part.params.eq(prm)
            if dprm is not None:
                m.d.comb += part.dense_params.eq(dprm)
        for part in (rq, bt):
            m.d.comb += [part.idx[i].eq(route.idx[i]) for i in range(k)]
        m.d.comb += [self.mac_beat.eq(eng.beat),        # hw.lanes MACs (the chip's MACS counter)
                     *[self.hits[i].eq(route.hits[i]) for i in range(E)]]

        # ---- counters (hw/arith/counter.py: chunked, no carry chain longer than a chunk) ----
        m.d.comb += self.cycles.eq(event_counter(m, 1, "cycles", self.counter_bits))
        beat_seen = Signal()
        m.d.sync += beat_seen.eq(self.wport.resp.valid & self.wport.resp.ready)
        # bytes = beats * port_bytes (a power of two): count beats, shift by wiring
        lg_pb = pb.bit_length() - 1
        beats_seen = event_counter(m, beat_seen, "beats", len(self.weight_bytes) - lg_pb)
        m.d.comb += self.weight_bytes.eq(Cat(Const(0, lg_pb), beats_seen))

        # ---- token in / out ----
        x = Signal(data.ArrayLayout(signed(8), nb_d * pb))          # zero-padded to whole beats
        busy, out_valid = Signal(), Signal()
        m.d.comb += [self.tokens.ready.eq(~busy & ~out_valid), start.eq(self.tokens.valid & self.tokens.ready),
                     self.out.valid.eq(out_valid), self.out.payload.eq(comb.y)]
        with m.If(start):
            m.d.sync += [busy.eq(1), x.as_value().eq(self.tokens.payload.as_value())]
        delivered = Signal()
        m.d.comb += delivered.eq(self.out.valid & self.out.ready)
        with m.If(delivered):
            m.d.sync += out_valid.eq(0)
        with m.If(comb.done):
            m.d.sync += [out_valid.eq(1), busy.eq(0)]
        m.d.comb += [self.tokens_done.eq(event_counter(m, delivered, "tokens", self.counter_bits)),
                     route.release.eq(comb.done)]

        # ---- requests (one a phase) and beats (response beats -> engine beats) ----
        req, resp = self.wport.req, self.wport.resp
        m.d.comb += [rq.start.eq(start), rq.layer.eq(self.layer), rq.dense_now.eq(dense_now),
                     rq.idx_valid.eq(route.idx_valid), rq.ready.eq(req.ready), req.valid.eq(rq.valid),
                     req.payload.addr.eq(rq.addr), req.payload.beats.eq(rq.beats),
                     bt.start.eq(start), bt.dense_now.eq(dense_now), bt.wt_valid.eq(route.wt_valid),
                     bt.h_ok.eq(hid.h_ok), bt.h_seg.eq(hid.h_seg), bt.resp_valid.eq(resp.valid),
                     resp.ready.eq(bt.resp_ready)]
        if lat:
            m.d.comb += [bt.z_ok.eq(act.z_ok), bt.zr_ok.eq(comb.zr_ok)]

        # ---- the engine's input: the beat's weights, its vector's slice, the row's (m, s) ----
        bank = bt.bank
        x_slices = Array(x.as_value()[8 * pb * j: 8 * pb * (j + 1)] for j in range(nb_d))
        h_slices = Array(hid.h.as_value()[8 * pb * j: 8 * pb * (j + 1)] for j in range(nb_f))
        gate_m, up_m, down_m, gate_s, up_s, down_s = (Array(per_bank(self, prm, dprm, name)) for name in
                                                      ("gate_m", "up_m", "down_m", "gate_s", "up_s", "down_s"))
        # the down projection's shift absorbs the hidden exponent of this expert (down_s >= 1 +
        # the largest exponent: hw/image/param_map.py's range).  down_s - hid_sh as a register
        # (the subtraction before the engine's shift input was small's worst path), of the
        # segment whose down rows come next, its bank a register before: both settle long
        # before a down beat can go (the beat waits for h_ok, ~10 cycles after hid_sh)
        dn_bank = Signal(range(self.nbanks), name="dn_bank")
        down_shift = Signal.like(down_s[0], name="down_shift")
        m.d.sync += [dn_bank.eq(bank_of(kind, dense_r, route.idx, bt.dn_seg, E, S)),
                     down_shift.eq(down_s[dn_bank] - hid.hid_sh)]
        kind_ms = {ROUTER: (prm.router.m, prm.router.s), GATE: (gate_m[bank], gate_s[bank]),
                   UP: (up_m[bank], up_s[bank]), DOWN: (down_m[bank], down_shift)}
        if lat:
            kind_ms.update({LDOWN: (prm.lat_down.m, prm.lat_down.s), LUP: (prm.lat_up.m, prm.lat_up.s)})
        # the engine's vector: hn, the hidden vector (down rows), or a LatentMoE's z (routed
        # gate and up rows) or zr (lat_up's rows), padded to whole beats with zeros
        is_down = bt.mat == DOWN
        x_in = Signal(8 * pb, name="x_in")
        m.d.comb += x_in.eq(Mux(is_down, h_slices[bt.beat], x_slices[bt.beat]))
        if lat:
            pad = Const(0, 8 * (nb_l * pb - lat))
            z_slices = Array(Cat(act.z.as_value(), pad)[8 * pb * j: 8 * pb * (j + 1)] for j in range(nb_l))
            zr_slices = Array(Cat(comb.zr.as_value(), pad)[8 * pb * j: 8 * pb * (j + 1)] for j in range(nb_l))
            with m.If(bt.mat == LUP):
                m.d.comb += x_in.eq(zr_slices[bt.beat])
            with m.Elif(bt.routed & ~is_down):
                m.d.comb += x_in.eq(z_slices[bt.beat])
        ei = eng.i.payload
        with m.Switch(bt.mat):
            for mat, (mult, shift) in kind_ms.items():
                with m.Case(mat):
                    m.d.comb += [ei.mult.eq(mult), ei.shift.eq(shift)]
        m.d.comb += [eng.i.valid.eq(bt.go), ei.w.as_value().eq(resp.payload.data), ei.x.as_value().eq(x_in),
                     ei.first.eq(bt.first), ei.last.eq(bt.last),
                     ei.tag.kind.eq(bt.mat), ei.tag.row.eq(bt.row), ei.tag.seg.eq(bt.seg)]
        if self.situ:
            m.d.comb += ei.tag.bank.eq(bank)

        # ---- the results: activations -> products and sums -> hidden vector / combine ----
        m.d.comb += [act.start.eq(start), act.valid.eq(eng.o.valid), act.tag.eq(eo.tag), act.y.eq(eo.y),
                     topk.inp.valid.eq(act.key_valid), topk.inp.payload.key.eq(act.key),
                     topk.inp.payload.tag.eq(act.key_tag),
                     sums.q_valid.eq(act.q_valid), sums.q_kind.eq(act.q_kind), sums.q_row.eq(act.q_row),
                     sums.q_seg.eq(act.q_seg), sums.q_y.eq(act.q_y), sums.sbuf.eq(act.sbuf),
                     *[sums.wt[i].eq(route.wt[i]) for i in range(k)],
                     hid.start.eq(start), hid.taken.eq(bt.h_taken), hid.valid.eq(sums.u_valid & (sums.u_kind == UP)),
                     hid.row.eq(sums.u_row), hid.seg.eq(sums.u_seg), hid.prod.eq(sums.u_val[:PROD_BITS + 1]),
                     comb.start.eq(start), comb.u_valid.eq(sums.u_valid), comb.u_kind.eq(sums.u_kind),
                     comb.u_row.eq(sums.u_row), comb.u_seg.eq(sums.u_seg), comb.u_racc.eq(sums.u_racc),
                     comb.u_val.eq(sums.u_val)]
        return m
