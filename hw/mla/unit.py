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
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out, connect

from hw.arith.booth_multiply import booth_multiply
from hw.arith.counter import ChunkedCounter, sparse_event_count
from hw.arith.lut import LookupTable, drive_constant
from hw.arith.matvec import MatVecEngine, MatVecFormats, port_groups
from hw.arith.pipeline import Pipe, plan_pipeline
from hw.stream.skid import SkidBuffer
from hw.stream.weight_port import WeightPortSignature, split_request
from hw.image.memory_map import layer_bits, layer_prefix, memory_map, sequence_slots, slot_bits
from hw.image.param_map import mla_norm_ss_bits, param_layout, table_shape
from hw.kda.norm import Normalizer
from hw.mla.cache import (CachePortSignature, cache_tokens, mla_layers, row_beats, row_stride)
from hw.mla.softmax import mla_softmax
from moekda.config import ConfigError
from moekda.formats import formats_for
from moekda.tables import fixed_table

# the matrices in weight-memory order: (op, memory-map tensor, QMLA field, input vector)
OPS = [
    ("dkv", "mla.w_dkv", "dkv", "x"),
    ("q", "mla.w_q", "q_proj", "x"),
    ("g", "mla.w_g", "g_proj", "x"),
    ("uk", "mla.w_uk", "uk", "q"),
    ("uv", "mla.w_uv", "uv", "ctx"),
    ("o", "mla.w_o", "o_proj", "zo"),
]
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
        a = fm.act_bits
        hd = H * dh
        C = self.contexts
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

        # ---- the token's layer, context and position ------------------------------------
        k_of_layer = [self.layers.index(l) if l in self.layers else 0 for l in range(cfg.model.n_layers)]
        tok_k = Signal(range(max(2, len(self.layers))))
        tok_ctx = Signal(range(max(2, C)))
        pos_bits = fm.mla_context_bits
        tok_pos = Signal(pos_bits)
        ctx_now = Signal(range(max(2, C)))
        k_now = Signal.like(tok_k)
        m.d.comb += k_now.eq(Array(Const(k, len(tok_k)) for k in k_of_layer)[self.layer])
        m.d.comb += ctx_now.eq(k_now + len(self.layers) * self.slot if self.slots > 1 else k_now)

        # ---- counters ----------------------------------------------------------------
        cycles = ChunkedCounter(32, name="cycles")
        m.d.comb += [cycles.inc.eq(1), self.cycles.eq(cycles.value)]
        cycles.elaborate(m)
        token_clear = Signal()
        token_count = ChunkedCounter(32, name="token_count")
        m.d.comb += token_count.inc.eq(1)
        # from the ACCEPT cycle to the offer on ``o``, both counted (as the KDA unit's)
        token_count.load(token_clear, Const(2, 32))
        token_count.elaborate(m)
        token_out = Signal()
        m.d.sync += token_out.eq(0)
        m.d.comb += self.tokens.eq(sparse_event_count(m, token_out, "tokens"))

        # ---- weight requests: the first read at ACCEPT, the second after the softmax ------
        reqs_n = [n for _, n in self.layer_reqs[0][0] + self.layer_reqs[0][1]]
        req_idx = Signal(range(len(reqs_n) + 1), init=len(reqs_n))
        req_end = Signal(range(len(reqs_n) + 1), init=len(reqs_n))
        addr_tab = Array(Array(Const(ad, 32) for ad, _ in f + s) for f, s in self.layer_reqs)
        m.d.comb += [self.wport.req.valid.eq(req_idx != req_end),
                     self.wport.req.payload.addr.eq(addr_tab[tok_k][req_idx]),
                     self.wport.req.payload.beats.eq(Array(Const(n, 16) for n in reqs_n)[req_idx])]
        with m.If(self.wport.req.valid & self.wport.req.ready):
            m.d.sync += req_idx.eq(req_idx + 1)

        # ---- the engine: matrices from the weight port, scores from the cache ---------------
        widths = sorted({a, fm.resid_bits, fm.lut_in_bits, fm.mla_u_bits})
        sel_of = {"dkv": fm.resid_bits, "q": a, "g": fm.lut_in_bits, "uk": a, "uv": a, "o": a}
        fmt = MatVecFormats.from_config(cfg, out_widths=widths, tag_shape=unsigned(3))
        m.submodules.engine = eng = MatVecEngine(fmt)
        m.d.comb += self.mac_beat.eq(eng.beat)

        # the matrix feeder: (op, row, beat) over the regions, with the row's head for the
        # per-head matrices (W_uk: r rows per head, input q_h; W_uv: dh rows, input ctx_h)
        regions = self.regions
        per_head = [r if op == "uk" else dh if op == "uv" else reg.rows for (op, *_), reg in zip(OPS, regions)]
        f_op = Signal(range(len(OPS) + 1))
        f_row = Signal(range(max(reg.rows for reg in regions)))
        f_sub = Signal(range(max(per_head)))
        f_head = Signal(range(max(2, H)))
        f_beat = Signal(range(max(reg.row_beats for reg in regions)))
        feed_enable = Signal()
        sources = {"x": [port_groups(X, W, a)], "q": [port_groups(Q[h * dh:(h + 1) * dh], W, a) for h in range(H)],
                   "ctx": [port_groups(CTX[h * r:(h + 1) * r], W, a) for h in range(H)], "zo": [port_groups(ZO, W, a)]}
        x_group = Signal(W * a)
        with m.Switch(f_op):
            for n, (_, _, _, src) in enumerate(OPS):
                with m.Case(n):
                    groups = sources[src]
                    head = f_head if len(groups) > 1 else 0
                    m.d.comb += x_group.eq(Array(Array(g) for g in groups)[head][f_beat])
        rows_of = Array(Const(reg.rows - 1) for reg in regions)[f_op]
        beats_of = Array(Const(reg.row_beats - 1) for reg in regions)[f_op]
        sub_of = Array(Const(n - 1) for n in per_head)[f_op]
        mat_go = feed_enable & self.wport.resp.valid & eng.i.ready
        row_issued = Signal()
        m.d.comb += row_issued.eq(mat_go & (f_beat == beats_of))
        with m.If(mat_go):
            m.d.sync += f_beat.eq(f_beat + 1)
            with m.If(f_beat == beats_of):
                m.d.sync += [f_beat.eq(0), f_row.eq(f_row + 1), f_sub.eq(f_sub + 1)]
                with m.If(f_sub == sub_of):
                    m.d.sync += [f_sub.eq(0), f_head.eq(f_head + 1)]
                with m.If(f_row == rows_of):
                    m.d.sync += [f_row.eq(0), f_sub.eq(0), f_head.eq(0), f_op.eq(f_op + 1)]
        m.d.comb += self.wport.resp.ready.eq(feed_enable & eng.i.ready)

        # the score feeder: per head, positions 0 .. T-1 from the cache, T from CN
        sc_active = Signal()
        sc_head = Signal(range(max(2, H)))
        sc_pos = Signal(pos_bits)
        sc_beat = Signal(range(max(2, rb)))
        from_cache = sc_pos != tok_pos
        cn_groups = port_groups(CN, W, a)
        qa_groups = Array(Array(port_groups(QA[h * r:(h + 1) * r], W, a)) for h in range(H))
        sc_w = Mux(from_cache, self.cport.resp.payload.data, Array(cn_groups)[sc_beat])
        # a latent waits here from its row's last beat until its score leaves the results
        # slice, the engine's latency and the slice's later: at full rate (a row every rb
        # cycles) that is (latency + 2) / rb rows, plus room for the softmax's rescale
        # stalls; a full FIFO holds the feeder (w_rdy), so the depth costs only speed
        # (the engine's whole credit, latency + 5 rows, was 39k um2 of flops on small)
        lat_depth = -(-(eng.latency + 2) // rb) + 3
        m.submodules.latents = lat_fifo = SyncFIFO(width=r * a, depth=lat_depth)
        sc_valid = sc_active & (~from_cache | self.cport.resp.valid) & lat_fifo.w_rdy
        sc_go = sc_valid & eng.i.ready
        m.d.comb += self.cport.resp.ready.eq(sc_active & from_cache & eng.i.ready & lat_fifo.w_rdy)
        sc_done = Signal()      # every head's last position is in the engine
        LAT = vec("lat", max(1, rb - 1), unsigned(8 * W))        # the latent's earlier beats
        with m.If(sc_go):
            m.d.sync += sc_beat.eq(sc_beat + 1)
            if rb > 1:
                m.d.sync += Array(LAT)[sc_beat].eq(sc_w)
            with m.If(sc_beat == rb - 1):
                m.d.sync += [sc_beat.eq(0), sc_pos.eq(sc_pos + 1)]
                with m.If(sc_pos == tok_pos):
                    m.d.sync += [sc_pos.eq(0), sc_head.eq(sc_head + 1)]
                    with m.If(sc_head == H - 1):
                        m.d.sync += [sc_active.eq(0), sc_done.eq(1)]
        latent_bits = Cat(*LAT[:rb - 1], sc_w)[:r * a] if rb > 1 else sc_w[:r * a]
        m.d.comb += [lat_fifo.w_en.eq(sc_go & (sc_beat == rb - 1)), lat_fifo.w_data.eq(latent_bits)]

        # the engine's input: whichever feeder is on (never both)
        row_mult = Array([getattr(P, field).m for _, _, field, _ in OPS])[f_op]
        row_shift = Array([getattr(P, field).s for _, _, field, _ in OPS])[f_op]
        row_sel = Array([Const(widths.index(sel_of[op]), 2) for op, *_ in OPS])[f_op]
        p = eng.i.payload
        with m.If(sc_active):
            m.d.comb += [eng.i.valid.eq(sc_valid), p.w.eq(sc_w), p.x.eq(qa_groups[sc_head][sc_beat]),
                         p.first.eq(sc_beat == 0), p.last.eq(sc_beat == rb - 1),
                         p.mult.eq(P.u_m), p.shift.eq(P.u_s), p.out_sel.eq(widths.index(fm.mla_u_bits)),
                         p.tag.eq(SCORE)]
        with m.Else():
            m.d.comb += [eng.i.valid.eq(feed_enable & self.wport.resp.valid), p.w.eq(self.wport.resp.payload.data),
                         p.x.eq(x_group), p.first.eq(f_beat == 0), p.last.eq(f_beat == beats_of),
                         p.mult.eq(row_mult), p.shift.eq(row_shift), p.out_sel.eq(row_sel), p.tag.eq(f_op)]

        # ---- the engine's results -----------------------------------------------------------
        # the results through a register slice first: the engine FIFO's read mux (0.6 ns)
        # would otherwise be in front of every decision below (model-small-mla: -0.173 ns)
        m.submodules.results = rs = SkidBuffer(eng.o.payload.shape())
        connect(m, eng.o, rs.i)
        res = rs.o.payload
        is_score = res.tag == SCORE
        # (score, latent, last) into the softmax through a register slice: the engine's FIFO
        # read mux and the tag compare ended in the softmax's stage 1 and in this position
        # count (-0.217 ns at tiny's 1.25 ns without the slice and the count's look-ahead)
        m.submodules.softmax = sm = mla_softmax(cfg)
        m.submodules.softmax_slice = sk = SkidBuffer(sm.i.payload.shape())
        connect(m, sk.o, sm.i)
        m.d.comb += [sk.i.valid.eq(rs.o.valid & is_score & lat_fifo.r_rdy),
                     sk.i.payload.u.eq(res.y), sk.i.payload.c.eq(lat_fifo.r_data),
                     rs.o.ready.eq(Mux(is_score, sk.i.ready & lat_fifo.r_rdy, 1))]
        # the head's position count as a look-ahead: the next position (a ChunkedCounter, so
        # the acceptance selects rather than enters a carry chain) and whether it is the
        # head's last are registers
        sm_next, sm_last = ChunkedCounter(pos_bits + 1, name="sm_next"), Signal()
        sm_start = Signal()          # set by the phase control: a token's first head begins
        m.d.comb += sk.i.payload.last.eq(sm_last)
        sm_take = sk.i.valid & sk.i.ready
        m.d.comb += [lat_fifo.r_en.eq(sm_take), sm_next.inc.eq(sm_take & ~sm_last)]
        sm_next.load(sm_start | (sm_take & sm_last), Const(1, pos_bits + 1))
        sm_next.elaborate(m)
        with m.If(sm_start | (sm_take & sm_last)):
            m.d.sync += sm_last.eq(tok_pos == 0)
        with m.Elif(sm_take):
            m.d.sync += sm_last.eq(sm_next.value == tok_pos)
        ctx_head = Signal(range(H + 1))
        m.d.comb += sm.o.ready.eq(1)
        with m.If(sm.o.valid):
            for h in range(H):
                with m.If(ctx_head == h):
                    m.d.sync += [CTX[h * r + e].eq(sm.o.payload[e]) for e in range(r)]
            m.d.sync += ctx_head.eq(ctx_head + 1)

        # matrix rows: registered (the row count's compare and carry fill the next cycle), then
        # one row counter walks each op's rows (results come in feed order)
        res_row = Signal.like(f_row)
        r1_valid, r1_op, r1_y = Signal(), Signal(3), Signal(signed(fmt.out_bits))
        m.d.sync += [r1_valid.eq(rs.o.valid & ~is_score), r1_op.eq(res.tag), r1_y.eq(res.y)]
        with m.If(r1_valid):
            m.d.sync += res_row.eq(Mux(res_row == Array(Const(reg.rows - 1) for reg in regions)[r1_op], 0,
                                       res_row + 1))
        r2_valid, r2_op, r2_row, r2_y = Signal(), Signal(3), Signal.like(f_row), Signal(signed(fmt.out_bits))
        m.d.sync += [r2_valid.eq(r1_valid), r2_op.eq(r1_op), r2_row.eq(res_row), r2_y.eq(r1_y)]

        def store(buf, idx, value):
            m.d.sync += Array(buf)[idx].eq(value)
        stored = []
        direct = Signal()
        m.d.comb += direct.eq(r2_valid & ((r2_op == OP["dkv"]) | (r2_op == OP["q"]) | (r2_op == OP["uk"])
                                          | (r2_op == OP["o"])))
        with m.If(r2_valid):
            with m.Switch(r2_op):
                for op, buf in (("dkv", A), ("q", Q), ("uk", QA), ("o", OUT)):
                    with m.Case(OP[op]):
                        store(buf, r2_row, r2_y)
        stored.append(direct)
        # the gate: its code through the config's sigmoid table (moekda/tables.py; one cycle)
        m.submodules.lut_gate = lut = LookupTable(fm.lut_in_bits, GATE[0].shape())
        drive_constant(m, lut, fixed_table(cfg, "mla.gate"))
        m.d.comb += [lut.addr.eq(r2_y), lut.en.eq(r2_valid & (r2_op == OP["g"]))]
        l_valid, l_row = Signal(), Signal.like(f_row)
        m.d.sync += [l_valid.eq(r2_valid & (r2_op == OP["g"])), l_row.eq(r2_row)]
        with m.If(l_valid):
            store(GATE, l_row, lut.data)
        stored.append(l_valid)
        # o times its gate, rounded: zo (the gate read by index, then a Booth product)
        gp = Pipe(m, plan, "gate")
        g_live = {"valid": r2_valid & (r2_op == OP["uv"]), "idx": r2_row, "y": r2_y[:a].as_signed()}
        g_live = gp.spend(plan.delays.mux_level * (max(1, (hd - 1).bit_length()) + 1), g_live)
        g_val = Signal.like(GATE[0], name="gate_val")
        m.d.comb += g_val.eq(Array(GATE)[g_live["idx"]])
        g_live["g"] = g_val
        g_live = gp.register(g_live)
        g_val = g_live.pop("g")
        g_width = a + len(g_val) + 2
        g_rnd = Const((1 << (fm.unit_frac - 1)) if fm.unit_frac else 0, g_width)
        g_live = gp.register(booth_multiply(gp, g_live, g_live.pop("y"), g_val, g_width, "z", extra_words=[g_rnd]))
        with m.If(g_live["valid"]):
            store(ZO, g_live["idx"], g_live["z"][fm.unit_frac:])
        stored.append(g_live["valid"])
        # rows issued to the engine and not yet in their register (strobes registered first)
        stored_r = Signal(len(stored))
        m.d.sync += stored_r.eq(Cat(*stored))
        pending = Signal(range(2 * (max(reg.rows for reg in regions) + eng.fifo_depth + gp.stages + 8)))
        m.d.sync += pending.eq(pending + row_issued - sum(stored_r[n].as_unsigned() for n in range(len(stored))))
        drained = pending == 0

        # ---- the latent's norm -------------------------------------------------------------
        m.submodules.norm = norm = Normalizer(fm, r, fm.resid_bits, mla_norm_ss_bits(cfg), [a],
                                              param_layout(cfg, "mla.kv_norm", kind="mla"),
                                              clock_period_ns=cfg.hw.clock_period_ns)
        m.d.comb += [norm.norms[0].eq(P.kv_norm), norm.mode.eq(0), norm.rd_x.eq(Array(A)[norm.rd_idx])]
        with m.If(norm.wr_en):
            store(CN, norm.wr_idx, norm.wr_y)

        # ---- the cache: reads per head (one request per cached position), the row write ----
        rq_active = Signal()
        rq_head = Signal(range(max(2, H)))
        rq_pos = Signal(pos_bits)
        # the last cached row, T - 1, as a register (T is constant for the token; the
        # subtract in front of the compare was small's worst path, -0.061 ns at 1 ns)
        rq_last = Signal(pos_bits)
        m.d.sync += rq_last.eq(tok_pos - 1)
        stride_bits = (row_stride(cfg) - 1).bit_length()
        ctx_bits = max(1, (C - 1).bit_length())

        def cache_addr(pos, beat=None):
            """(context, position, beat) -> byte address: a concatenation (hw/mla/cache.py)."""
            low = Const(0, stride_bits)
            if beat is not None:
                low = Signal(stride_bits, name="cache_low")
                m.d.comb += low.eq(beat << (W - 1).bit_length())
            return Cat(low, pos, tok_ctx[:ctx_bits]) if C > 1 else Cat(low, pos)
        assert cache_tokens(cfg) == 1 << pos_bits
        m.d.comb += [self.cport.req.valid.eq(rq_active), self.cport.req.payload.addr.eq(cache_addr(rq_pos)),
                     self.cport.req.payload.beats.eq(rb)]
        with m.If(self.cport.req.valid & self.cport.req.ready):
            m.d.sync += rq_pos.eq(rq_pos + 1)
            with m.If(rq_pos == rq_last):
                m.d.sync += [rq_pos.eq(0), rq_head.eq(rq_head + 1)]
                with m.If(rq_head == H - 1):
                    m.d.sync += rq_active.eq(0)
        wr_active = Signal()
        wr_beat = Signal(range(max(2, rb)))
        m.d.comb += [self.cport.wr.valid.eq(wr_active),
                     self.cport.wr.payload.addr.eq(cache_addr(tok_pos, wr_beat if rb > 1 else None)),
                     self.cport.wr.payload.data.eq(Array(cn_groups)[wr_beat])]
        with m.If(self.cport.wr.valid & self.cport.wr.ready):
            m.d.sync += wr_beat.eq(wr_beat + 1)
            with m.If(wr_beat == rb - 1):
                m.d.sync += [wr_beat.eq(0), wr_active.eq(0)]

        # ---- phase control -------------------------------------------------------------------
        m.d.comb += self.o.payload.eq(Cat(*OUT))
        token_cycles = Signal(32)
        m.d.comb += self.token_cycles.eq(token_cycles)
        with m.FSM():
            with m.State("ACCEPT"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [X[n].eq(self.i.payload.x[n]) for n in range(d)]
                    m.d.sync += [req_idx.eq(0), req_end.eq(self.n_first), f_op.eq(0), f_row.eq(0),
                                 f_sub.eq(0), f_head.eq(0), f_beat.eq(0), res_row.eq(0),
                                 tok_k.eq(k_now), tok_ctx.eq(ctx_now),
                                 tok_pos.eq(self.pos)]
                    m.d.comb += token_clear.eq(1)
                    m.next = "PROJ"
            with m.State("PROJ"):
                # W_uk reads q: hold its first beat until q (and the gate codes) are stored
                wait_q = (f_op == OP["uk"]) & (f_row == 0) & (f_beat == 0) & ~drained
                m.d.comb += feed_enable.eq((f_op < OP["uv"]) & ~wait_q)
                with m.If((f_op == OP["uv"]) & drained):
                    m.d.comb += norm.start.eq(1)
                    m.next = "NORM"
            with m.State("NORM"):
                with m.If(~norm.busy & ~norm.start):
                    m.d.comb += sm_start.eq(1)
                    m.d.sync += [sc_active.eq(1), sc_head.eq(0), sc_pos.eq(0), sc_beat.eq(0), sc_done.eq(0),
                                 ctx_head.eq(0), rq_head.eq(0), rq_pos.eq(0),
                                 rq_active.eq(tok_pos != 0), wr_active.eq(1), wr_beat.eq(0)]
                    m.next = "SCORE"
            with m.State("SCORE"):
                with m.If(sc_done & (ctx_head == H)):
                    m.d.sync += req_end.eq(len(reqs_n))
                    m.next = "UVO"
            with m.State("UVO"):
                wait_zo = (f_op == OP["o"]) & (f_row == 0) & (f_beat == 0) & ~drained
                m.d.comb += feed_enable.eq((f_op < len(OPS)) & ~wait_zo)
                with m.If((f_op == len(OPS)) & drained & ~wr_active):
                    m.d.sync += token_cycles.eq(token_count.value)
                    m.next = "OUTPUT"
            with m.State("OUTPUT"):
                m.d.comb += self.o.valid.eq(1)
                with m.If(self.o.ready):
                    m.d.sync += token_out.eq(1)
                    m.next = "ACCEPT"
        return m


def default_mla(cfg) -> MlaUnit:
    """What `moekda rtl/synth --top mla` builds: the config's MLA unit (no model inside)."""
    require_mla(cfg)            # before the component exists (a half-built one warns)
    return MlaUnit(cfg)
