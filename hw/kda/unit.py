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
``wport`` weight port (hw/stream/weight_port.py).
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

from amaranth import Array, Cat, Const, Module, Mux, Shape, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import booth_multiply, requantise
from hw.arith.counter import sparse_event_count
from hw.arith.carry_save import pipelined_add
from hw.kda.delta import DeltaRule
from hw.arith.matvec import MatVecEngine, port_groups
from hw.kda.norm import Normalizer
from hw.arith.lut import LookupTable, drive_constant
from hw.image.memory_map import (layer_bits, layer_count, layer_prefix, memory_map, mixer_layers, sequence_slots,
                                 slot_bits, state_contexts)
from hw.image.param_map import kda_norm_ss_bits, param_layout, param_map, structural, table_shape
from hw.arith.pipeline import Pipe, plan_pipeline
from hw.arith.silu import silu
from hw.kda.short_conv import ShortConv
from hw.stream.weight_port import WeightPortSignature, split_request
from moekda.config import ConfigError
from moekda.formats import formats_for

# the projections in weight-memory order: (op, memory-map tensor, QKDA field, input vector)
OPS = [
    ("q", "kda.w_q", "q_proj", "x"),
    ("k", "kda.w_k", "k_proj", "x"),
    ("v", "kda.w_v", "v_proj", "x"),
    ("fd", "kda.w_f_down", "f_down", "x"),
    ("gd", "kda.w_g_down", "g_down", "x"),
    ("b", "kda.w_b", "b_proj", "x"),
    ("fu", "kda.w_f_up", "f_up", "fd"),
    ("gu", "kda.w_g_up", "g_up", "gd"),
    ("o", "kda.w_o", "o_proj", "zo"),
]
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


