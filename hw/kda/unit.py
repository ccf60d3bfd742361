"""The KDA token mixer: one int8 token in, one int8 token out, constant work per token.

Implements ``model.int_kda.int_kda_step`` bit for bit.  The RTL is a
function of the config alone: weights live in the external weight memory,
read through ``wport``; every other per-model value - requantisation (m, s),
the f_up bias, short-conv taps, the six tables, the norm constants and the
delta rule's shifts - comes in on ``params`` (the KDA's slice of the parameter
bank, laid out by hw/image/param_map.py ``param_layout(cfg, "kda")``), so one netlist
runs any quantised model.  ``params`` must be stable while tokens are in
flight (and from a cycle before the first): the blocks register what they
derive from it.  A test drives ``region_value(cfg, qlayer.to_flat(), "kda")``.

Ports
-----
``i``   stream, one beat per token: ``x`` (d_model int8, the normalised input
        xn) and ``first`` (a new sequence starts here for the token's layer: that
        layer's delta-rule state and short-convolution history are cleared before
        this token; the other layers' are kept).
``layer`` the token's layer, 0 .. L-1 (hw/image/memory_map.py ``layer_count``,
        ``layer_bits`` wide; on the layer chip L = 1 and the port is ignored).
``slot``  the token's sequence slot, 0 .. S-1 (``hw.sequences``; ignored when S = 1): the
        state and history are those of context ``slot * K + k`` for the k-th of the K KDA
        layers (all L of them unless the model is a hybrid); the weights are the layer's.
        Sampled in the cycle ``i`` is accepted, with ``first``, and used for
        everything of that token: its weight addresses (``layer_prefix``: the
        layer's own regions), its state and history.  It may change as soon as
        the token is accepted.  ``params`` must then be the layer's block (the
        top loads it between tokens, under the rule below).
``o``   stream, one beat per token: d_model int8.
``wport`` weight port (hw/chip/weight_port.py).
``params`` the per-model values (hw/image/param_map.py).
``cycles`` free-running cycle counter; ``token_cycles`` the cycles the last
        token took from its acceptance on ``i`` to its offer on ``o``;
        ``tokens`` tokens completed.  For tests and reports.
``mac_beat`` the engine's ``beat``: one beat of hw.lanes MACs (the chip's MACS counter).

Schedule of one token (all phases in sequence; W = weight_port_bytes = lanes)
--------------------------------------------------------------------------
1. ACCEPT  latch x; the weight read of the projections (every KDA tensor but
           W_o, stored contiguously in the order used below).
2. PROJ    the response beats drive the shared engine (hw/arith/matvec.py) directly,
           one beat per cycle when the memory keeps up: q, k, v, f_down, g_down, b (input x),
           f_up (input fd: waits for the f_down results), g_up (input gd).
           Results are requantised (f_up after adding its bias) and routed:
           q/k/v -> short conv -> requant -> SiLU (c * sigmoid); b -> beta table;
           f_up -> alpha table; g_up -> gate table; fd, gd -> registers.
           ~ (3 H d_k + 2 r + H) ceil(d/W) + 2 H d_k ceil(r/W) cycles.
3. NORM    L2 normalisation of q then k, head by head, on the shared
           normaliser (hw/kda/norm.py): 2 H (2 d_k + rsqrt latency + 12) cycles.
4. DELTA   the state update and read (hw/kda/delta.py): the two passes of
           neighbouring columns interleave, about H d_v max(2 d_k / state_lanes,
           the column latency of its clock-derived pipelines) cycles.
5. ONORM   RMSNorm of o per head on the same normaliser, times the gate.
6. WO      the weight read of W_o goes out only now, then its beats (input zo):
           d ceil(H d_v / W) cycles, then the output.  W_o is requested apart
           because the memory answers in request order: W_o beats requested at
           ACCEPT would sit in the chip's one weight port (hw/chip/weight_arbiter.py)
           through NORM, DELTA and ONORM and block the MoE of the previous token.
           Costs the memory latency once per token.
Layers: a model's L layers run on this one unit, one token of one layer at a
time, in any order.  Per layer the unit keeps its own delta-rule state (hw/kda/state.py:
L states, the layer the high part of the word address) and short-convolution history
(hw/kda/short_conv.py); every weight request is one of L per-layer constants.  Nothing
else is per layer: the schedule and the cycles of a token are those of one layer
(model-tiny without stalls: 902 cycles per token, every layer, as tiny).

No phase depends on the number of tokens seen: cycles per token are constant
(the tests measure token 16 against token 4096).  Measured without stalls
(``token_cycles``; sim/tests/block/test_kda_unit.py's run_kda with stall=False):
tiny 902, small 3386 cycles per token, against a weight-port floor of 324
and 1224 (bytes / port width); 887 / 3341 with the model's values baked in as
constants (the run-time shifts' barrels lengthen the delta rule's column loop
and the requantisers).  ``kda.f_q`` is not read: q's scale is folded into the
q norm's (m, s).
"""
from __future__ import annotations

