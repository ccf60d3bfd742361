"""The Gated MLA token mixer: one int8 token in, one int8 token out, attending over its cache.

Implements ``model.int_mla.int_mla_step`` bit for bit, token after token.  Like the
KDA unit (hw/kda/unit.py) the RTL is a function of the config alone: the weights are read
through ``wport`` (hw/image/memory_map.py ``mla_tensors``: the layer's six matrices), the
per-model values come in on ``params`` (hw/image/param_map.py, ``param_layout(cfg, "mla",
kind="mla")``: the six (m, s) pairs, the latent's norm, the score's (m, s), the gate
table), and the latents of the tokens so far are in the cache memory behind ``cport``
(hw/mla/cache.py: one row per token, per MLA layer and sequence slot).

Ports
-----
``i``      stream, one beat per token: ``x`` (d_model int8, the normalised input).
``layer``  the token's model layer (an MLA layer of ``model.layers``); ``slot`` its
           sequence slot; ``pos`` its position T in the sequence (0: a new sequence).
           Sampled with the accepted token, as on the KDA unit.  The position comes from
           outside because the owner counts it anyway (the model chip's ``seq``), and a
           host that restores a saved cache resumes a sequence by giving its length.
           The token reads rows 0 .. T-1 of its context and writes row T: the rows below
           T must be the sequence's (the unit keeps nothing of a sequence but this port).
``o``      stream, one beat per token: d_model int8.
``wport``  weight port; ``cport`` cache port (hw/mla/cache.py).
``params`` the layer's MLA values; stable while a token is inside.
``cycles``, ``token_cycles``, ``tokens``, ``mac_beat``: as the KDA unit's.

Schedule of one token at position T of its context (W = port bytes = lanes, r = kv_rank,
rb = beats per latent)
------------------------------------------------------------------------------------
1. ACCEPT  latch x, T; request W_dkv, W_q,
           W_g, W_uk (contiguous).
2. PROJ    the shared engine (hw/arith/matvec.py, requantising with each matrix's (m, s)):
           a = W_dkv x (resid_bits), q = W_q x, the gate code W_g x -> sigmoid table,
           then, once q is stored, qa_h = W_uk,h^T q_h for every head (int8).
3. NORM    c = RMSNorm(a) (hw/kda/norm.py, one row of r): the token's latent, kept in
           registers and written to the cache row T (rb beats on ``cport.wr``, beside
           what follows).
4. SCORE   per head h: the rows 0 .. T-1 read back from the cache and row T from the
           registers stream through the engine against qa_h, giving the scores
           u_hj = requantize(qa_h . c_j, u_m, u_s, mla_u_bits); a FIFO keeps each c_j
           until its score comes out, and the pair goes to the online softmax
           (hw/mla/softmax.py), which gives ctx_h.  The heads' reads follow each other
           on the port with no gap, and the softmax's divider of head h overlaps head
           h+1's scores: rb cycles per position and head, H rb (T + 1) in all.
5. UV, O   request W_uv, W_o; o_h = W_uv,h ctx_h (int8), zo = round_shift(o gate,
           unit_frac) as each o leaves the engine, then out = W_o zo.
6. OUTPUT  once the cache row is written.

Every cached row is read once per head (H T r bytes per token); cycles per token are
about the weights' beats + H rb (T + 1) + the phases' latencies, growing linearly in T.
A context holds ``cache_tokens(cfg)`` = 2**mla_context_bits positions, what ``pos`` can say.
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from hw.arith.counter import event_counter
from hw.arith.matvec import MatVecEngine, MatVecFormats, port_groups
from hw.arith.pipeline import plan_pipeline
from hw.stream.weight_port import WeightPortSignature, split_request
from hw.image.memory_map import layer_bits, layer_prefix, memory_map, sequence_slots, slot_bits
from hw.image.param_map import MLA_MATRICES, mla_norm_ss_bits, param_layout, table_shape
from hw.kda.norm import Normalizer
from hw.mla.cache import CachePortSignature, cache_tokens, mla_layers, row_beats, row_stride
from hw.mla.phases import MlaPhases
from hw.mla.score import CacheAccess, ScoreFeeder, ScoreResults
from hw.proj.requests import unit_layer
from hw.proj.results import GatedProduct, PendingRows, TableStage
from hw.proj.sequencer import ProjectionSequencer, connect_weight_port, input_group
from moekda.config import ConfigError
from moekda.formats import formats_for
from moekda.tables import fixed_table

# the matrices in weight-memory order (hw/image/param_map.py MLA_MATRICES): (op, memory-map
# tensor, QMLA field, input vector); the op's name and input per QMLA field
_OP_INPUT = {"dkv": ("dkv", "x"), "q_proj": ("q", "x"), "g_proj": ("g", "x"), "uk": ("uk", "q"),
             "uv": ("uv", "ctx"), "o_proj": ("o", "zo")}
OPS = [(_OP_INPUT[field][0], f"mla.{region}", field, _OP_INPUT[field][1]) for region, field, _, _ in MLA_MATRICES]
OP = {name: n for n, (name, *_rest) in enumerate(OPS)}
SCORE = len(OPS)           # the engine's tag of a score row (the cache against qa_h)
FIRST_READ = OPS[:4]       # requested at ACCEPT
SECOND_READ = OPS[4:]      # requested when every head's ctx is ready


def mla_requests(cfg, layer: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The weight reads of one token of MLA ``layer`` as (byte address, beats) requests:
    (W_dkv .. W_uk, issued at ACCEPT; W_uv, W_o, issued after the softmax)."""
    mm = memory_map(cfg)
    W = cfg.hw.weight_port_bytes
    prefix = layer_prefix(cfg, layer)

    def reads(ops):
        addr, nbytes = mm.span([prefix + t for _, t, _, _ in ops])
        return split_request(addr, nbytes // W, W)
    return reads(FIRST_READ), reads(SECOND_READ)


def require_mla(cfg) -> None:
    """ConfigError (one line) unless the config has an MLA layer."""
    if not mla_layers(cfg):
        raise ConfigError(f"config {cfg.name}: no \"mla\" in model.layers, so no MLA unit")
    if cfg.hw.lanes != cfg.hw.weight_port_bytes:
        raise ConfigError(f"hw.lanes = {cfg.hw.lanes}: the MLA unit needs lanes == hw.weight_port_bytes "
                          f"({cfg.hw.weight_port_bytes}), one port beat per MAC beat")


class MlaUnit(wiring.Component):
    def __init__(self, cfg):
        m_, hw = cfg.model, cfg.hw
        self.cfg = cfg
        self.fm = fm = formats_for(cfg)
        self.layers = mla_layers(cfg)
        require_mla(cfg)
        self.d, self.H, self.dh, self.r = m_.d_model, m_.n_heads, m_.head_dim, m_.kv_rank
        self.W = hw.weight_port_bytes
        self.rb = row_beats(cfg)
        self.slots = sequence_slots(cfg)
        self.contexts = self.slots * len(self.layers)
        self.layer_reqs = [mla_requests(cfg, l) for l in self.layers]
        first, second = self.layer_reqs[0]
        for a, b in self.layer_reqs:
            if [n for _, n in a + b] != [n for _, n in first + second]:
                raise ValueError(f"config {cfg.name}: the MLA layers' reads differ in size")
        self.n_first = len(first)
        self.regions = [memory_map(cfg)[layer_prefix(cfg, self.layers[0]) + t] for _, t, _, _ in OPS]
        a = fm.act_bits
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"x": data.ArrayLayout(signed(a), self.d)}))),
            "layer": In(layer_bits(cfg)),
            "slot": In(slot_bits(cfg)),
            "pos": In(fm.mla_context_bits),
            "o": Out(stream.Signature(data.ArrayLayout(signed(a), self.d))),
            "wport": Out(WeightPortSignature(self.W)),
            "cport": Out(CachePortSignature(self.W)),
            "params": In(param_layout(cfg, "mla", kind="mla")),
            "cycles": Out(32),
            "token_cycles": Out(32),
            "tokens": Out(32),
            "mac_beat": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, fm, P = self.cfg, self.fm, self.params
        d, H, dh, r, W, rb = self.d, self.H, self.dh, self.r, self.W, self.rb
        a, hd, C = fm.act_bits, H * dh, self.contexts
        plan = plan_pipeline(cfg.hw.clock_period_ns)

        def vec(name, n, shape):
            return [Signal(shape, name=f"{name}{i}") for i in range(n)]
        X = vec("x", d, signed(a))
        A = vec("a", r, signed(fm.resid_bits))       # W_dkv x, into the latent's norm
        CN = vec("c", r, signed(a))                  # this token's latent
        Q = vec("q", hd, signed(a))
        QA = vec("qa", H * r, signed(a))
        GATE = vec("gate", hd, table_shape(cfg, "mla.gate"))
        CTX = vec("ctx", H * r, signed(a))
        ZO = vec("zo", hd, signed(a))
        OUT = vec("out", d, signed(a))

        # ---- the token's layer, context and position, registered at acceptance -----------
        k_now, ctx_now = unit_layer(m, cfg.model.n_layers, self.layers, self.layer, self.slot, self.slots,
                                    direct=False)
        tok_k, tok_ctx = Signal(range(max(2, len(self.layers)))), Signal(range(max(2, C)))
        tok_pos = Signal(fm.mla_context_bits)

        # ---- counters (token_count from the ACCEPT cycle to the offer on ``o``, both counted)
        m.d.comb += self.cycles.eq(event_counter(m, 1, "cycles"))
        token_clear = Signal()
        token_count = event_counter(m, 1, "token_count", clear=token_clear, clear_to=2)

        # ---- the engine: matrices from the weight port, scores from the cache ---------------
        widths = sorted({a, fm.resid_bits, fm.lut_in_bits, fm.mla_u_bits})
        sel_of = {"dkv": fm.resid_bits, "q": a, "g": fm.lut_in_bits, "uk": a, "uv": a, "o": a}
        fmt = MatVecFormats.from_config(cfg, out_widths=widths, tag_shape=unsigned(3))
        m.submodules.engine = eng = MatVecEngine(fmt)
        m.d.comb += self.mac_beat.eq(eng.beat)
        # the projection sequencer (hw/proj): the weight requests (the first read at ACCEPT,
        # the second after the softmax) and the matrices' beats, with the row's head for the
        # per-head matrices (W_uk: r rows per head, input q_h; W_uv: dh rows, input ctx_h)
        heads = [r if op == "uk" else dh if op == "uv" else None for op, *_ in OPS]
        m.submodules.seq = seq = ProjectionSequencer(
            [(reg.rows, reg.row_beats) for reg in self.regions], heads, ready=True,
            requests=([f + s for f, s in self.layer_reqs], self.n_first))
        connect_weight_port(m, seq, self.wport)
        sources = {"x": [port_groups(X, W, a)], "q": [port_groups(Q[h * dh:(h + 1) * dh], W, a) for h in range(H)],
                   "ctx": [port_groups(CTX[h * r:(h + 1) * r], W, a) for h in range(H)], "zo": [port_groups(ZO, W, a)]}
        x_group = input_group(m, [sources[src] for *_, src in OPS], seq.op, seq.head, seq.beat)
        m.d.comb += [seq.layer.eq(tok_k), seq.eng_ready.eq(eng.i.ready)]
        # the score feeder and the cache's reads and row write (hw/mla/score.py)
        m.submodules.score = sc = ScoreFeeder(H, r, rb, W, a, fm.mla_context_bits, eng.latency)
        m.submodules.cache = ca = CacheAccess(H, r, rb, W, a, fm.mla_context_bits, C, row_stride(cfg))
        assert cache_tokens(cfg) == 1 << fm.mla_context_bits
        cp = self.cport
        m.d.comb += [sc.tok_pos.eq(tok_pos), sc.cn.eq(Cat(*CN)), sc.qa.eq(Cat(*QA)), sc.eng_ready.eq(eng.i.ready),
                     sc.cache_valid.eq(cp.resp.valid), sc.cache_data.eq(cp.resp.payload.data),
                     cp.resp.ready.eq(sc.cache_ready),
                     ca.tok_pos.eq(tok_pos), ca.tok_ctx.eq(tok_ctx), ca.cn.eq(Cat(*CN)),
                     cp.req.valid.eq(ca.req_valid), ca.req_ready.eq(cp.req.ready), cp.req.payload.addr.eq(ca.req_addr),
                     cp.req.payload.beats.eq(ca.req_beats), cp.wr.valid.eq(ca.wr_valid), ca.wr_ready.eq(cp.wr.ready),
                     cp.wr.payload.addr.eq(ca.wr_addr), cp.wr.payload.data.eq(ca.wr_data)]

        # the engine's input: whichever feeder is on (never both)
        p = eng.i.payload
        with m.If(sc.active):
            m.d.comb += [eng.i.valid.eq(sc.valid), p.w.eq(sc.w), p.x.eq(sc.x), p.first.eq(sc.first),
                         p.last.eq(sc.last), p.mult.eq(P.u_m), p.shift.eq(P.u_s),
                         p.out_sel.eq(widths.index(fm.mla_u_bits)), p.tag.eq(SCORE)]
        with m.Else():
            m.d.comb += [eng.i.valid.eq(seq.enable & seq.resp_valid), p.w.eq(self.wport.resp.payload.data),
                         p.x.eq(x_group), p.first.eq(seq.first), p.last.eq(seq.last),
                         p.mult.eq(Array([getattr(P, field).m for _, _, field, _ in OPS])[seq.op]),
                         p.shift.eq(Array([getattr(P, field).s for _, _, field, _ in OPS])[seq.op]),
                         p.out_sel.eq(Array([Const(widths.index(sel_of[op]), 2) for op, *_ in OPS])[seq.op]),
                         p.tag.eq(seq.op)]

        # ---- the engine's results: scores to the softmax, matrix rows to their registers ----
        m.submodules.softmax_side = sm = ScoreResults(cfg, H, r, eng.o.payload.shape(), SCORE)
        connect(m, eng.o, sm.i)
        m.d.comb += [sm.lat_rdy.eq(sc.lat_rdy), sm.lat_data.eq(sc.lat_data), sc.lat_take.eq(sm.lat_take),
                     sm.tok_pos.eq(tok_pos)]
        with m.If(sm.ctx_valid):
            for h in range(H):
                with m.If(sm.ctx_head == h):
                    m.d.sync += [CTX[h * r + e].eq(sm.ctx[e]) for e in range(r)]
        # matrix rows: registered (the row count's compare and carry fill the next cycle), then
        # one row counter walks each op's rows (results come in feed order)
        res_row = Signal.like(seq.row)
        r1_valid, r1_op, r1_y = Signal(), Signal(3), Signal(signed(fmt.out_bits))
        m.d.sync += [r1_valid.eq(sm.row_valid), r1_op.eq(sm.row.tag), r1_y.eq(sm.row.y)]
        with m.If(r1_valid):
            m.d.sync += res_row.eq(Mux(res_row == Array(Const(reg.rows - 1) for reg in self.regions)[r1_op], 0,
                                       res_row + 1))
        r2_valid, r2_op, r2_row, r2_y = Signal(), Signal(3), Signal.like(seq.row), Signal(signed(fmt.out_bits))
        m.d.sync += [r2_valid.eq(r1_valid), r2_op.eq(r1_op), r2_row.eq(res_row), r2_y.eq(r1_y)]

        def store(buf, idx, value):
            m.d.sync += Array(buf)[idx].eq(value)
        with m.If(r2_valid):
            with m.Switch(r2_op):
                for op, buf in (("dkv", A), ("q", Q), ("uk", QA), ("o", OUT)):
                    with m.Case(OP[op]):
                        store(buf, r2_row, r2_y)
        # the gate: its code through the config's sigmoid table (moekda/tables.py; one cycle)
        m.submodules.lut_gate = lut = TableStage(fm.lut_in_bits, GATE[0].shape(), fixed_table(cfg, "mla.gate"),
                                                 seq.row.shape())
        m.d.comb += [lut.valid.eq(r2_valid & (r2_op == OP["g"])), lut.row.eq(r2_row), lut.addr.eq(r2_y)]
        with m.If(lut.o_valid):
            store(GATE, lut.o_row, lut.data)
        # o times its gate, rounded: zo (hw/proj/results.py)
        m.submodules.gate = gate = GatedProduct(hd, signed(a), GATE[0].shape(), seq.row.shape(), fm.unit_frac, plan)
        m.d.comb += [gate.valid.eq(r2_valid & (r2_op == OP["uv"])), gate.idx.eq(r2_row), gate.y.eq(r2_y[:a]),
                     gate.gates.eq(Cat(*GATE))]
        with m.If(gate.o_valid):
            store(ZO, gate.o_idx, gate.z)
        # rows issued to the engine and not yet in their register
        direct = r2_valid & ((r2_op == OP["dkv"]) | (r2_op == OP["q"]) | (r2_op == OP["uk"]) | (r2_op == OP["o"]))
        m.submodules.pending = pending = PendingRows(
            3, 2 * (max(reg.rows for reg in self.regions) + eng.fifo_depth + gate.stages + 8) - 1)
        m.d.comb += [pending.issued.eq(seq.row_issued), pending.stored.eq(Cat(direct, lut.o_valid, gate.o_valid))]

        # ---- the latent's norm -------------------------------------------------------------
        m.submodules.norm = norm = Normalizer(fm, r, fm.resid_bits, mla_norm_ss_bits(cfg), [a],
                                              param_layout(cfg, "mla.kv_norm", kind="mla"),
                                              clock_period_ns=cfg.hw.clock_period_ns)
        m.d.comb += [norm.norms[0].eq(P.kv_norm), norm.mode.eq(0), norm.rd_x.eq(Array(A)[norm.rd_idx])]
        with m.If(norm.wr_en):
            store(CN, norm.wr_idx, norm.wr_y)

        # ---- phase control (hw/mla/phases.py) ------------------------------------------------
        m.submodules.phases = ph = MlaPhases((OP["uk"], OP["uv"], OP["o"], len(OPS)))
        m.d.comb += [ph.valid.eq(self.i.valid), self.i.ready.eq(ph.ready), ph.o_ready.eq(self.o.ready),
                     self.o.valid.eq(ph.o_valid), self.o.payload.eq(Cat(*OUT)),
                     ph.op.eq(seq.op), ph.at_start.eq(seq.at_start), ph.drained.eq(pending.drained),
                     seq.enable.eq(ph.feed), ph.norm_busy.eq(norm.busy), norm.start.eq(ph.norm_start),
                     ph.score_done.eq(sc.done & (sm.ctx_head == H)), ph.wr_busy.eq(ca.wr_busy),
                     sc.start.eq(ph.score_start), ca.start.eq(ph.score_start), sm.start.eq(ph.score_start),
                     seq.restart.eq(ph.take), seq.more.eq(ph.more), token_clear.eq(ph.take)]
        token_cycles = Signal(32)
        with m.If(ph.finish):
            m.d.sync += token_cycles.eq(token_count)
        m.d.comb += [self.token_cycles.eq(token_cycles), self.tokens.eq(event_counter(m, ph.token_out, "tokens"))]
        with m.If(ph.take):
            m.d.sync += [*[X[n].eq(self.i.payload.x[n]) for n in range(d)], res_row.eq(0),
                         tok_k.eq(k_now), tok_ctx.eq(ctx_now), tok_pos.eq(self.pos)]
        return m


def default_mla(cfg) -> MlaUnit:
    """What `moekda rtl/synth --top mla` builds: the config's MLA unit (no model inside)."""
    require_mla(cfg)            # before the component exists (a half-built one warns)
    return MlaUnit(cfg)
