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
``wport``   weight port (hw/stream/weight_port.py).
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
from the clock period; the counters are chunked (hw/moe/arith.py).  Routing
weights (divisions) are computed by hw/moe/route.py while the shared
experts run.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import barrel_shift_saturate, booth_multiply, clamp_shift, rounding_word
from hw.arith.carry_save import sign_extend
from hw.arith.lut import LookupTable, drive_constant
from hw.arith.matvec import MatVecEngine, MatVecFormats, saturate
from hw.image.memory_map import layer_bits, layer_count, layer_mixer, layer_prefix, memory_map
from hw.moe.arith import chunked_counter, prefix_add
from hw.moe.route import RouteWeights
from hw.image.param_map import EXPERT_MATS, lat_norm_ss_bits, param_map, param_layout, silu_fields, table_fields
from hw.kda.norm import Normalizer
from hw.arith.pipeline import Pipe, plan_pipeline
from hw.arith.silu import silu
from hw.arith.situ import up_cap
from hw.moe.topk import TopK
from hw.stream.weight_port import MAX_BEATS, WeightPortSignature, beats_per_row
from moekda.config import ConfigError
from moekda.tables import fixed_table, situ_in_bits, situ_table
from moekda.formats import derived_widths, formats_for

# the matrices of a token (a phase each); LDOWN, LUP: a LatentMoE's projections
ROUTER, GATE, UP, DOWN, LDOWN, LUP = range(6)
PROD_BITS = 15   # |SiLU(gate) * up| of two int8 values < 2**15


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
        E, k, S, d, f, pb = self.E, self.k, self.S, self.d, self.f, self.pb
        nseg, nb_d, nb_f = self.nseg, self.nb_d, self.nb_f
        lat, nb_l, mat_bits = self.lat, self.nb_l, self.mat_bits
        L, C = self.L, self.C
        delays = plan.delays
        prm = self.params
        dprm = self.dense_params if self.has_dense else None

        def per_bank(name):
            """The E routed experts' then the S shared experts' (then the C dense chunks')
            ``name`` (gate_m, ...): banks 0..E-1 routed, E..E+S-1 shared, E+S.. dense,
            indexed by ``bank``."""
            vals = [prm.routed[name][e] for e in range(E)]
            if S:
                vals += [prm.shared[name][j] for j in range(S)]
            if C:
                vals += [dprm.chunks[name][c] for c in range(C)]
            return Array(Value.cast(v) for v in vals)

        def per_bank_list(name):
            """per_bank's values as a list (one per bank)."""
            vals = [prm.routed[name][e] for e in range(E)]
            if S:
                vals += [prm.shared[name][j] for j in range(S)]
            if C:
                vals += [dprm.chunks[name][c] for c in range(C)]
            return [Value.cast(v) for v in vals]

        # ---- the token's layer: its index and mixer kind, registered when the token is
        # accepted (nothing after acceptance decodes the port).  Per-layer values that are
        # the same for every layer are constants: on the layer chip no layer logic at all.
        start = Signal()     # the token is accepted (driven below, with tokens.ready)
        if L > 1:
            layer_r = Signal(len(self.layer), name="layer_r")
            with m.If(start):
                m.d.sync += layer_r.eq(self.layer)
        kinds = {mx == "dense" for mx in self.mixers}
        if len(kinds) == 1:
            dense_now = dense_r = Const(int(self.has_dense), 1)
        else:
            dense_now = Array(Const(int(mx == "dense"), 1) for mx in self.mixers)[self.layer]
            dense_r = Signal(name="dense_r")
            with m.If(start):
                m.d.sync += dense_r.eq(dense_now)

        def mode(dense, moe, sel=dense_r):
            """The dense layer's value or the MoE layer's, by the token's mixer kind."""
            if len(kinds) == 1:
                return dense if self.has_dense else moe
            return Mux(sel, dense, moe)
        # the token's last segment (S + k, or C for a dense layer's token)
        seg_last = mode(C, self.nseg_moe - 1)
        # a LatentMoE token: every MoE layer's (model.moe_latent is the model's); a dense
        # layer's token has no latent
        lat_tok = Value.cast(mode(0, 1)) if lat else Const(0, 1)

        # ---- submodules ----
        score_bits = self.score_shape.width          # U0.score_frac, 0..2**score_frac
        key_bits = self.widths["router_choice"]
        m.submodules.topk = topk = TopK(E, k, key_bits, tag_bits=score_bits)
        m.submodules.route = route = RouteWeights(
            E, k, key_bits, score_bits, wn_frac=fm.wn_frac, rs_bits=self.pmap["moe.rs"].bits, rs_frac=fm.rs_frac,
            div_num_bits=self.widths["div_num"], div_den_bits=self.widths["div_den"],
            weight_bits=self.widths["route_weight"], counter_bits=self.counter_bits,
            clock_period_ns=cfg.hw.clock_period_ns)
        wiring.connect(m, topk.out, route.sel)
        m.d.comb += route.rs.eq(prm.rs)
        m.submodules.score_lut = score_lut = LookupTable(fm.lut_in_bits, self.score_shape)
        # the score table is the config's (moekda/tables.py)
        drive_constant(m, score_lut, fixed_table(self.cfg, "moe.score"))
        m.submodules.engine = eng = self.engine
        m.d.comb += self.mac_beat.eq(eng.beat)       # hw.lanes MACs (the chip's MACS counter)
        for i in range(E):
            m.d.comb += self.hits[i].eq(route.hits[i])

        # ---- token state ----
        x = Signal(data.ArrayLayout(signed(8), nb_d * pb))          # zero-padded to whole beats
        h = [Signal(signed(8), name=f"h{j}") for j in range(nb_f * pb)]   # hidden vector, padded
        # per hidden unit: the SiLU value from the gate row (sbuf), and the product SiLU * up
        # (pbuf): two buffers, since the next expert's gate rows run while this expert's
        # products are converted (the schedule below)
        sbuf = [Signal(self.silu_shape, name=f"sbuf{j}") for j in range(f)]
        pbuf = [Signal(signed(PROD_BITS + 1), name=f"pbuf{j}") for j in range(f)]
        pbuf_padded = pbuf + [Const(0, signed(PROD_BITS + 1))] * (nb_f * pb - f)
        orb = Signal(PROD_BITS)        # OR of |prod| so far in this expert
        hid_sh = Signal(range(PROD_BITS - 6))   # the hidden vector's exponent (int_expert's ``sh``), 0..8
        half_sh = Signal(PROD_BITS - 7)         # its rounding constant 2**(sh-1) (0 for sh = 0)
        exp_go = Signal()              # orb is final: find the exponent next
        exp_seg = Signal(range(nseg))
        conv_busy = Signal()
        conv_j = Signal(range(nb_f))
        conv_seg = Signal(range(nseg))
        acc = Array(Signal(signed(self.acc_bits), name=f"acc{i}") for i in range(d))
        y_out = Signal(data.ArrayLayout(signed(self.out_bits), d))
        busy = Signal()
        out_valid = Signal()
        h_ok = Signal()                # h holds the complete hidden vector of segment h_seg
        h_seg = Signal(range(nseg))
        if lat:
            # LatentMoE: z = lat_down(hn), the routed experts' input; their weighted sum in
            # racc (its own accumulators: the shared experts' sums are in acc meanwhile),
            # requantised into zr, lat_up's input.  Padded to whole beats with zeros.
            z = [Signal(signed(8), name=f"z{j}") for j in range(lat)]
            zr = [Signal(signed(8), name=f"zr{j}") for j in range(lat)]
            pad_l = [Const(0, signed(8))] * (nb_l * pb - lat)
            z_slices = Array(Cat(*(z + pad_l)[pb * j: pb * (j + 1)]) for j in range(nb_l))
            zr_slices = Array(Cat(*(zr + pad_l)[pb * j: pb * (j + 1)]) for j in range(nb_l))
            racc = Array(Signal(signed(self.acc_bits), name=f"racc{i}") for i in range(lat))
            z_ok = Signal()            # z is complete (the routed gate rows wait for it)
            zr_ok = Signal()           # zr is complete (lat_up's rows wait for it)

        idx = Array(route.idx)
        wt = Array(route.wt)

        def bank_of(seg):
            rank = (seg - 1 - S)[:len(route.idx[0]) + 8]
            return mode(E + S + seg - 1, Mux(seg <= S, E + seg - 1, idx[rank]))

        # ---- counters: carries registered between chunks that fit the clock ----
        m.d.comb += self.cycles.eq(chunked_counter(m, plan, self.counter_bits, Const(1), "cycles"))
        beat_seen = Signal()
        m.d.sync += beat_seen.eq(self.wport.resp.valid & self.wport.resp.ready)
        # bytes = beats * port_bytes (a power of two): count beats, shift by wiring
        lg_pb = pb.bit_length() - 1
        beats_seen = chunked_counter(m, plan, len(self.weight_bytes) - lg_pb, beat_seen, "beats")
        m.d.comb += self.weight_bytes.eq(Cat(Const(0, lg_pb), beats_seen))

        # ---- token in / out ----
        m.d.comb += [self.tokens.ready.eq(~busy & ~out_valid),
                     self.out.valid.eq(out_valid), self.out.payload.eq(y_out)]
        m.d.comb += start.eq(self.tokens.valid & self.tokens.ready)
        with m.If(start):
            m.d.sync += [busy.eq(1), h_ok.eq(0), x.as_value().eq(self.tokens.payload.as_value())]
            if lat:
                m.d.sync += [z_ok.eq(0), zr_ok.eq(0)]
        delivered = Signal()
        m.d.comb += delivered.eq(self.out.valid & self.out.ready)
        with m.If(delivered):
            m.d.sync += out_valid.eq(0)
        m.d.comb += self.tokens_done.eq(chunked_counter(m, plan, self.counter_bits, delivered, "tokens"))

        # ---- the order of a token's matrices (phases), one function for the requests and
        # the beats: the router, then for each segment s its gate rows, the previous
        # segment's down rows, its up rows, and last the last segment's down rows:
        #   R, G1, U1, G2, D1, U2, G3, D2, U3, D3
        # so the engine streams the next expert's gate rows while this expert's products
        # become its hidden vector (the down rows wait for it), and only the last expert's
        # down rows wait (the conversion: ~35 + d_ff/port_bytes cycles).  A LatentMoE token
        # has lat_down after the router (segment 0: z before any routed expert needs it) and
        # lat_up last (its rows wait for zr, the requantised routed sum):
        #   R, LD, G1, U1, G2, D1, ..., U3, D3, LU
        def next_phase(seg, mat, name):
            """(segment, matrix) of the phase after (seg, mat), and whether (seg, mat) is the last."""
            n_seg = Signal(range(nseg + 1), name=f"{name}_next_seg")
            n_mat = Signal(mat_bits, name=f"{name}_next_mat")
            last = Signal(name=f"{name}_last")
            with m.Switch(mat):
                with m.Case(ROUTER):
                    m.d.comb += [n_seg.eq(Mux(lat_tok, 0, 1)), n_mat.eq(Mux(lat_tok, LDOWN, GATE))]
                with m.Case(GATE):
                    m.d.comb += [n_seg.eq(Mux(seg == 1, seg, seg - 1)), n_mat.eq(Mux(seg == 1, UP, DOWN))]
                with m.Case(UP):
                    m.d.comb += [n_seg.eq(Mux(seg == seg_last, seg, seg + 1)),
                                 n_mat.eq(Mux(seg == seg_last, DOWN, GATE))]
                with m.Case(DOWN):
                    m.d.comb += [n_seg.eq(Mux(lat_tok & (seg == seg_last), 0, seg + 1)),
                                 n_mat.eq(Mux(lat_tok & (seg == seg_last), LUP, UP)),
                                 last.eq(~lat_tok & (seg == seg_last))]
                if lat:
                    with m.Case(LDOWN):
                        m.d.comb += [n_seg.eq(1), n_mat.eq(GATE)]
                    with m.Case(LUP):
                        m.d.comb += last.eq(1)
            return n_seg, n_mat, last

        # ---- requests: one a phase (a matrix of the router or of an expert) ----
        rq_seg = Signal(range(nseg + 1))
        rq_mat = Signal(mat_bits)
        rq_busy = Signal()

        def phase_addr(l, b, mat):
            """The address of matrix ``mat`` of bank b of layer l (the router's for ROUTER, the
            layer's LatentMoE projection for LDOWN / LUP, whatever the bank)."""
            if mat == ROUTER:
                return self.router_addr[l]
            if mat in (LDOWN, LUP):
                return self.lat_addr[l].get(mat, 0)
            return self.bank_addr[l][b].get(mat, 0) if b < self.nbanks else 0
        nmat_idx = 1 << mat_bits
        addr_shape = range(max(phase_addr(l, b, mat) for l in range(L) for b in range(self.nbanks)
                               for mat in range(self.nmat)) + 1)
        req = self.wport.req
        rq_bank = Signal(range(self.nbanks), name="rq_bank")
        m.d.comb += rq_bank.eq(bank_of(rq_seg))
        nb = 1 << len(rq_bank)
        # one constant per (layer, bank, matrix): a lookup of a few address bits, no adder (a
        # dense layer's layout is not a MoE layer's)
        if L == 1:
            phase_addrs = Array(Const(phase_addr(0, b, mat), addr_shape) for b in range(nb) for mat in range(nmat_idx))
            rq_addr = phase_addrs[Cat(rq_mat, rq_bank)]
        else:
            phase_addrs = Array(Const(phase_addr(min(l, L - 1), b, mat), addr_shape)
                                for l in range(1 << len(layer_r)) for b in range(nb) for mat in range(nmat_idx))
            rq_addr = phase_addrs[Cat(rq_mat, rq_bank, layer_r)]
        # rq_seg <= S as a register (the compare in front of the arbiter's grant and the
        # chip's request register was on small's worst path with run-time parameters);
        # a dense layer's segments never wait for the router
        rq_fixed = Signal()
        if L == 1:
            m.d.comb += [req.valid.eq(rq_busy & (rq_fixed | route.idx_valid)),
                         req.payload.addr.eq(rq_addr)]
        else:
            # the (layer, bank) lookup after bank_of made the address path to the port
            # model-small's worst (-0.08 ns at 1 ns, before the arbiter): the address is a
            # register, a cycle behind rq_seg and idx, so a request waits a cycle after the
            # previous one is taken (hidden: each streams >= E row beats) and a routed one a
            # cycle after idx is valid; the token's first address is loaded at acceptance
            # (the router's, or a dense layer's first chunk), so the first request is not late
            rq_addr_r = Signal(addr_shape, name="rq_addr")
            rq_moved = Signal(name="rq_moved")
            idx_valid_r = Signal(name="idx_valid_r")
            first_addr = Array(Const(self.router_addr[l] if self.mixers[l] == "moe" else
                                     self.bank_addr[l][E + S][GATE], addr_shape) for l in range(L))[self.layer]
            m.d.sync += [rq_addr_r.eq(Mux(start, first_addr, rq_addr)),
                         rq_moved.eq(req.valid & req.ready), idx_valid_r.eq(route.idx_valid)]
            m.d.comb += [req.valid.eq(rq_busy & ~rq_moved & (rq_fixed | idx_valid_r)),
                         req.payload.addr.eq(rq_addr_r)]
        if lat:
            # a routed expert's matrices are at the latent width: (matrix, routed) -> beats; a
            # MoE token's requests past the shared experts are routed ones (rq_fixed low)
            beats_of = {ROUTER: self.router_beats, LDOWN: lat * nb_d, LUP: d * nb_l}
            for mat, (shared, routed) in {GATE: (f * nb_d, f * nb_l), UP: (f * nb_d, f * nb_l),
                                          DOWN: (d * nb_f, lat * nb_f)}.items():
                beats_of[mat], beats_of[mat + 8] = shared, routed
            phase_beats = Array(beats_of.get(i, 0) for i in range(16))
            m.d.comb += req.payload.beats.eq(phase_beats[Cat(rq_mat, ~rq_fixed)])
        else:
            phase_beats = Array([self.router_beats, f * nb_d, f * nb_d, d * nb_f])
            m.d.comb += req.payload.beats.eq(phase_beats[rq_mat])
        rq_next_seg, rq_next_mat, rq_last = next_phase(rq_seg, rq_mat, "rq")
        with m.If(start):
            # MoE: the router (segment 0, <= S); dense: segment 1's gate, the first chunk
            m.d.sync += [rq_seg.eq(mode(1, 0, dense_now)), rq_mat.eq(mode(GATE, ROUTER, dense_now)),
                         rq_busy.eq(1), rq_fixed.eq(1)]
        with m.If(req.valid & req.ready):
            # a routed expert's matrices wait for its index (segments > S)
            m.d.sync += [rq_seg.eq(rq_next_seg), rq_mat.eq(rq_next_mat), rq_fixed.eq(mode(1, rq_next_seg <= S))]
            with m.If(rq_last):
                m.d.sync += rq_busy.eq(0)

        # ---- beat sequencer: response beats -> engine beats ----
        c_seg = Signal(range(nseg))
        c_mat = Signal(mat_bits)       # GATE, UP, DOWN within an expert; ROUTER (LDOWN, LUP) in segment 0
        c_row = Signal(range(max(E, d, f)))
        c_beat = Signal(range(max(nb_d, nb_f)))
        c_busy = Signal()
        with m.If(start):
            m.d.sync += [c_seg.eq(mode(1, 0, dense_now)), c_mat.eq(mode(GATE, ROUTER, dense_now)),
                         c_row.eq(0), c_beat.eq(0), c_busy.eq(1)]
        is_down = Signal()
        m.d.comb += is_down.eq(c_mat == DOWN)
        if lat:
            # a LatentMoE token's routed experts (segments > S) work at the latent width: a
            # register, set as their phases begin (c_next_seg is known a phase ahead)
            c_routed = Signal(name="c_routed")
            row_beats, rows = Signal(range(max(nb_d, nb_f) + 1)), Signal(range(max(E, d, f) + 1))
            with m.Switch(c_mat):
                for mat, (n_rows, n_beats) in {ROUTER: (E, nb_d), LDOWN: (lat, nb_d), LUP: (d, nb_l)}.items():
                    with m.Case(mat):
                        m.d.comb += [rows.eq(n_rows), row_beats.eq(n_beats)]
                with m.Case(GATE, UP):
                    m.d.comb += [rows.eq(f), row_beats.eq(Mux(c_routed, nb_l, nb_d))]
                with m.Case(DOWN):
                    m.d.comb += [rows.eq(Mux(c_routed, lat, d)), row_beats.eq(nb_f)]
        else:
            row_beats = Mux(is_down, nb_f, nb_d)
            rows = Mux(c_mat == ROUTER, E, Mux(is_down, d, f))
        bank = Signal(range(self.nbanks))
        if not C:
            m.d.comb += bank.eq(bank_of(c_seg))     # (with dense chunks: a register, below)
        c_next_seg, c_next_mat, c_last = next_phase(c_seg, c_mat, "c")
        phase_end = Signal()
        # (a) a down projection needs this expert's complete hidden vector,
        # (b) a routed expert's down results need its routing weight.
        # LatentMoE: (c) a routed expert's gate rows need z, (d) lat_up's rows need zr.
        hold = Signal()
        first_beat = (c_row == 0) & (c_beat == 0)
        m.d.comb += hold.eq(is_down & first_beat &
                            ~(h_ok & (h_seg == c_seg) & mode(1, (c_seg <= S) | route.wt_valid)))
        if lat:
            with m.If(first_beat & (((c_mat == GATE) & c_routed & ~z_ok) | ((c_mat == LUP) & ~zr_ok))):
                m.d.comb += hold.eq(1)
        resp = self.wport.resp
        beat = Signal()
        # the engine is always ready (its results go into a pipeline that never stalls)
        m.d.comb += [resp.ready.eq(c_busy & ~hold), beat.eq(resp.valid & resp.ready),
                     phase_end.eq(beat & (c_beat == row_beats - 1) & (c_row == rows - 1))]
        if C:
            # with the dense chunks' banks the bank selects among E + S + C values of every
            # (m, s): from c_seg through bank_of and that mux into the engine's input register
            # and down_shift was model-small's worst path (-0.04 ns at 1 ns).  So the bank is a
            # register: the next phase's segment's, computed a cycle ahead, taken when a phase
            # ends, and otherwise the current one's (a routed segment's idx may come after its
            # start; its first beat comes later still: requested once idx is valid, one latency
            # on).  A beat's bank is then right as long as no phase is one beat long (>= 2).
            bank_next = Signal.like(bank, name="bank_next")
            m.d.sync += [bank_next.eq(bank_of(c_next_seg)), bank.eq(Mux(phase_end, bank_next, bank_of(c_seg)))]
        with m.If(beat & is_down & (c_row == 0) & (c_beat == 0)):
            m.d.sync += h_ok.eq(0)     # h now belongs to this segment's down rows only
        if lat:
            with m.If(start):
                m.d.sync += c_routed.eq(0)
            with m.If(phase_end):
                m.d.sync += c_routed.eq(lat_tok & (c_next_seg > S))   # (lat_up: segment 0)

        x_slices = Array(x.as_value()[8 * pb * j: 8 * pb * (j + 1)] for j in range(nb_d))
        h_slices = Array(Cat(*h[pb * j: pb * (j + 1)]) for j in range(nb_f))
        kind_m = {ROUTER: prm.router.m, GATE: per_bank("gate_m")[bank],
                  UP: per_bank("up_m")[bank], DOWN: per_bank("down_m")[bank]}
        if lat:
            kind_m.update({LDOWN: prm.lat_down.m, LUP: prm.lat_up.m})
        # the down projection's shift absorbs the hidden exponent of this expert
        # (down_s >= 1 + the largest exponent: hw/image/param_map.py's range)
        # down_s - hid_sh as a register (the subtraction before the engine's shift input was
        # small's worst path), of the segment whose down rows come next (dn_seg: the one whose
        # up rows ended last; its down rows follow the next segment's gate rows), its bank a
        # register before: both settle long before a down beat can go (the beat waits for
        # h_ok, set after the conversion that follows hid_sh, ~10 cycles after the up rows)
        dn_seg = Signal(range(nseg), name="dn_seg")
        dn_bank = Signal(range(self.nbanks), name="dn_bank")
        with m.If(phase_end & (c_mat == UP)):
            m.d.sync += dn_seg.eq(c_seg)
        down_shift = Signal.like(per_bank("down_s")[0], name="down_shift")
        m.d.sync += [dn_bank.eq(bank_of(dn_seg)), down_shift.eq(per_bank("down_s")[dn_bank] - hid_sh)]
        kind_s = {ROUTER: prm.router.s, GATE: per_bank("gate_s")[bank],
                  UP: per_bank("up_s")[bank], DOWN: down_shift}
        if lat:
            kind_s.update({LDOWN: prm.lat_down.s, LUP: prm.lat_up.s})
        # the engine's vector: hn, the hidden vector (down rows), or a LatentMoE's z (routed
        # gate and up rows) or zr (lat_up's rows)
        x_in = Signal(8 * pb, name="x_in")
        m.d.comb += x_in.eq(Mux(is_down, h_slices[c_beat], x_slices[c_beat]))
        if lat:
            with m.If(c_mat == LUP):
                m.d.comb += x_in.eq(zr_slices[c_beat])
            with m.Elif(c_routed & ~is_down):
                m.d.comb += x_in.eq(z_slices[c_beat])
        ei = eng.i.payload
        with m.Switch(c_mat):
            for kind in kind_m:
                with m.Case(kind):
                    m.d.comb += [ei.mult.eq(kind_m[kind]), ei.shift.eq(kind_s[kind])]
        m.d.comb += [
            eng.i.valid.eq(beat),
            ei.w.as_value().eq(resp.payload.data),
            ei.x.as_value().eq(x_in),
            ei.first.eq(c_beat == 0),
            ei.last.eq(c_beat == row_beats - 1),
            ei.tag.kind.eq(c_mat), ei.tag.row.eq(c_row), ei.tag.seg.eq(c_seg),
        ]
        if self.situ:
            m.d.comb += ei.tag.bank.eq(bank)
        with m.If(beat):
            m.d.sync += c_beat.eq(c_beat + 1)
            with m.If(c_beat == row_beats - 1):
                m.d.sync += [c_beat.eq(0), c_row.eq(c_row + 1)]
                with m.If(c_row == rows - 1):
                    m.d.sync += [c_row.eq(0), c_seg.eq(c_next_seg), c_mat.eq(c_next_mat)]
                    with m.If(c_last):
                        m.d.sync += c_busy.eq(0)

        # ---- result pipeline (never stalls) ----
        def reg(name, shape, value, reset_less=True):
            r = Signal(shape, name=name, reset_less=reset_less)
            m.d.sync += r.eq(value)
            return r

        # stage S: the engine's result clamped to the width of its consumer (the
        # engine saturated it to the widest), registered with its tag
        eo = eng.o.payload
        y_kind = Signal(eo.y.shape(), name="y_kind")
        with m.Switch(eo.tag.kind):
            for kind, bits in self.kind_bits.items():
                with m.Case(kind):
                    m.d.comb += y_kind.eq(saturate(eo.y, bits) if bits < len(eo.y) else eo.y)
        c_valid = reg("c_valid", 1, eng.o.valid, reset_less=False)
        c_kind = reg("c_kind", mat_bits, eo.tag.kind)
        c_row_r = reg("c_row_r", eo.tag.row.shape(), eo.tag.row)
        c_seg_r = reg("c_seg_r", eo.tag.seg.shape(), eo.tag.seg)
        if self.situ:
            c_bank = reg("c_bank", eo.tag.bank.shape(), eo.tag.bank)
        c_y = reg("c_y", eo.y.shape(), y_kind)

        # stage C: tables addressed by the requantised code
        m.d.comb += [score_lut.addr.eq(c_y), score_lut.en.eq(c_valid & (c_kind == ROUTER))]
        if self.situ:
            # SiTU-GLU: the gate code (SITU's fixed input format, clamped at stage S) reads the
            # config's SITU table (ROM logic, one cycle like the score table): int8 at the fixed
            # scale, into sbuf at stage T
            m.submodules.situ_lut = situ_lut = LookupTable(situ_in_bits(fm), signed(fm.act_bits))
            drive_constant(m, situ_lut, situ_table(fm))
            m.d.comb += [situ_lut.addr.eq(c_y[:situ_in_bits(fm)].as_signed()),
                         situ_lut.en.eq(c_valid & (c_kind == GATE))]
        else:
            # gate codes: SiLU = c * sigmoid (hw/arith/silu.py) over a few stages into sbuf, with the
            # MoE layer's (t_m, t_s, m, s) or, by the token's kind, a dense layer's
            if len(kinds) > 1:
                silu_ops, silu_op = [prm.silu, dprm.silu], dense_r
            else:
                silu_ops, silu_op = [(dprm if self.has_dense else prm).silu], Const(0, 1)
            sp = Pipe(m, plan, "silu")
            s_live = silu(sp, {"valid": c_valid & (c_kind == GATE), "row": c_row_r,
                               "code": c_y[:fm.lut_in_bits].as_signed(), "op": silu_op}, "code", "op",
                          [(p.t_m, p.t_s, p.m, p.s) for p in silu_ops], self.silu_shape.width, fm)
            s_live = sp.register(s_live)
            # the up row j reads sbuf[j] at stage T: it comes f rows of nb_d beats after gate row j
            if f * nb_d <= sp.stages:
                raise ConfigError(f"model.d_ff = {f}: the SiLU pipeline ({sp.stages} stages) is longer than "
                                  f"the {f * nb_d} cycles between a gate row and its up row")
            for j in range(f):
                with m.If(s_live["valid"] & (s_live["row"] == j)):
                    m.d.sync += sbuf[j].eq(s_live["silu"])

        # SiTU-GLU: every row for stage O (up, down, lat_up) passes the up cap's pipeline (the
        # up rows' 25 tanh(u/25) = c * CAP[t], hw/arith/situ.py, with their bank's (t_m, t_s)),
        # the others alongside it, so stage O sees the rows in their order, a few cycles later
        if self.situ:
            cp = Pipe(m, plan, "cap")
            c_live = {"valid": c_valid, "kind": c_kind, "row": c_row_r, "seg": c_seg_r, "y": c_y, "bank": c_bank,
                      "code": c_y[:fm.act_bits].as_signed()}
            cap_params = list(zip(per_bank_list("cap_t_m"), per_bank_list("cap_t_s")))
            c_live = up_cap(cp, c_live, "code", "bank", cap_params, fm)
            c_live = cp.spend(delays.mux_level, c_live)
            capped = Signal(c_y.shape(), name="cap_y")
            m.d.comb += capped.eq(Mux(c_live["kind"] == UP, c_live.pop("cap"), c_live["y"]))
            c_live = cp.register({**c_live, "y": capped})
            q_valid, q_kind, q_row, q_seg, q_y = (c_live[n] for n in ("valid", "kind", "row", "seg", "y"))
            # an up row reads sbuf[j] when it leaves the cap's pipeline; the next expert's gate row j
            # (its rows follow this expert's up rows) writes it f rows of nb_d beats after it entered
            if f * nb_d <= cp.stages + 1:
                raise ConfigError(f"model.d_ff = {f}: the up cap's pipeline ({cp.stages} stages) is longer than "
                                  f"the {f * nb_d} cycles between an up row and the next expert's gate row")

        t_valid = reg("t_valid", 1, c_valid, reset_less=False)
        t_kind = reg("t_kind", mat_bits, c_kind)
        t_row = reg("t_row", c_row_r.shape(), c_row_r)
        t_seg = reg("t_seg", c_seg_r.shape(), c_seg_r)
        t_y = reg("t_y", c_y.shape(), c_y)
        if self.situ:
            # SITU's output: the gate row's act into sbuf
            with m.If(t_valid & (t_kind == GATE)):
                for j in range(f):
                    with m.If(t_row == j):
                        m.d.sync += sbuf[j].eq(situ_lut.data)
        else:
            q_valid, q_kind, q_row, q_seg, q_y = t_valid, t_kind, t_row, t_seg, t_y
        # the selection bias of this router row, looked up while the table reads
        bias = Array(prm.bias[e] for e in range(E))
        t_bias = reg("t_bias", signed(key_bits), bias[c_row_r[:max(1, (E - 1).bit_length())]])

        # stage T: table outputs valid.  Router: the choice key is registered
        # before the top-k compare; gate: the SiLU value goes into the buffer;
        # up/down: the multiplier operands are registered (buffer / weight read)
        k_valid = reg("k_valid", 1, t_valid & (t_kind == ROUTER), reset_less=False)
        k_key = reg("k_key", signed(key_bits), score_lut.data + t_bias)
        k_tag = reg("k_tag", unsigned(score_bits), score_lut.data)
        m.d.comb += [topk.inp.valid.eq(k_valid), topk.inp.payload.key.eq(k_key),
                     topk.inp.payload.tag.eq(k_tag)]
        if lat:
            # lat_down's rows: z, int8 (clamped at stage S)
            with m.If(t_valid & (t_kind == LDOWN)):
                for j in range(lat):
                    with m.If(t_row == j):
                        m.d.sync += z[j].eq(t_y[:8])
                with m.If(t_row == lat - 1):
                    m.d.sync += z_ok.eq(1)
        rank = (q_seg - 1 - S)[:max(1, (k - 1).bit_length())]
        # down: routed experts weigh by wt, shared ones by 1.0 = 1 << wn_frac
        # (a dense layer's chunks all weigh 1.0)
        weight = mode(1 << fm.wn_frac, Mux(q_seg <= S, 1 << fm.wn_frac, wt[rank]))
        # lat_up's rows join the combine as a shared expert's down rows do (weight 1.0: its
        # segment is 0)
        summed = (q_kind == DOWN) | (q_kind == LUP) if lat else q_kind == DOWN
        o_valid = reg("o_valid", 1, q_valid & ((q_kind == UP) | summed), reset_less=False)
        o_kind = reg("o_kind", mat_bits, q_kind)
        o_row = reg("o_row", q_row.shape(), q_row)
        o_seg = reg("o_seg", q_seg.shape(), q_seg)
        o_a = reg("o_a", signed(max(PROD_BITS + 1, self.widths["route_weight"] + 1)),
                  Mux(q_kind == UP, Array(sbuf)[q_row[:max(1, (f - 1).bit_length())]], weight))
        o_b = reg("o_b", q_y.shape(), q_y)
        # the running sum this row adds to, chosen here (a register into stage O's read mux):
        # the first contributing segment starts from zero; a LatentMoE token's routed experts
        # sum in racc (the first routed segment from zero), lat_up's rows in acc
        if lat:
            routed_sum = (q_kind == DOWN) & lat_tok & (q_seg > S)
            o_racc = reg("o_racc", 1, routed_sum)
            o_from_racc = reg("o_from_racc", 1, routed_sum & (q_seg != S + 1))
            o_from_acc = reg("o_from_acc", 1, ((q_kind == DOWN) & ~routed_sum & (q_seg != 1)) |
                             ((q_kind == LUP) & (S > 0)))
        else:
            o_from_acc = reg("o_from_acc", 1, (q_kind == DOWN) & (q_seg != 1))

        # stage O: the product, SiLU * up, or for the down rows weight * expert
        # output + the row's running sum (one more word of the same carry-save
        # tree; the first contributing segment starts from zero).  Registers
        # where the clock needs them (hw/arith/pipeline.py).
        acc_bits = self.acc_bits
        prod_bits = acc_bits + 1
        mul = Pipe(m, plan, "mul")
        live = {"valid": o_valid, "kind": o_kind, "row": o_row, "seg": o_seg, "a": o_a, "b": o_b,
                "from_acc": o_from_acc}
        if lat:
            live.update(racc=o_racc, from_racc=o_from_racc)
        live = mul.spend(delays.mux_level * max(1, (d - 1).bit_length()), live)
        prev = Signal(signed(acc_bits), name="mul_prev")
        m.d.comb += prev.eq(Mux(live.pop("from_acc"), acc[live["row"][:max(1, (d - 1).bit_length())]], 0))
        if lat:
            with m.If(live.pop("from_racc")):
                m.d.comb += prev.eq(racc[live["row"][:max(1, (lat - 1).bit_length())]])
        live = booth_multiply(mul, live, live.pop("a"), live.pop("b"), prod_bits, "p",
                              extra_words=[sign_extend(prev, prod_bits)])
        live = mul.register(live)
        u_valid, u_kind, u_row, u_seg = (live[n] for n in ("valid", "kind", "row", "seg"))
        u_racc = live["racc"] if lat else Const(0, 1)
        u_val = live["p"].as_signed()

        # stage U, up: the product goes into its buffer; the OR of
        # the magnitudes has the bit length of max|prod| (the hidden exponent)
        prod16 = u_val[:PROD_BITS + 1].as_signed()
        magnitude = Mux(prod16 < 0, -prod16, prod16)[:PROD_BITS]
        with m.If(u_valid & (u_kind == UP)):
            for j in range(f):
                with m.If(u_row == j):
                    m.d.sync += pbuf[j].eq(prod16)
            m.d.sync += orb.eq(Mux(u_row == 0, 0, orb) | magnitude)
            with m.If(u_row == f - 1):
                m.d.sync += [exp_go.eq(1), exp_seg.eq(u_seg)]
        # a cycle later, orb final: the leading one gives sh = max(0, bitlen - 7)
        with m.If(exp_go):
            bl = Signal(range(PROD_BITS + 1))
            for i in range(PROD_BITS):
                with m.If(orb[i]):
                    m.d.comb += bl.eq(i + 1)
            sh_new = Mux(bl > fm.act_bits - 1, bl - (fm.act_bits - 1), 0).as_unsigned()[:4]
            m.d.sync += [exp_go.eq(0), hid_sh.eq(sh_new), half_sh.eq((Const(1, PROD_BITS - 6) << sh_new) >> 1),
                         conv_busy.eq(1), conv_j.eq(0), conv_seg.eq(exp_seg)]

        # the hidden vector, pb values per cycle: sat8(round_shift(prod, sh)):
        # slice read, rounding add, shift, saturate, staged by the clock
        with m.If(conv_busy):
            m.d.sync += conv_j.eq(conv_j + 1)
            with m.If(conv_j == nb_f - 1):
                m.d.sync += conv_busy.eq(0)
        cv = Pipe(m, plan, "cv")
        live = {"valid": conv_busy, "j": conv_j, "last": conv_j == nb_f - 1}
        live = cv.spend(delays.mux_level * max(1, (nb_f - 1).bit_length()), live)
        lanes_in = [Array(pbuf_padded[j * pb + i] for j in range(nb_f))[live["j"]] for i in range(pb)]
        live = cv.spend(delays.adder(PROD_BITS + 2), {**live, "v": lanes_in})
        rounded = [prefix_add(m, sign_extend(v, PROD_BITS + 2), half_sh, PROD_BITS + 2, f"cv_round{i}")
                   for i, v in enumerate(live.pop("v"))]
        live = cv.spend(delays.mux_level * len(hid_sh), {**live, "v": rounded})
        shifted = [(v.as_signed() >> hid_sh) for v in live.pop("v")]
        # hid_sh fans out to pb x 17 shift muxes (a buffer tree of ~0.7 ns on small): the
        # saturation goes to the next stage, whatever the plan says
        live = cv.register({**live, "v": shifted})
        live = cv.spend(delays.saturate, live)
        live = cv.register({**live, "v": [saturate(v, fm.hid_bits) for v in live.pop("v")]})
        with m.If(live["valid"]):
            for j in range(nb_f):
                with m.If(live["j"] == j):
                    m.d.sync += [h[j * pb + i].eq(v) for i, v in enumerate(live["v"])]
            with m.If(live["last"]):
                m.d.sync += [h_ok.eq(1), h_seg.eq(conv_seg)]

        # stage U, down: the running sum goes back into the accumulators (a
        # registered value into a decoded write; the same row is read again
        # at least d_model results later)
        u_summed = (u_kind == DOWN) | (u_kind == LUP) if lat else u_kind == DOWN
        with m.If(u_valid & u_summed & ~u_racc):
            for i in range(d):
                with m.If(u_row == i):
                    m.d.sync += acc[i].eq(u_val[:acc_bits])
        if lat:
            with m.If(u_valid & u_racc):
                for i in range(lat):
                    with m.If(u_row == i):
                        m.d.sync += racc[i].eq(u_val[:acc_bits])

        # stage V, the last segment's sums: requantised by (comb_m, comb_s): Booth
        # tree with the rounding word, one split add, the barrel shift by comb_s
        # (clamped to the product's width: a larger shift gives 0 as well),
        # saturation in its own stage, then into the output
        # A LatentMoE token passes twice: its last (routed) segment's sums, in racc, become zr
        # by (lat_m, lat_s) (int8: the resid_bits result saturated once more, as
        # sat8(sat16(v)) == sat8(v)); then lat_up's rows, in acc, the output by (comb_m, comb_s).
        comb = Pipe(m, plan, "comb")
        last_seg = u_seg == seg_last
        live = {"valid": u_valid & (((u_kind == DOWN) & last_seg) | ((u_kind == LUP) if lat else 0)),
                "row": u_row}
        if lat:
            live["zr"] = u_racc
        comb_m_bits = self.pmap["moe.comb_m"].bits
        prod_signed = acc_bits + comb_m_bits          # |acc * comb_m| < 2**(prod_signed - 1)
        rq_bits = prod_signed + 1                     # + the rounding of a shift by prod_signed
        # the static (m, s) and the rounding word decoded from s are registered once, a
        # cycle behind the bank: no path runs from the bank through the clamp and the
        # decode into the product tree
        comb_m = Signal(comb_m_bits, name="comb_mult", reset_less=True)
        comb_s = Signal(range(prod_signed + 1), name="comb_shift", reset_less=True)
        comb_rnd = Signal(rq_bits, name="comb_rounding", reset_less=True)
        # (and behind dense_r: a dense layer's token takes dense_params' pair)
        prm_comb_m = mode(dprm.comb_m, prm.comb_m) if dprm is not None else prm.comb_m
        prm_comb_s = mode(dprm.comb_s, prm.comb_s) if dprm is not None else prm.comb_s
        if lat:
            # (and the LatentMoE's pair until zr is complete: set long before lat_up's rows come)
            if self.pmap["moe.lat_m"].bits != comb_m_bits:
                raise ConfigError("parameters moe.lat_m and moe.comb_m: the combine needs one width")
            prm_comb_m = Mux(lat_tok & ~zr_ok, prm.lat_m, prm_comb_m)
            prm_comb_s = Mux(lat_tok & ~zr_ok, prm.lat_s, prm_comb_s)
        m.d.sync += [comb_m.eq(prm_comb_m), comb_s.eq(clamp_shift(prm_comb_s, prod_signed)),
                     comb_rnd.eq(rounding_word(clamp_shift(prm_comb_s, prod_signed), rq_bits))]
        live = booth_multiply(comb, live, u_val[:acc_bits].as_signed(), comb_m, rq_bits, "p",
                              extra_words=[comb_rnd])
        # the shift travels with the value (a copy per stage) rather than being read from
        # comb_shift at every level: one register steering every level was the small
        # unit's worst path (its fan-out buffers, -0.026 ns at 1 ns)
        live = barrel_shift_saturate(comb, {**live, "comb_s": comb_s}, "p", "comb_s", rq_bits, len(comb_s), "y",
                                     out_widths=[self.out_bits])
        live.pop("comb_s")
        live = comb.register(live)
        # rows arrive in order: the output (and zr) is a shift register, no row decode
        out_row = live["valid"] & ~live["zr"] if lat else live["valid"]
        with m.If(out_row):
            m.d.sync += y_out.as_value().eq(Cat(y_out.as_value()[self.out_bits:], live["y"]))
            with m.If(live["row"] == d - 1):
                m.d.sync += [out_valid.eq(1), busy.eq(0)]
        if lat and not self.exit_norm:
            with m.If(live["valid"] & live["zr"]):
                m.d.sync += Cat(*zr).eq(Cat(*zr[1:], saturate(live["y"], fm.act_bits)))
                with m.If(live["row"] == lat - 1):
                    m.d.sync += zr_ok.eq(1)
        if self.exit_norm:
            # K3's exit norm (model.latent_exit_norm): the sum by (lat_m, lat_s) at resid_bits
            # into zp (a shift register, rows in order), then its RMSNorm (hw/kda/norm.py, the
            # layers' integer RMSNorm, int_normalize) writes zr by index; lat_up's rows wait
            # for zr_ok as before.  The unit has its own normaliser: the chip's shared one
            # (hw/chip/datapath.py) serves the other stage's token meanwhile, and this one runs
            # once a token for l values (2 l + ~30 cycles), on the token's critical chain.
            zp = [Signal(signed(self.out_bits), name=f"zp{j}") for j in range(lat)]
            m.submodules.exit_norm = nrm = Normalizer(fm, lat, self.out_bits, lat_norm_ss_bits(cfg), [fm.act_bits],
                                                      param_layout(cfg, "moe.lat_norm"),
                                                      clock_period_ns=cfg.hw.clock_period_ns)
            zp_full = Signal()          # the last row is in zp: start the norm next cycle
            nrm_run = Signal()
            m.d.comb += [nrm.norms[0].eq(prm.lat_norm), nrm.mode.eq(0), nrm.rd_x.eq(Array(zp)[nrm.rd_idx]),
                         nrm.start.eq(zp_full)]
            m.d.sync += zp_full.eq(0)
            with m.If(live["valid"] & live["zr"]):
                m.d.sync += Cat(*zp).eq(Cat(*zp[1:], live["y"]))
                with m.If(live["row"] == lat - 1):
                    m.d.sync += zp_full.eq(1)
            with m.If(nrm.wr_en):
                for j in range(lat):
                    with m.If(nrm.wr_idx == j):
                        m.d.sync += zr[j].eq(nrm.wr_y)
            with m.If(zp_full):
                m.d.sync += nrm_run.eq(1)
            with m.Elif(nrm_run & ~nrm.busy):
                m.d.sync += [nrm_run.eq(0), zr_ok.eq(1)]
        m.d.comb += route.release.eq(out_row & (live["row"] == d - 1))
        return m