from types import SimpleNamespace

from amaranth import Array, Cat, Const, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.counter import event_counter
from hw.arith.matvec import MatVecEngine, port_groups
from hw.arith.pipeline import plan_pipeline
from hw.arith.rsqrt import rsqrt_client_signature
from hw.stream.weight_port import WeightPortSignature, split_request
from hw.image.memory_map import (layer_bits, layer_count, layer_prefix, memory_map, mixer_layers, sequence_slots,
                                 slot_bits, state_contexts)
from hw.image.param_map import (KDA_MATRICES, conv_taps_in_sram, kda_norm_ss_bits, param_layout, param_map, structural,
                                table_shape, tap_words)
from hw.kda.delta import DeltaRule
from hw.kda.norm import Normalizer, norm_rsqrt_bits
from hw.kda.phases import KdaPhases
from hw.kda.rows import ProjectionRequantiser, QkvActivation
from hw.kda.short_conv import tap_write_signature
from hw.proj.requests import unit_layer
from hw.proj.results import GatedProduct, PendingRows, TableStage
from hw.proj.sequencer import ProjectionSequencer, connect_weight_port, input_group
from moekda.config import ConfigError
from moekda.formats import formats_for

# the projections in weight-memory order (hw/image/param_map.py KDA_MATRICES): (op,
# memory-map tensor, QKDA field, input vector); the op's name and input per QKDA field
_OP_INPUT = {"q_proj": ("q", "x"), "k_proj": ("k", "x"), "v_proj": ("v", "x"), "f_down": ("fd", "x"),
             "g_down": ("gd", "x"), "b_proj": ("b", "x"), "f_up": ("fu", "fd"), "g_up": ("gu", "gd"),
             "o_proj": ("o", "zo")}
OPS = [(_OP_INPUT[field][0], f"kda.{region}", field, _OP_INPUT[field][1]) for region, field, _, _ in KDA_MATRICES]
OP = {name: n for n, (name, *_rest) in enumerate(OPS)}


def token_layout(d_model: int, act_bits: int) -> data.StructLayout:
    return data.StructLayout({"x": data.ArrayLayout(signed(act_bits), d_model), "first": 1})