class KdaUnit(wiring.Component):
    def __init__(self, cfg):
        m_, hw = cfg.model, cfg.hw
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
        })

    # -- helpers ------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        cfg, fm, P = self.cfg, self.fm, self.params
        st = structural(cfg)          # the config-fixed widths (requantiser outputs, table inputs)
        pm = param_map(cfg)
        d, H, dk, dv, r, W = self.d, self.H, self.dk, self.dv, self.r, self.W
        a = fm.act_bits
        hk, hv = H * dk, H * dv
        L, C = len(self.layers), self.contexts
        # the accepted token's KDA layer k (its weights' addresses) and context (its state
        # and history); with every layer a KDA layer, k is the model layer itself
        if self.layers == list(range(layer_count(cfg))):
            k_now = self.layer
        else:
            k_now = Signal(range(max(2, L)))
            m.d.comb += k_now.eq(Array(Const(self.layers.index(l) if l in self.layers else 0, len(k_now))
                                       for l in range(layer_count(cfg)))[self.layer])
        if L > 1:
            tok_layer = Signal(range(L))
        if C > 1:
            tok_ctx = Signal(range(C))
            ctx_now = Signal(range(C))      # the context of the token on ``i``
            m.d.comb += ctx_now.eq(k_now + L * self.slot if self.slots > 1 else k_now)

        # ---- registers holding the token's vectors ---------------------------------
        # The phases run in sequence, so a vector whose last reader is done can hand its
        # registers on to one written later (docs/chip.md "The KDA unit's registers"):
        #   x  (ACCEPT .. the x projections)       -> zo  (the o norm .. W_o's beats)
        #   qs (its SiLU .. the q norm's read)     -> qn  (the q norm's write .. the delta rule)
        #   ks likewise                            -> kn
        #   v  (its SiLU .. column c's u)          -> o16 (column c's o .. the o norm's read)
        #   qn's registers, once the delta rule is done -> out (W_o's rows .. the output's release)
        # The norm rewrites q and k in place: each element is read in its scale pass before
        # its own write, and never again.  The delta rule reads v_c when column c's pass 1
        # ends, long before o_c comes out of pass 2.  A register is as wide as the wider of
        # its vectors; a narrower vector is written sign- or zero-extended and read from
        # the low bits, so every vector reads back exactly what was stored.  The MLA unit
        # (hw/mla/unit.py) still has a register set per vector.
        def vec(name, n, shape):
            return [Signal(shape, name=f"{name}{i}") for i in range(n)]

        def view(regs, n, shape):
            """The first ``n`` registers of ``regs`` read as ``shape`` (their low bits)."""
            shape = Shape.cast(shape)
            assert n <= len(regs) and all(len(reg) >= shape.width for reg in regs[:n])
            return [reg[:shape.width].as_signed() if shape.signed else reg[:shape.width] for reg in regs[:n]]
        qkv, o_b = signed(fm.qkv_bits), signed(fm.o_bits)
        XZ = vec("xz", max(d, hv), signed(a))                       # x, then zo
        X, ZO = view(XZ, d, signed(a)), view(XZ, hv, signed(a))
        FD, GD = vec("fd", r, signed(a)), vec("gd", r, signed(a))
        out_in_q = d <= hk            # out in q's registers (tiny, small: d == H d_k)
        QSN = vec("qsn", hk, signed(max(fm.qkv_bits, fm.qk_bits, a if out_in_q else 1)))   # qs, qn, then out
        KSN = vec("ksn", hk, signed(max(fm.qkv_bits, fm.qk_bits)))  # ks, then kn
        VO = vec("vo", hv, signed(max(fm.qkv_bits, fm.o_bits)))     # v, then o16
        QS, KS, V = view(QSN, hk, qkv), view(KSN, hk, qkv), view(VO, hv, qkv)
        QN, KN = view(QSN, hk, signed(fm.qk_bits)), view(KSN, hk, signed(fm.qk_bits))
        O16 = view(VO, hv, o_b)
        OUT_REGS = QSN if out_in_q else vec("out", d, signed(a))
        OUT = view(OUT_REGS, d, signed(a))
        ALPHA = vec("alpha", hk, unsigned(fm.alpha_frac))
        BETA = vec("beta", H, unsigned(fm.unit_frac + 1))
        GATE = vec("gate", hv, unsigned(fm.unit_frac + 1))

        # ---- counters ------------------------------------------------------------
        # 32-bit counters as two 16-bit halves: the high half steps on a flag registered
        # one cycle ahead (low half about to wrap), so no 32-bit carry chain in a cycle
        def split_counter(name, clear=None):
            lo, hi, wrap = Signal(16, name=f"{name}_lo"), Signal(16, name=f"{name}_hi"), Signal(name=f"{name}_wrap")
            m.d.sync += [lo.eq(lo + 1), wrap.eq(lo == 0xFFFE)]
            with m.If(wrap):
                m.d.sync += hi.eq(hi + 1)
            if clear is not None:
                with m.If(clear):
                    m.d.sync += [lo.eq(2), hi.eq(0), wrap.eq(0)]
            return Cat(lo, hi)
        cycles = split_counter("cycles")
        m.d.comb += self.cycles.eq(cycles)
        token_clear = Signal()    # ACCEPT takes a token: the count restarts (at 2: the ACCEPT cycle and
                                  # the one after it are the token's first two, as token_cycles counts)
        token_count = split_counter("token_count", token_clear)

        # ---- weight requests: the projections' at ACCEPT, W_o's at WO -------------------
        # one table of requests in memory order; the phase control moves req_end to
        # open the next group and req_idx walks up to it
        reqs = self.proj_reqs + self.wo_reqs
        req_idx = Signal(range(len(reqs) + 1), init=len(reqs))
        req_end = Signal(range(len(reqs) + 1), init=len(reqs))
        if L == 1:
            req_addr = Array(Const(ad, 32) for ad, _ in reqs)[req_idx]
        else:
            # one address table per layer; the layer is a register, constant for the token
            req_addr = Array(Array(Const(ad, 32) for ad, _ in proj + wo)
                             for proj, wo in self.layer_reqs)[tok_layer][req_idx]
        m.d.comb += [self.wport.req.valid.eq(req_idx != req_end),
                     self.wport.req.payload.addr.eq(req_addr),
                     self.wport.req.payload.beats.eq(Array(Const(n, 16) for _, n in reqs)[req_idx])]
        with m.If(self.wport.req.valid & self.wport.req.ready):
            m.d.sync += req_idx.eq(req_idx + 1)

        # ---- the projection feeder: response beats + input groups -> MAC ----------------
        # the regions' shapes (rows, beats per row) are every KDA layer's: the first stands for all
        regions = [self.mm[layer_prefix(cfg, self.layers[0]) + t] for _, t, _, _ in OPS]
        sources = {"x": port_groups(X, W, a), "fd": port_groups(FD, W, a), "gd": port_groups(GD, W, a),
                   "zo": port_groups(ZO, W, a)}
        n_ops = len(OPS)
        f_op = Signal(range(n_ops + 1))
        f_row = Signal(range(max(reg.rows for reg in regions)))
        f_beat = Signal(range(max(reg.row_beats for reg in regions)))
        feed_enable = Signal()          # set by the phase control below
        pending = Signal(range(4 * (hk + hv + d + 2 * r + H) + 1))  # rows issued, not yet stored

        rows_of = Array(Const(reg.rows - 1) for reg in regions)[f_op]
        beats_of = Array(Const(reg.row_beats - 1) for reg in regions)[f_op]
        x_group = Signal(W * a)
        with m.Switch(f_op):
            for n, (_, _, _, src) in enumerate(OPS):
                with m.Case(n):
                    m.d.comb += x_group.eq(Array(sources[src])[f_beat])

        # the shared engine (hw/arith/matvec.py): one port beat per engine beat; its results
        # come back in row order, so a second (op, row) counter walks the same sequence.
        # The unit requantises the raw accumulator itself (f_up adds a bias first), so the
        # engine is built accumulator-only: no requantiser, (M, s) ignored.  Every result is
        # taken the cycle it appears (R0 below is a plain register, the pipeline after it
        # never stalls), so the engine is built always ready: no result FIFO (8 x 40
        # flip-flops on tiny) and no credit counter
        m.submodules.engine = eng = MatVecEngine(cfg, requantise=False, always_ready=True)
        m.d.comb += self.mac_beat.eq(eng.beat)       # hw.lanes MACs (the chip's MACS counter)
        beat_go = feed_enable & self.wport.resp.valid
        m.d.comb += [
            self.wport.resp.ready.eq(feed_enable),
            eng.i.valid.eq(feed_enable & self.wport.resp.valid),
            eng.i.payload.w.eq(self.wport.resp.payload.data),
            eng.i.payload.x.eq(x_group),
            eng.i.payload.first.eq(f_beat == 0),
            eng.i.payload.last.eq(f_beat == beats_of),
            eng.i.payload.mult.eq(0),
            eng.i.payload.shift.eq(0),
        ]
        row_issued = Signal()
        m.d.comb += row_issued.eq(beat_go & (f_beat == beats_of))
        with m.If(beat_go):
            m.d.sync += f_beat.eq(f_beat + 1)
            with m.If(f_beat == beats_of):
                m.d.sync += [f_beat.eq(0), f_row.eq(f_row + 1)]
                with m.If(f_row == rows_of):
                    m.d.sync += [f_row.eq(0), f_op.eq(f_op + 1)]

        # ---- requantisation of engine results (bias for f_up) -----------------------------
        res_op, res_row = Signal.like(f_op), Signal.like(f_row)
        res_valid = eng.o.valid
        with m.If(res_valid):
            m.d.sync += res_row.eq(res_row + 1)
            with m.If(res_row == Array(Const(reg.rows - 1) for reg in regions)[res_op]):
                m.d.sync += [res_row.eq(0), res_op.eq(res_op + 1)]
        # R0: the accumulator and its bias (0 but for f_up) registered; the bias add
        # (a carry chain as wide as the accumulator), times M, round, shift, saturate
        # over clock-derived stages (hw/arith/booth_multiply.py); the last register is R2
        r0_valid, r0_op, r0_row = Signal(), Signal.like(f_op), Signal.like(f_row)
        r0_acc, r0_bias = Signal(signed(fm.acc_bits + 1)), Signal(signed(fm.acc_bits + 1))
        m.d.sync += [r0_valid.eq(res_valid), r0_op.eq(res_op), r0_row.eq(res_row),
                     r0_acc.eq(eng.o.payload.acc), r0_bias.eq(0)]
        # the f_up bias, read from the parameters by row (an H d_k : 1 mux from the bank)
        with m.If(res_op == OP["fu"]):
            m.d.sync += r0_bias.eq(P.f_up.bias[res_row[:max(1, (hk - 1).bit_length())]])
        plan = plan_pipeline(cfg.hw.clock_period_ns)
        rq = Pipe(m, plan, "rq")
        rq_live = pipelined_add(rq, {"valid": r0_valid, "op": r0_op, "row": r0_row, "acc": r0_acc,
                                     "bias": r0_bias}, "acc", "bias", "biased", fm.acc_bits + 1)
        r0_biased = Value.cast(rq_live.pop("biased")).as_signed()
        rq_live = requantise(rq, rq_live, r0_biased, "op",
                             [(getattr(P, f).m, getattr(P, f).s, st[f"kda.{f}.out_bits"]) for _, _, f, _ in OPS],
                             fm.acc_bits + 3 + fm.mult_bits, "y")
        rq_live = rq.register(rq_live)
        r2_valid, r2_op, r2_row = rq_live["valid"], rq_live["op"], rq_live["row"]
        r2_y = Signal(signed(max(a, fm.lut_in_bits)))
        m.d.comb += r2_y.eq(rq_live["y"])

        # ---- routing of requantised rows -----------------------------------------------
        writes = []                       # one-bit signals: a row reached its final register
        def store(buf, idx, value):
            m.d.sync += Array(buf)[idx].eq(value)

        direct = Signal()
        m.d.comb += direct.eq(r2_valid & ((r2_op == OP["fd"]) | (r2_op == OP["gd"]) | (r2_op == OP["o"])))
        with m.If(r2_valid):
            with m.Switch(r2_op):
                with m.Case(OP["fd"]):
                    store(FD, r2_row, r2_y)
                with m.Case(OP["gd"]):
                    store(GD, r2_row, r2_y)
                with m.Case(OP["o"]):
                    store(OUT_REGS, r2_row, r2_y)
        writes.append(direct)

        # tables after the engine: beta, alpha, gate (one cycle each: the table read is a
        # 2**in_bits : 1 mux of the parameter bank's entries; small at 1 ns: address register
        # -> data 0.89-0.93 ns, bank -> data 0.55 ns with the 0.2 ns input delay)
        tables = {}
        def table(name):
            """A LookupTable of ``kda.<name>``: the config's constants (moekda/tables.py)."""
            full = f"kda.{name}"
            lut = LookupTable(st[f"{full}.in_bits"], table_shape(cfg, full))
            m.submodules[f"lut_{name}"] = lut
            drive_constant(m, lut, st[f"{full}.table"])
            return lut
        for name, dest, op in (("beta", BETA, "b"), ("alpha", ALPHA, "fu"), ("gate", GATE, "gu")):
            lut = table(name)
            hit = r2_valid & (r2_op == OP[op])
            l_valid, l_row = Signal(name=f"{name}_valid"), Signal.like(f_row, name=f"{name}_row")
            m.d.comb += [lut.addr.eq(r2_y), lut.en.eq(hit)]
            m.d.sync += [l_valid.eq(hit), l_row.eq(r2_row)]
            with m.If(l_valid):
                store(dest, l_row, lut.data)
            writes.append(l_valid)
            tables[name] = lut

        # short convolution of q, k, v (channels in that order), requant, SiLU.  Its history
        # lives where the state does (hw.state_memory: flip-flops or an SRAM macro), and it
        # is built always ready: CR1 below takes every sum the cycle it appears, so no
        # output FIFO (and rows are sent without looking at ``ready`` anyway)
        conv_names = ("conv_q", "conv_k", "conv_v")
        m.submodules.conv = conv = ShortConv(hk + hk + hv, cfg.model.conv_kernel, a, fm.weight_bits,
                                             clock_period_ns=cfg.hw.clock_period_ns, layers=C,
                                             memory=cfg.hw.state_memory, always_ready=True)
        if C > 1:
            m.d.comb += conv.layer.eq(tok_ctx)
        for name, base_c, n in zip(conv_names, (0, hk, 2 * hk), (hk, hk, hv)):
            for c in range(n):
                m.d.comb += conv.taps[base_c + c].eq(getattr(P, name).w[c])
        is_qkv = (r2_op == OP["q"]) | (r2_op == OP["k"]) | (r2_op == OP["v"])
        m.d.comb += [conv.i.valid.eq(r2_valid & is_qkv), conv.i.payload.eq(r2_y)]
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
        m.d.sync += [cr1_valid.eq(conv.o.valid), cr1_sec.eq(c_sec), cr1_idx.eq(c_idx),
                     cr1_acc.eq(conv.o.payload)]
        crq = Pipe(m, plan, "crq")
        crq_live = crq.register(requantise(crq, {"valid": cr1_valid, "sec": cr1_sec, "idx": cr1_idx},
                                           cr1_acc, "sec",
                                           [(getattr(P, c).m, getattr(P, c).s, st[f"kda.{c}.out_bits"])
                                            for c in conv_names],
                                           conv.acc_bits + fm.mult_bits + 2, "code"))
        cr2_valid, cr2_sec, cr2_idx = crq_live["valid"], crq_live["sec"], crq_live["idx"]
        cr2_code = Signal(signed(fm.lut_in_bits))
        m.d.comb += cr2_code.eq(crq_live["code"])
        # SiLU = c * sigmoid (hw/arith/silu.py): q, k and v by the code's section
        sp = Pipe(m, plan, "silu")
        silus = [getattr(P, name) for name in ("silu_q", "silu_k", "silu_v")]
        s_live = silu(sp, {"valid": cr2_valid, "sec": cr2_sec, "idx": cr2_idx, "code": cr2_code}, "code", "sec",
                      [(p.t_m, p.t_s, p.m, p.s) for p in silus], fm.qkv_bits, fm)
        s_live = sp.register(s_live)
        s_valid, s_sec, s_idx = s_live["valid"], s_live["sec"], s_live["idx"]
        with m.If(s_valid):
            with m.Switch(s_sec):
                for n, buf in enumerate((QSN, KSN, VO)):
                    with m.Case(n):
                        store(buf, s_idx, s_live["silu"])
        writes.append(s_valid)

        # the strobes are registered before they are counted (their own logic plus the
        # count did not fit 1 ns): a store leaves ``pending`` a cycle late, which only
        # holds ``drained`` back a cycle, never lets it through early
        writes_r = Signal(len(writes))
        m.d.sync += writes_r.eq(Cat(*writes))
        n_writes = sum(writes_r[n].as_unsigned() for n in range(len(writes)))
        m.d.sync += pending.eq(pending + row_issued - n_writes)
        drained = pending == 0           # (registered: rows issued this cycle are not in it yet)

        # ---- the shared normaliser: q, k (L2) and o (RMS) ----------------------------------
        nbits = max(fm.qkv_bits, fm.o_bits)
        m.submodules.norm = norm = Normalizer(fm, dk, nbits, kda_norm_ss_bits(cfg), [fm.qk_bits, fm.qk_bits, a],
                                              param_layout(cfg, "kda.q_norm"),
                                              clock_period_ns=cfg.hw.clock_period_ns)
        for k, name in enumerate(("q_norm", "k_norm", "o_norm")):
            m.d.comb += norm.norms[k].eq(getattr(P, name))
        nh = Signal(range(H))
        base = nh * dk
        m.d.comb += norm.rd_x.eq(Mux(norm.mode == 0, Array(QS)[base + norm.rd_idx],
                                 Mux(norm.mode == 1, Array(KS)[base + norm.rd_idx],
                                     Array(O16)[base + norm.rd_idx])))
        wi = base + norm.wr_idx
        with m.If(norm.wr_en):
            with m.Switch(norm.mode):
                with m.Case(0):
                    store(QSN, wi, norm.wr_y)
                with m.Case(1):
                    store(KSN, wi, norm.wr_y)
        # the o norm's output is gated: rs(y * gate, unit_frac) over clock-derived stages
        # (the gate read is an index mux, the rounding constant a word of the product's tree)
        gp = Pipe(m, plan, "gate")
        g_live = {"valid": norm.wr_en & (norm.mode == 2), "idx": wi, "y": norm.wr_y}
        # the index mux, plus a level for the index's fan-out to every gate bit's mux
        # (small at 1 ns was 0.038 ns short with the mux levels alone)
        g_live = gp.spend(plan.delays.mux_level * (max(1, (hv - 1).bit_length()) + 1), g_live)
        g_val = Signal.like(GATE[0], name="gate_val")
        m.d.comb += g_val.eq(Array(GATE)[g_live["idx"]])
        # the gate read gets a stage of its own: the index's decode and fan-out (a NOR4 of
        # 0.29 ns) and the mux tree, with the product's first Booth words behind them, were
        # 0.038 ns longer than model-tiny's 1.25 ns in one stage (776 MHz).  The stage adds
        # one cycle of latency to the o path, not one per element (the elements still
        # flow one a cycle into ZO); g_pending counts it through gp.stages.  The stage is
        # unconditional, not placed by the clock plan: a slow-clock config pays it too
        g_live["g"] = g_val
        g_live = gp.register(g_live)
        g_val = g_live.pop("g")
        g_width = len(norm.wr_y) + len(g_val) + 2
        g_rnd = Const((1 << (fm.unit_frac - 1)) if fm.unit_frac else 0, g_width)
        g_live = gp.register(booth_multiply(gp, g_live, g_live.pop("y"), g_val, g_width, "z",
                                            extra_words=[g_rnd]))
        with m.If(g_live["valid"]):
            store(XZ, g_live["idx"], g_live["z"][fm.unit_frac:])
        g_pending = Signal(range(gp.stages + 2))   # gated values not yet in ZO
        m.d.sync += g_pending.eq(g_pending + (norm.wr_en & (norm.mode == 2)) - g_live["valid"])

        # ---- the delta rule ----------------------------------------------------------------
        shift_names = ("f_k", "f_v", "f_s", "o_shift")
        m.submodules.delta = delta = DeltaRule(
            fm, H, dk, dv, cfg.hw.state_lanes, clock_period_ns=cfg.hw.clock_period_ns,
            shift_fields={k: (pm[f"kda.{k}"].bits, pm[f"kda.{k}"].hi) for k in shift_names},
            state_memory=cfg.hw.state_memory, layers=C)
        if C > 1:
            m.d.comb += delta.layer.eq(tok_ctx)
        m.d.comb += [getattr(delta.shifts, k).eq(getattr(P, k)) for k in shift_names]
        m.d.comb += [delta.k.eq(Cat(*KN)), delta.q.eq(Cat(*QN)), delta.alpha.eq(Cat(*ALPHA)),
                     delta.v.eq(Cat(*V)), delta.beta.eq(Cat(*BETA)), delta.o.ready.eq(1)]
        o_idx = Signal(range(hv + 1))
        with m.If(delta.o.valid):
            store(VO, o_idx, delta.o.payload)
            m.d.sync += o_idx.eq(o_idx + 1)

        # ---- phase control -------------------------------------------------------------------
        m.d.comb += self.o.payload.eq(Cat(*OUT))
        token_cycles = Signal(32)
        m.d.comb += self.token_cycles.eq(token_cycles)
        # the token count steps a cycle after the hand-over (the output's ready is not in
        # front of its carry chain), in halves (sparse_event_count: a token per step)
        token_out = Signal()
        m.d.sync += token_out.eq(0)
        m.d.comb += self.tokens.eq(sparse_event_count(m, token_out, "tokens"))
        with m.FSM():
            with m.State("ACCEPT"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    for n in range(d):
                        m.d.sync += XZ[n].eq(self.i.payload.x[n])
                    m.d.sync += [req_idx.eq(0), req_end.eq(len(self.proj_reqs)), f_op.eq(0), f_row.eq(0), f_beat.eq(0),
                                 res_op.eq(0), res_row.eq(0)]
                    m.d.comb += token_clear.eq(1)
                    if L > 1:
                        m.d.sync += tok_layer.eq(k_now)
                    if C == 1:
                        with m.If(self.i.payload.first):
                            m.d.comb += [delta.clear.eq(1), conv.restart.eq(1)]
                    else:
                        # a new sequence of the accepted token's layer and slot (the ports'
                        # values now): only that context's state and history start again
                        m.d.sync += tok_ctx.eq(ctx_now)
                        starts = Cat(self.i.payload.first & (ctx_now == c) for c in range(C))
                        m.d.comb += [delta.clear.eq(starts), conv.restart.eq(starts)]
                    m.next = "PROJ"
            with m.State("PROJ"):
                # f_up reads fd: hold its first beat until every earlier row is stored
                wait_fd = (f_op == OP["fu"]) & (f_row == 0) & (f_beat == 0) & ~drained
                m.d.comb += feed_enable.eq((f_op < OP["o"]) & ~wait_fd)
                with m.If((f_op == OP["o"]) & drained):
                    m.d.sync += [nh.eq(0), norm.mode.eq(0)]
                    m.next = "NORM_START"
            with m.State("NORM_START"):
                m.d.comb += norm.start.eq(1)
                m.next = "NORM_WAIT"
            with m.State("NORM_WAIT"):
                with m.If(~norm.busy & (g_pending == 0)):
                    m.next = "NORM_START"
                    m.d.sync += nh.eq(nh + 1)
                    with m.If(nh == H - 1):
                        m.d.sync += [nh.eq(0), norm.mode.eq(norm.mode + 1)]
                        with m.If(norm.mode == 1):
                            m.d.sync += o_idx.eq(0)
                            m.next = "DELTA_START"
                        with m.If(norm.mode == 2):
                            m.d.sync += req_end.eq(len(reqs))
                            m.next = "WO"
            with m.State("DELTA_START"):
                m.d.comb += delta.start.eq(1)
                m.next = "DELTA"
            with m.State("DELTA"):
                with m.If(~delta.busy & (o_idx == hv)):
                    m.next = "NORM_START"          # norm.mode is 2: the o norm
            with m.State("WO"):
                m.d.comb += feed_enable.eq(f_op == OP["o"])
                with m.If((f_op == n_ops) & drained):
                    m.d.sync += token_cycles.eq(token_count)
                    m.next = "OUTPUT"
            with m.State("OUTPUT"):
                m.d.comb += self.o.valid.eq(1)
                with m.If(self.o.ready):
                    m.d.sync += token_out.eq(1)
                    m.next = "ACCEPT"
        return m


def default_kda(cfg) -> KdaUnit:
    """What `moekda rtl/synth --top kda` builds: the unit of the config (it takes no model;
    every per-model value is an input, ``params``)."""
    return KdaUnit(cfg)
