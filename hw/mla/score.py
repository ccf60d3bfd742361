"""The MLA unit's score feeder and cache access (hw/mla/unit.py, SCORE).

``ScoreFeeder``: per head h, positions 0 .. T-1 from the cache and T from the token's own
latent stream through the engine against qa_h, a latent (rb beats) per position; a FIFO
keeps each latent from its row's last beat until its score leaves the engine, for the
softmax.  ``CacheAccess``: the reads of those rows (one request per cached position, per
head) and the write of the token's latent as row T.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from hw.arith.matvec import port_groups


class ScoreFeeder(wiring.Component):
    """``start`` (the phase control): head 0, position 0.  ``cn``: the token's latent;
    ``qa``: q_h W_uk,h of every head.  ``cache_*``: the cache's response beats.  Out to the
    engine: ``valid`` / ``w`` / ``x`` / ``first`` / ``last`` while ``active``, a beat taken
    when ``eng_ready``; ``done``: every head's last position is in the engine.  ``lat_*``:
    the latents' FIFO, read by the softmax's side (``lat_take``)."""

    def __init__(self, H: int, r: int, rb: int, W: int, act_bits: int, pos_bits: int, engine_latency: int):
        self.H, self.r, self.rb, self.W, self.a = H, r, rb, W, act_bits
        # a latent waits from its row's last beat until its score leaves the results slice,
        # the engine's latency and the slice's later: at full rate (a row every rb cycles)
        # that is (latency + 2) / rb rows, plus room for the softmax's rescale stalls; a full
        # FIFO holds the feeder (w_rdy), so the depth costs only speed (the engine's whole
        # credit, latency + 5 rows, was 39k um2 of flops on small)
        self.lat_depth = -(-(engine_latency + 2) // rb) + 3
        super().__init__({
            "start": In(1), "tok_pos": In(pos_bits),
            "cn": In(data.ArrayLayout(signed(act_bits), r)), "qa": In(data.ArrayLayout(signed(act_bits), H * r)),
            "cache_valid": In(1), "cache_data": In(8 * W), "cache_ready": Out(1), "eng_ready": In(1),
            "active": Out(1), "done": Out(1), "valid": Out(1), "w": Out(8 * W), "x": Out(W * act_bits),
            "first": Out(1), "last": Out(1),
            "lat_rdy": Out(1), "lat_data": Out(r * act_bits), "lat_take": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        H, r, rb, W, a = self.H, self.r, self.rb, self.W, self.a
        sc_head = Signal(range(max(2, H)))
        sc_pos = Signal(len(self.tok_pos))
        sc_beat = Signal(range(max(2, rb)))
        from_cache = sc_pos != self.tok_pos
        cn_groups = port_groups([self.cn[i] for i in range(r)], W, a)
        qa_groups = Array(Array(port_groups([self.qa[h * r + i] for i in range(r)], W, a)) for h in range(H))
        sc_w = Mux(from_cache, self.cache_data, Array(cn_groups)[sc_beat])
        m.submodules.latents = lat_fifo = SyncFIFO(width=r * a, depth=self.lat_depth)
        sc_valid = self.active & (~from_cache | self.cache_valid) & lat_fifo.w_rdy
        sc_go = sc_valid & self.eng_ready
        m.d.comb += [self.cache_ready.eq(self.active & from_cache & self.eng_ready & lat_fifo.w_rdy),
                     self.valid.eq(sc_valid), self.w.eq(sc_w), self.x.eq(qa_groups[sc_head][sc_beat]),
                     self.first.eq(sc_beat == 0), self.last.eq(sc_beat == rb - 1),
                     self.lat_rdy.eq(lat_fifo.r_rdy), self.lat_data.eq(lat_fifo.r_data), lat_fifo.r_en.eq(self.lat_take)]
        LAT = [Signal(unsigned(8 * W), name=f"lat{i}") for i in range(max(1, rb - 1))]   # the latent's earlier beats
        with m.If(sc_go):
            m.d.sync += sc_beat.eq(sc_beat + 1)
            if rb > 1:
                m.d.sync += Array(LAT)[sc_beat].eq(sc_w)
            with m.If(sc_beat == rb - 1):
                m.d.sync += [sc_beat.eq(0), sc_pos.eq(sc_pos + 1)]
                with m.If(sc_pos == self.tok_pos):
                    m.d.sync += [sc_pos.eq(0), sc_head.eq(sc_head + 1)]
                    with m.If(sc_head == H - 1):
                        m.d.sync += [self.active.eq(0), self.done.eq(1)]
        latent_bits = Cat(*LAT[:rb - 1], sc_w)[:r * a] if rb > 1 else sc_w[:r * a]
        m.d.comb += [lat_fifo.w_en.eq(sc_go & (sc_beat == rb - 1)), lat_fifo.w_data.eq(latent_bits)]
        with m.If(self.start):
            m.d.sync += [self.active.eq(1), sc_head.eq(0), sc_pos.eq(0), sc_beat.eq(0), self.done.eq(0)]
        return m


class CacheAccess(wiring.Component):
    """``start`` (with SCORE): the reads of rows 0 .. T-1 (``tok_pos`` = T) for every head,
    and the write of the latent ``cn`` as row T of context ``tok_ctx``; ``wr_busy`` until it
    is written.  ``req_*`` / ``wr_*``: the cache port's (hw/mla/cache.py)."""

    def __init__(self, H: int, r: int, rb: int, W: int, act_bits: int, pos_bits: int, contexts: int,
                 stride: int):
        self.H, self.r, self.rb, self.W, self.a, self.C, self.stride = H, r, rb, W, act_bits, contexts, stride
        addr_bits = (stride - 1).bit_length() + pos_bits + (max(1, (contexts - 1).bit_length()) if contexts > 1 else 0)
        super().__init__({
            "start": In(1), "tok_pos": In(pos_bits), "tok_ctx": In(range(max(2, contexts))),
            "cn": In(data.ArrayLayout(signed(act_bits), r)),
            "req_valid": Out(1), "req_ready": In(1), "req_addr": Out(addr_bits), "req_beats": Out(range(rb + 1)),
            "wr_valid": Out(1), "wr_ready": In(1), "wr_addr": Out(addr_bits), "wr_data": Out(8 * W),
            "wr_busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        H, rb, W, C = self.H, self.rb, self.W, self.C
        tok_pos = self.tok_pos
        rq_head = Signal(range(max(2, H)))
        rq_pos = Signal(len(tok_pos))
        # the last cached row, T - 1, as a register (T is constant for the token; the
        # subtract in front of the compare was small's worst path, -0.061 ns at 1 ns)
        rq_last = Signal(len(tok_pos))
        m.d.sync += rq_last.eq(tok_pos - 1)
        stride_bits = (self.stride - 1).bit_length()
        ctx_bits = max(1, (C - 1).bit_length())

        def cache_addr(pos, beat=None):
            """(context, position, beat) -> byte address: a concatenation (hw/mla/cache.py)."""
            low = Const(0, stride_bits)
            if beat is not None:
                low = Signal(stride_bits, name="cache_low")
                m.d.comb += low.eq(beat << (W - 1).bit_length())
            return Cat(low, pos, self.tok_ctx[:ctx_bits]) if C > 1 else Cat(low, pos)
        m.d.comb += [self.req_addr.eq(cache_addr(rq_pos)), self.req_beats.eq(rb)]
        with m.If(self.req_valid & self.req_ready):
            m.d.sync += rq_pos.eq(rq_pos + 1)
            with m.If(rq_pos == rq_last):
                m.d.sync += [rq_pos.eq(0), rq_head.eq(rq_head + 1)]
                with m.If(rq_head == H - 1):
                    m.d.sync += self.req_valid.eq(0)
        wr_beat = Signal(range(max(2, rb)))
        cn_groups = port_groups([self.cn[i] for i in range(self.r)], W, self.a)
        m.d.comb += [self.wr_valid.eq(self.wr_busy), self.wr_addr.eq(cache_addr(tok_pos, wr_beat if rb > 1 else None)),
                     self.wr_data.eq(Array(cn_groups)[wr_beat])]
        with m.If(self.wr_valid & self.wr_ready):
            m.d.sync += wr_beat.eq(wr_beat + 1)
            with m.If(wr_beat == rb - 1):
                m.d.sync += [wr_beat.eq(0), self.wr_busy.eq(0)]
        with m.If(self.start):
            m.d.sync += [rq_head.eq(0), rq_pos.eq(0), self.req_valid.eq(tok_pos != 0), self.wr_busy.eq(1),
                         wr_beat.eq(0)]
        return m


class ScoreResults(wiring.Component):
    """The engine's results (``i``) through a register slice first: the engine FIFO's read
    mux (0.6 ns) would otherwise be in front of every decision after it (model-small-mla:
    -0.173 ns).  Scores (tag ``score_tag``) go with their latent (``lat_*``, the score
    feeder's FIFO) and the head's last-position flag into the online softmax
    (hw/mla/softmax.py) through a second slice: the FIFO read mux and the tag compare ended
    in the softmax's stage 1 and in the position count (-0.217 ns at tiny's 1.25 ns
    without the slice and the count's look-ahead).  ``ctx``: head ``ctx_head``'s context
    vector when ``ctx_valid`` (heads in order from ``start``).  Matrix rows leave on
    ``row`` when ``row_valid`` (never held)."""

    def __init__(self, cfg, H: int, r: int, result_shape, score_tag: int):
        from hw.mla.softmax import mla_softmax
        from moekda.formats import formats_for
        self.H, self.score_tag = H, score_tag
        self.pos_bits = formats_for(cfg).mla_context_bits
        self.softmax = mla_softmax(cfg)
        super().__init__({
            "i": In(stream.Signature(result_shape)), "start": In(1), "tok_pos": In(self.pos_bits),
            "lat_rdy": In(1), "lat_data": In(r * formats_for(cfg).act_bits), "lat_take": Out(1),
            "row_valid": Out(1), "row": Out(result_shape),
            "ctx_valid": Out(1), "ctx_head": Out(range(H + 1)), "ctx": Out(self.softmax.o.payload.shape()),
        })

    def elaborate(self, platform):
        from hw.arith.counter import ChunkedCounter
        from hw.stream.skid import SkidBuffer
        m = Module()
        pos_bits, tok_pos = self.pos_bits, self.tok_pos
        m.submodules.results = rs = SkidBuffer(self.i.payload.shape())
        wiring.connect(m, wiring.flipped(self.i), rs.i)
        res = rs.o.payload
        is_score = res.tag == self.score_tag
        m.submodules.softmax = sm = self.softmax
        m.submodules.softmax_slice = sk = SkidBuffer(sm.i.payload.shape())
        wiring.connect(m, sk.o, sm.i)
        m.d.comb += [sk.i.valid.eq(rs.o.valid & is_score & self.lat_rdy),
                     sk.i.payload.u.eq(res.y), sk.i.payload.c.eq(self.lat_data),
                     rs.o.ready.eq(Mux(is_score, sk.i.ready & self.lat_rdy, 1)),
                     self.row_valid.eq(rs.o.valid & ~is_score), self.row.eq(res)]
        # the head's position count as a look-ahead: the next position (a ChunkedCounter, so
        # the acceptance selects rather than enters a carry chain) and whether it is the
        # head's last are registers
        sm_next, sm_last = ChunkedCounter(pos_bits + 1, name="sm_next"), Signal()
        m.d.comb += sk.i.payload.last.eq(sm_last)
        sm_take = sk.i.valid & sk.i.ready
        m.d.comb += [self.lat_take.eq(sm_take), sm_next.inc.eq(sm_take & ~sm_last)]
        sm_next.load(self.start | (sm_take & sm_last), Const(1, pos_bits + 1))
        sm_next.elaborate(m)
        with m.If(self.start | (sm_take & sm_last)):
            m.d.sync += sm_last.eq(tok_pos == 0)
        with m.Elif(sm_take):
            m.d.sync += sm_last.eq(sm_next.value == tok_pos)
        m.d.comb += [sm.o.ready.eq(1), self.ctx_valid.eq(sm.o.valid), self.ctx.eq(sm.o.payload)]
        with m.If(sm.o.valid):
            m.d.sync += self.ctx_head.eq(self.ctx_head + 1)
        with m.If(self.start):
            m.d.sync += self.ctx_head.eq(0)
        return m