def kda_requests(cfg, layer: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The weight reads of one token of ``layer`` as ``(byte address, beats)`` requests:
    (the projections', issued at ACCEPT; W_o's, issued when the unit can take
    W_o).  Each is cut to what one request's ``beats`` field carries."""
    mm = memory_map(cfg)
    W = cfg.hw.weight_port_bytes
    prefix = layer_prefix(cfg, layer)

    def reads(tensors):
        addr, nbytes = mm.span([prefix + t for t in tensors])
        return split_request(addr, nbytes // W, W)
    return reads([t for op, t, _, _ in OPS if op != "o"]), reads(["kda.w_o"])


def vec(name, n, shape):
    return [Signal(shape, name=f"{name}{i}") for i in range(n)]


def view(regs, n, shape):
    """The first ``n`` registers of ``regs`` read as ``shape`` (their low bits)."""
    shape = Shape.cast(shape)
    assert n <= len(regs) and all(len(reg) >= shape.width for reg in regs[:n])
    return [reg[:shape.width].as_signed() if shape.signed else reg[:shape.width] for reg in regs[:n]]


def token_registers(fm, d, H, dk, dv, r) -> SimpleNamespace:
    """The registers holding a token's vectors.  The phases run in sequence, so a vector
    whose last reader is done can hand its registers on to one written later (docs/chip.md
    "The KDA unit's registers"):
      x  (ACCEPT .. the x projections)       -> zo  (the o norm .. W_o's beats)
      qs (its SiLU .. the q norm's read)     -> qn  (the q norm's write .. the delta rule)
      ks likewise                            -> kn
      v  (its SiLU .. column c's u)          -> o16 (column c's o .. the o norm's read)
      qn's registers, once the delta rule is done -> out (W_o's rows .. the output's release)
    The norm rewrites q and k in place: each element is read in its scale pass before its
    own write, and never again.  The delta rule reads v_c when column c's pass 1 ends, long
    before o_c comes out of pass 2.  A register is as wide as the wider of its vectors; a
    narrower vector is written sign- or zero-extended and read from the low bits, so every
    vector reads back exactly what was stored.  Upper case: register sets (written); the
    rest views of them (read)."""
    a, hk, hv = fm.act_bits, H * dk, H * dv
    qkv, o_b = signed(fm.qkv_bits), signed(fm.o_bits)
    v = SimpleNamespace()
    v.XZ = vec("xz", max(d, hv), signed(a))                       # x, then zo
    v.X, v.ZO = view(v.XZ, d, signed(a)), view(v.XZ, hv, signed(a))
    v.FD, v.GD = vec("fd", r, signed(a)), vec("gd", r, signed(a))
    out_in_q = d <= hk            # out in q's registers (tiny, small: d == H d_k)
    v.QSN = vec("qsn", hk, signed(max(fm.qkv_bits, fm.qk_bits, a if out_in_q else 1)))   # qs, qn, then out
    v.KSN = vec("ksn", hk, signed(max(fm.qkv_bits, fm.qk_bits)))  # ks, then kn
    v.VO = vec("vo", hv, signed(max(fm.qkv_bits, fm.o_bits)))     # v, then o16
    v.QS, v.KS, v.V = view(v.QSN, hk, qkv), view(v.KSN, hk, qkv), view(v.VO, hv, qkv)
    v.QN, v.KN = view(v.QSN, hk, signed(fm.qk_bits)), view(v.KSN, hk, signed(fm.qk_bits))
    v.O16 = view(v.VO, hv, o_b)
    v.OUT_REGS = v.QSN if out_in_q else vec("out", d, signed(a))
    v.OUT = view(v.OUT_REGS, d, signed(a))
    v.ALPHA = vec("alpha", hk, unsigned(fm.alpha_frac))
    v.BETA = vec("beta", H, unsigned(fm.unit_frac + 1))
    v.GATE = vec("gate", hv, unsigned(fm.unit_frac + 1))
    return v


def store(m, buf, idx, value):
    m.d.sync += Array(buf)[idx].eq(value)


class KdaUnit(wiring.Component):
    def __init__(self, cfg, shared_rsqrt: bool = False):
        """``shared_rsqrt``: the q, k, o normaliser's rsqrt is the owner's, on ``rsqrt``
        (hw/arith/rsqrt.py SharedRsqrt), not one of its own."""
        m_, hw = cfg.model, cfg.hw
        self.shared_rsqrt = shared_rsqrt
        self.cfg = cfg
        self.fm = fm = formats_for(cfg)
        self.d, self.H, self.dk, self.r = m_.d_model, m_.n_heads, m_.head_dim, m_.gate_rank
        self.dv = self.dk
        self.W = hw.weight_port_bytes
        if hw.lanes != hw.weight_port_bytes:
            raise ValueError(f"hw.lanes = {hw.lanes}: the KDA unit needs lanes == hw.weight_port_bytes "
                             f"({hw.weight_port_bytes}), one port beat per MAC beat")
        self.mm = memory_map(cfg)
        # the model layers it runs (a hybrid's MLA layers are the MLA unit's); the k-th of
        # them is its layer k: the states it keeps are one per KDA layer and sequence slot
        # (context slot * K + k)
        self.layers = mixer_layers(cfg, "kda")
        if not self.layers:
            raise ConfigError(f"config {cfg.name}: no \"kda\" in model.layers, so no KDA unit")
        self.slots, self.contexts = sequence_slots(cfg), state_contexts(cfg)
        # per layer (projections', W_o's) requests; the layers differ only in addresses
        self.layer_reqs = [kda_requests(cfg, l) for l in self.layers]
        self.proj_reqs, self.wo_reqs = self.layer_reqs[0]
        for proj, wo in self.layer_reqs:
            if [n for _, n in proj + wo] != [n for _, n in self.proj_reqs + self.wo_reqs]:
                raise ValueError(f"config {cfg.name}: the layers' KDA reads differ in size")
        a = fm.act_bits
        super().__init__({
            "i": In(stream.Signature(token_layout(self.d, a))),
            "layer": In(layer_bits(cfg)),
            "slot": In(slot_bits(cfg)),
            "o": Out(stream.Signature(data.ArrayLayout(signed(a), self.d))),
            "wport": Out(WeightPortSignature(self.W)),
            "params": In(param_layout(cfg, "kda")),
            "cycles": Out(32),
            "token_cycles": Out(32),
            "tokens": Out(32),
            "mac_beat": Out(1),
            **({"rsqrt": Out(rsqrt_client_signature(fm, self.norm_rsqrt_bits(cfg)))} if shared_rsqrt else {}),
            # LOAD's writes of the short convolutions' taps, when they live in SRAM
            **({"tap_w": In(tap_write_signature(tap_words(cfg), self.W))} if conv_taps_in_sram(cfg) else {}),
        })

    @staticmethod
    def norm_rsqrt_bits(cfg) -> int:
        """The input width of the q, k, o normaliser's rsqrt."""
        return norm_rsqrt_bits(kda_norm_ss_bits(cfg), param_layout(cfg, "kda.q_norm"))

    def elaborate(self, platform):
        m = Module()
        cfg, fm, P = self.cfg, self.fm, self.params
        st = structural(cfg)          # the config-fixed widths (requantiser outputs, table inputs)
        pm = param_map(cfg)
        d, H, dk, dv, r, W = self.d, self.H, self.dk, self.dv, self.r, self.W
        a, hk, hv = fm.act_bits, H * dk, H * dv
        L, C = len(self.layers), self.contexts
        plan = plan_pipeline(cfg.hw.clock_period_ns)
        # the accepted token's KDA layer k (its weights' addresses) and context (its state
        # and history); with every layer a KDA layer, k is the model layer itself
        k_now, ctx_now = unit_layer(m, layer_count(cfg), self.layers, self.layer, self.slot, self.slots)
        tok_ctx = Signal(range(C))
        v = token_registers(fm, d, H, dk, dv, r)

        # ---- counters (token_count from the ACCEPT cycle and the one after it, both counted)
        m.d.comb += self.cycles.eq(event_counter(m, 1, "cycles"))
        token_clear = Signal()
        token_count = event_counter(m, 1, "token_count", clear=token_clear, clear_to=2)

        # ---- the projection sequencer (hw/proj): the weight requests (the projections' at
        # ACCEPT, W_o's at WO), response beats + input groups -> the shared engine, one port
        # beat per engine beat.  The regions' shapes are every KDA layer's: the first stands for all
        shapes = [(reg.rows, reg.row_beats) for reg in (self.mm[layer_prefix(cfg, self.layers[0]) + t]
                                                         for _, t, _, _ in OPS)]
        m.submodules.seq = seq = ProjectionSequencer(
            shapes, requests=([proj + wo for proj, wo in self.layer_reqs], len(self.proj_reqs)))
        if L > 1:      # the token's layer: a register, constant for the token
            with m.If(self.i.valid & self.i.ready):
                m.d.sync += seq.layer.eq(k_now)
        connect_weight_port(m, seq, self.wport)
        sources = {"x": v.X, "fd": v.FD, "gd": v.GD, "zo": v.ZO}
        x_group = input_group(m, [[port_groups(sources[src], W, a)] for *_, src in OPS], seq.op, 0, seq.beat)
        # the engine is built accumulator-only (the unit requantises the raw accumulator
        # itself: f_up adds a bias first) and always ready: every result is taken the cycle it
        # appears (R0 is a plain register, the pipeline after it never stalls), so no result
        # FIFO (8 x 40 flip-flops on tiny) and no credit counter
        m.submodules.engine = eng = MatVecEngine(cfg, requantise=False, always_ready=True)
        m.d.comb += [self.mac_beat.eq(eng.beat),       # hw.lanes MACs (the chip's MACS counter)
                     eng.i.valid.eq(seq.go), eng.i.payload.w.eq(self.wport.resp.payload.data),
                     eng.i.payload.x.eq(x_group), eng.i.payload.first.eq(seq.first),
                     eng.i.payload.last.eq(seq.last), eng.i.payload.mult.eq(0), eng.i.payload.shift.eq(0)]

        # ---- requantisation (bias for f_up) and routing of the rows -------------------------
        m.submodules.rq = rq = ProjectionRequantiser(cfg, shapes,
                                                     [f for _, _, f, _ in OPS], OP["fu"], eng.o.payload.acc.shape(),
                                                     seq.op.shape(), seq.row.shape())
        m.d.comb += [rq.valid.eq(eng.o.valid), rq.acc.eq(eng.o.payload.acc), rq.params.eq(P)]
        r2_valid, r2_op, r2_row, r2_y = rq.o_valid, rq.o_op, rq.o_row, rq.o_y
        writes = []                       # one-bit signals: a row reached its final register
        with m.If(r2_valid):
            with m.Switch(r2_op):
                for op, buf in (("fd", v.FD), ("gd", v.GD), ("o", v.OUT_REGS)):
                    with m.Case(OP[op]):
                        store(m, buf, r2_row, r2_y)
        writes.append(r2_valid & ((r2_op == OP["fd"]) | (r2_op == OP["gd"]) | (r2_op == OP["o"])))
        # tables after the engine: beta, alpha, gate (one cycle each: the table read is a
        # 2**in_bits : 1 mux of constants; small at 1 ns: address register -> data 0.89-0.93 ns)
        for name, dest, op in (("beta", v.BETA, "b"), ("alpha", v.ALPHA, "fu"), ("gate", v.GATE, "gu")):
            full = f"kda.{name}"
            m.submodules[f"lut_{name}"] = lut = TableStage(st[f"{full}.in_bits"], table_shape(cfg, full),
                                                           st[f"{full}.table"], seq.row.shape())
            m.d.comb += [lut.valid.eq(r2_valid & (r2_op == OP[op])), lut.row.eq(r2_row), lut.addr.eq(r2_y)]
            with m.If(lut.o_valid):
                store(m, dest, lut.o_row, lut.data)
            writes.append(lut.o_valid)
        qkv = _qkv_rows(self, m, r2_valid, r2_op, r2_y, v, seq)
        writes.append(qkv.o_valid)
        m.submodules.pending = pending = PendingRows(len(writes), 4 * (hk + hv + d + 2 * r + H))
        m.d.comb += [pending.issued.eq(seq.row_issued), pending.stored.eq(Cat(*writes))]

        # ---- the shared normaliser: q, k (L2) and o (RMS), the o norm's output times the gate
        m.submodules.norm = norm = Normalizer(fm, dk, max(fm.qkv_bits, fm.o_bits), kda_norm_ss_bits(cfg),
                                              [fm.qk_bits, fm.qk_bits, a], param_layout(cfg, "kda.q_norm"),
                                              clock_period_ns=cfg.hw.clock_period_ns, shared_rsqrt=self.shared_rsqrt)
        if self.shared_rsqrt:
            wiring.connect(m, norm.rsqrt, wiring.flipped(self.rsqrt))
        m.d.comb += [norm.norms[k].eq(getattr(P, name)) for k, name in enumerate(("q_norm", "k_norm", "o_norm"))]
        nh = Signal(range(H))          # the head the norm works on (the phase control's)
        base = nh * dk
        m.d.comb += norm.rd_x.eq(Mux(norm.mode == 0, Array(v.QS)[base + norm.rd_idx],
                                 Mux(norm.mode == 1, Array(v.KS)[base + norm.rd_idx],
                                     Array(v.O16)[base + norm.rd_idx])))
        wi = base + norm.wr_idx
        with m.If(norm.wr_en):
            with m.Switch(norm.mode):
                with m.Case(0):
                    store(m, v.QSN, wi, norm.wr_y)
                with m.Case(1):
                    store(m, v.KSN, wi, norm.wr_y)
        m.submodules.gate = gate = GatedProduct(hv, norm.wr_y.shape(), v.GATE[0].shape(), wi.shape(), fm.unit_frac,
                                                plan, count=True)
        m.d.comb += [gate.valid.eq(norm.wr_en & (norm.mode == 2)), gate.idx.eq(wi), gate.y.eq(norm.wr_y),
                     gate.gates.eq(Cat(*v.GATE))]
        with m.If(gate.o_valid):
            store(m, v.XZ, gate.o_idx, gate.z)

        # ---- the delta rule ----------------------------------------------------------------
        shift_names = ("f_k", "f_v", "f_s", "o_shift")
        m.submodules.delta = delta = DeltaRule(
            fm, H, dk, dv, cfg.hw.state_lanes, clock_period_ns=cfg.hw.clock_period_ns,
            shift_fields={k: (pm[f"kda.{k}"].bits, pm[f"kda.{k}"].hi) for k in shift_names},
            state_memory=cfg.hw.state_memory, layers=C)
        if C > 1:      # the token's context: its short-convolution history and its state
            m.d.comb += [qkv.layer.eq(tok_ctx), delta.layer.eq(tok_ctx)]
        m.d.comb += [getattr(delta.shifts, k).eq(getattr(P, k)) for k in shift_names]
        m.d.comb += [delta.k.eq(Cat(*v.KN)), delta.q.eq(Cat(*v.QN)), delta.alpha.eq(Cat(*v.ALPHA)),
                     delta.v.eq(Cat(*v.V)), delta.beta.eq(Cat(*v.BETA)), delta.o.ready.eq(1)]
        o_idx = Signal(range(hv + 1))
        with m.If(delta.o.valid):
            store(m, v.VO, o_idx, delta.o.payload)
            m.d.sync += o_idx.eq(o_idx + 1)

        # ---- phase control (hw/kda/phases.py) ------------------------------------------------
        m.submodules.phases = ph = KdaPhases((OP["fu"], OP["o"], len(OPS)), H)
        m.d.comb += [ph.valid.eq(self.i.valid), self.i.ready.eq(ph.ready), ph.o_ready.eq(self.o.ready),
                     self.o.valid.eq(ph.o_valid), self.o.payload.eq(Cat(*v.OUT)),
                     ph.op.eq(seq.op), ph.at_start.eq(seq.at_start), ph.drained.eq(pending.drained),
                     seq.enable.eq(ph.feed), ph.norm_busy.eq(norm.busy), ph.gate_empty.eq(gate.empty),
                     norm.start.eq(ph.norm_start), norm.mode.eq(ph.norm_mode), nh.eq(ph.head),
                     ph.delta_busy.eq(delta.busy), ph.delta_done.eq(o_idx == hv), delta.start.eq(ph.delta_start),
                     seq.more.eq(ph.more), seq.restart.eq(ph.take), rq.restart.eq(ph.take),
                     token_clear.eq(ph.take)]
        with m.If(ph.delta_begin):
            m.d.sync += o_idx.eq(0)
        token_cycles = Signal(32)
        with m.If(ph.finish):
            m.d.sync += token_cycles.eq(token_count)
        # the token count steps a cycle after the hand-over (the output's ready is not in
        # front of its carry chain)
        m.d.comb += [self.token_cycles.eq(token_cycles), self.tokens.eq(event_counter(m, ph.token_out, "tokens"))]
        with m.If(ph.take):
            m.d.sync += [v.XZ[n].eq(self.i.payload.x[n]) for n in range(d)]
            if C == 1:
                with m.If(self.i.payload.first):
                    m.d.comb += [delta.clear.eq(1), qkv.restart.eq(1)]
            else:
                # a new sequence of the accepted token's layer and slot (the ports' values
                # now): only that context's state and history start again
                m.d.sync += tok_ctx.eq(ctx_now)
                starts = Cat(self.i.payload.first & (ctx_now == c) for c in range(C))
                m.d.comb += [delta.clear.eq(starts), qkv.restart.eq(starts)]
        return m


def _qkv_rows(unit: KdaUnit, m, r2_valid, r2_op, r2_y, v, seq) -> QkvActivation:
    """q, k, v's rows: short convolution, requantisation, SiLU (hw/kda/rows.py), into QSN,
    KSN and VO; the taps from LOAD's ``tap_w`` when they live in SRAM."""
    cfg, L = unit.cfg, len(unit.layers)
    m.submodules.qkv = qkv = QkvActivation(cfg, r2_y.shape(), unit.contexts, tap_layers=L)
    if conv_taps_in_sram(cfg):
        wiring.connect(m, wiring.flipped(unit.tap_w), qkv.tap_w)
        if L > 1:
            m.d.comb += qkv.tap_layer.eq(seq.layer)       # the token's KDA layer
    is_qkv = (r2_op == OP["q"]) | (r2_op == OP["k"]) | (r2_op == OP["v"])
    m.d.comb += [qkv.valid.eq(r2_valid & is_qkv), qkv.y.eq(r2_y), qkv.params.eq(unit.params)]
    with m.If(qkv.o_valid):
        with m.Switch(qkv.o_sec):
            for n, buf in enumerate((v.QSN, v.KSN, v.VO)):
                with m.Case(n):
                    store(m, buf, qkv.o_idx, qkv.o_silu)
    return qkv


def default_kda(cfg) -> KdaUnit:
    """What `moekda rtl/synth --top kda` builds: the unit of the config (it takes no model;
    every per-model value is an input, ``params``)."""
    return KdaUnit(cfg)
