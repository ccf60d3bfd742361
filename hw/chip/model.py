"""The model chip: token id in, next token id out; the L layers of the model on ONE layer datapath.

Implements ``model.int_model.int_model_step`` bit for bit, token after token::

    x_0 = emb[token];  x_l+1 = layer l (x_l), l = 0 .. L-1;  logits = head(x_L);  next = argmax

Block diagram::

  i (token, first, slot) -> Embedding -> X[slot] -> LayerDatapath (layer l, slot) -+-> Head -> o (next, logit, seq, slot)
                                           ^------------- y, while l < L-1 ---------+      `-> logits (CTRL.LOGITS)
  ImageLoader: LOAD (the image, checked; layer 0's block, the head's block), FETCH (one half of layer l's block)
  loader, KDA, embedding, MLA, MoE, head -> WeightArbiter (fixed priority, in pieces) -> register slices -> wport
  MLA's latent cache port -> register slices -> cport (a hybrid's "mla" layers; hw/mla/cache.py)
  bus (Wishbone) -> LayerCsr (hw/chip/csr.py; CTRL.LOGITS, N_LAYERS, VOCAB)

Sequencing.  A token's layer l+1 needs its layer l, so one sequence cannot overlap its
own layers; the chip keeps ``hw.sequences`` slots, one token of one sequence in each
(``Slot``: EMPTY, EMBED, READY, INSIDE, HEADQ), and with two of them the datapath's two
stages run both tokens half a layer apart: stage A has slot p's token at layer l+1 while
stage B has slot q's at layer l (docs/chip.md "The model chip").  The parameter bank
is two halves that change on their own (hw/chip/loader.py): the token mixer's, read by
stage A, and the channel mixer's, read by stage B.  A ready slot is offered to stage A
when the token half holds its layer; the channel half is fetched for stage A's token as
soon as stage B is empty (the hand-over waits for it, ``b_go``); the token half is
fetched for a ready slot when stage A has no use for it, or ahead for the layer stage
B's token goes to next.  Each half of a layer is then fetched once for both slots'
tokens, and the area of the parameter flops stays one layer's whatever L is.  The
weight port is shared by fixed priority in pieces of ARB_CHUNK beats, the KDA first (the
longer stage), so the MoE's experts stream in the KDA's delta rule rather than ahead
of its projections.  The units keep one state per layer and slot (KDA delta-rule state
and short-convolution history: context slot * K + k for the k-th of the K KDA layers; an
MLA layer's latent cache, in the memory behind ``cport``: context slot * n_mla + k) and
take the layer's index and the slot with the token; the head runs one token at a time.

With Attention Residuals (model.attn_res != "none") every stage's input is a mix of the
depth unit (hw/attnres/chip.py DepthSequencer): the embedding row, stage A's sum (the
datapath's ``ha``) and stage B's output go to it, its mixes come back as X (stage A's
input, the head's after the last layer) and as stage B's input (``hq``); docs/chip.md.

Sequence rules per slot, as on the layer chip: a token starts a new sequence in its slot
when its ``first`` bit is set; a CLEAR write, a LOAD or a reset starts a new one in
every slot.  ``seq`` on ``o`` is the token's position in its slot's sequence.
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from hw.arith.counter import ChunkedCounter
from hw.attnres.chip import DepthSequencer, Src
from hw.attnres.kept import depth_engine_beats_per_token, depth_macs_per_token
from hw.chip.csr import LayerCsr, WishboneSignature
from hw.chip.datapath import SEQ_BITS, LayerDatapath
from hw.chip.embed import Embedding, token_bits, token_id_layout
from hw.chip.head import Head
from hw.chip.layer import connect_status, sequence_rules, weight_port_slices
from hw.chip.loader import ImageLoader
from hw.chip.weight_arbiter import WeightArbiter
from hw.stream.skid import SkidBuffer
from hw.stream.weight_port import WeightPortSignature
from hw.image.format import image_layout
from hw.image.memory_map import (dense_tensors, layer_bits, layer_count, layer_kind, layer_prefix, memory_map,
                                 moe_token_regions, sequence_slots, slot_bits, token_mixer_tensors)
from hw.mla.cache import CachePortSignature, cache_write_layout, mla_layers, row_beats
from moekda.config import ConfigError, require_chip_model
from moekda.formats import formats_for


# the model chip's weight arbiter: pieces of 32 beats, two in flight (the memory's latency
# and the register slices are covered; an urgent request waits about 64 beats).  Measured on
# model-small-sram, 97 tokens without stalls, with the loader first: 16,287 cycles a token
# at 32 beats, 16,549 at 64, 16,834 at 128; three in flight (64 beats) 17,010 (docs/chip.md)
ARB_CHUNK, ARB_AHEAD = 32, 2


class Slot(enum.Enum, shape=3):
    """Where a sequence slot's token is."""
    EMPTY = 0      # none: the slot takes the next token of its sequence
    EMBED = 1      # its embedding row is being read
    READY = 2      # x_l in the slot's register, waiting for stage A with layer l's token half
    INSIDE = 3     # in the datapath
    HEADQ = 4      # x_L ready, waiting for (or in) the head


def model_in_layout(cfg) -> data.StructLayout:
    """One input per token: its id and ``first`` (the embedding's input beat), and with
    ``hw.sequences`` > 1 the sequence slot it belongs to."""
    lay = dict(token_id_layout(cfg).members)
    if sequence_slots(cfg) > 1:
        lay["slot"] = slot_bits(cfg)
    return data.StructLayout(lay)


def model_out_layout(cfg) -> data.StructLayout:
    """One output per input token: the next token id (the argmax of the logits, lowest
    index on a tie), its logit (resid_bits), and ``seq`` as on the layer chip."""
    lay = {"token": token_bits(cfg), "logit": signed(formats_for(cfg).resid_bits), "seq": SEQ_BITS}
    if sequence_slots(cfg) > 1:
        lay["slot"] = slot_bits(cfg)
    return data.StructLayout(lay)


def _used_matrices(cfg) -> list[str]:
    """Memory-map regions a token reads, once each (the routed experts: top_k of them, all of
    one shape, so expert 0 stands for each chosen one), the LM head included."""
    mm = memory_map(cfg)
    m = cfg.model
    out = []
    for l in range(layer_count(cfg)):
        p = layer_prefix(cfg, l)
        out += [p + name for name, _, _ in token_mixer_tensors(cfg, layer_kind(cfg, l))]
        if m.mixers[l] == "dense":
            out += [p + name for name, _, _ in dense_tensors(cfg)]
        else:
            out += moe_token_regions(cfg, p)
    out.append("lm_head" if "lm_head" in mm else "embedding")
    return out


def model_macs_per_token(cfg) -> int:
    """Weight elements used per token: every layer's KDA (or MLA) matrices, router, shared
    and chosen experts (a dense layer: its chunks), and the LM head (V x d); the embedding
    row is a lookup, not a MAC.  With Attention Residuals also the depth unit's mixes
    (hw/attnres/kept.py depth_macs_per_token: each kept key scored against the query, each
    value weighted into the mix).  (An MLA layer's scores against its cache are MACs on no
    weight: ``model_engine_macs_per_token`` counts them.)"""
    mm = memory_map(cfg)
    return sum(mm[n].rows * mm[n].cols for n in _used_matrices(cfg)) + depth_macs_per_token(cfg)


def model_engine_macs_per_token(cfg, pos: int = 0) -> int:
    """What the MACS counter grows by per token at sequence position ``pos``: ``hw.lanes``
    per beat the engines (KDA's, MLA's, MoE's, the head's) take, i.e. every used row
    padded to whole beats, and on each MLA layer the scores: every head's query against
    the pos + 1 cached latents, one row of ``row_beats`` beats each (hw/mla/unit.py
    SCORE), the one part of a token's work that grows with its context; with Attention
    Residuals the depth unit's engine's scores (hw/attnres/kept.py
    depth_engine_beats_per_token; its softmax's weighted sums are no engine beats, as the
    MLA's are not)."""
    mm = memory_map(cfg)
    scores = len(mla_layers(cfg)) * cfg.model.n_heads * row_beats(cfg) * (pos + 1) if mla_layers(cfg) else 0
    return cfg.hw.lanes * (sum(mm[n].beats for n in _used_matrices(cfg)) + scores
                           + depth_engine_beats_per_token(cfg))


class ModelTop(wiring.Component):
    def __init__(self, cfg):
        if cfg.model.vocab == 0:
            raise ConfigError(f"config {cfg.name}: model.vocab = 0, no tokens: the model chip needs a "
                              "vocabulary (16 to 65536); a one-layer config builds the layer chip")
        require_chip_model(cfg)     # before any sub-module exists (a half-built one warns)
        self.cfg = cfg
        self.L = layer_count(cfg)
        self.S = sequence_slots(cfg)
        super().__init__({
            "i": In(stream.Signature(model_in_layout(cfg))),
            "o": Out(stream.Signature(model_out_layout(cfg))),
            "logits": Out(Head.logits_signature(cfg)),
            "wport": Out(WeightPortSignature(cfg.hw.weight_port_bytes)),
            # the MLA layers' latent cache (hw/mla/cache.py), a memory of its own
            **({"cport": Out(CachePortSignature(cfg.hw.weight_port_bytes))} if mla_layers(cfg) else {}),
            "bus": In(WishboneSignature()),
        })

    def elaborate(self, platform):
        # the slots and their moves here; the ports and CSRs, the FETCH policy and the head
        # are methods of their own, building into this Module (they share the slots' registers)
        m = Module()
        cfg, L, S = self.cfg, self.L, self.S
        fm = formats_for(cfg)
        d = cfg.model.d_model
        lb = layer_bits(cfg)

        m.submodules.loader = loader = ImageLoader(cfg)
        m.submodules.datapath = dp = LayerDatapath(cfg)
        m.submodules.embed = embed = Embedding(cfg)
        m.submodules.head = head = Head(cfg)
        m.d.comb += [dp.bank.eq(loader.bank), head.params.eq(loader.head_params)]
        if loader.tap_words:      # the short convolutions' taps, when in SRAM
            connect(m, loader.tap_w, dp.tap_w)
        depth, csr = self._ports(m, loader, dp, embed, head)

        # ---- LOAD: waits until no token is inside; leaves layer 0's block in both halves
        load_pending, loading, load_start = Signal(), Signal(), Signal()
        m.d.comb += loading.eq(load_pending | (loader.busy & ~loader.fetching))
        with m.If(csr.load):
            m.d.sync += load_pending.eq(1)
        allowed = csr.run & loader.loaded & ~loading

        # ---- the sequence slots: one token of each sequence inside at a time
        st = [Signal(Slot, name=f"slot{s}_state") for s in range(S)]
        X = [Signal(data.ArrayLayout(signed(fm.resid_bits), d), name=f"slot{s}_x") for s in range(S)]
        lay = [Signal(lb, name=f"slot{s}_layer") for s in range(S)]       # the layer it is at
        first = [Signal(name=f"slot{s}_first") for s in range(S)]         # the token starts a sequence
        tags = [Signal(SEQ_BITS, name=f"slot{s}_tag") for s in range(S)]
        # cycles since the slot's token was accepted (chunked: no 32-bit carry chain)
        cycles = [ChunkedCounter(32, name=f"slot{s}_cycles") for s in range(S)]
        token_cycles = Signal(32)
        in_slot = self.i.payload.slot if S > 1 else Const(0, 1)
        accept = self.i.valid & self.i.ready
        seqs = [sequence_rules(m, csr, self.i.payload.first, accept & (in_slot == s), load_start)
                for s in range(S)]
        all_empty = Signal()
        m.d.comb += all_empty.eq(Cat(st[s] == Slot.EMPTY for s in range(S)).all())

        # ---- which layer each half of the bank holds (hw/chip/loader.py: LOAD puts layer 0 in both)
        BA, BB = Signal(lb, name="bank_token_layer"), Signal(lb, name="bank_channel_layer")
        f_half = Signal()                   # the half the loader's FETCH fills
        strobe, strobe_half, strobe_layer = Signal(), Signal(), Signal(lb)
        fa_busy, fb_busy = Signal(), Signal()
        m.d.comb += [fa_busy.eq((loader.fetching & ~f_half) | (strobe & ~strobe_half)),
                     fb_busy.eq((loader.fetching & f_half) | (strobe & strobe_half)),
                     loader.fetch.eq(strobe), loader.fetch_half.eq(strobe_half),
                     loader.fetch_layer.eq(strobe_layer)]
        with m.If(strobe):
            m.d.sync += f_half.eq(strobe_half)
            with m.If(strobe_half):
                m.d.sync += BB.eq(strobe_layer)
            with m.Else():
                m.d.sync += BA.eq(strobe_layer)

        with m.If(load_pending & dp.idle & ~loader.busy & all_empty & ~strobe):
            m.d.comb += [load_start.eq(1), loader.start.eq(1), dp.params_change.eq(1)]
            m.d.sync += [load_pending.eq(0), BA.eq(0), BB.eq(0)]

        # ---- input: a token of a free slot goes straight to the embedding's request
        embed_busy = Signal()
        embed_slot = Signal(range(S))
        in_free = Array(st[s] == Slot.EMPTY for s in range(S))[in_slot]
        m.d.comb += [embed.i.valid.eq(self.i.valid & allowed & ~embed_busy & in_free),
                     self.i.ready.eq(embed.i.ready & allowed & ~embed_busy & in_free),
                     embed.i.payload.token.eq(self.i.payload.token),
                     embed.i.payload.first.eq(Array(q.starts for q in seqs)[in_slot]),
                     embed.o.ready.eq(embed_busy & (depth.x0.ready if depth else 1))]
        embedded = embed_busy & embed.o.valid & embed.o.ready
        # with AttnRes the row goes to the depth unit (START), and its mix comes back to X
        mixed = Signal()
        if depth:
            m.d.comb += [depth.x0.valid.eq(embed_busy & embed.o.valid), depth.x0.payload.v.eq(embed.o.payload.x),
                         depth.x0.payload.slot.eq(embed_slot),
                         mixed.eq(depth.mix.valid & depth.mix.ready & (depth.mix.payload.src != Src.A))]
        for s in range(S):
            with m.If(accept & (in_slot == s)):
                m.d.sync += [st[s].eq(Slot.EMBED), tags[s].eq(seqs[s].tag), first[s].eq(seqs[s].starts),
                             lay[s].eq(0)]
            if depth is None:
                with m.If(embedded & (embed_slot == s)):
                    m.d.sync += [X[s].eq(embed.o.payload.x), st[s].eq(Slot.READY)]
            else:
                with m.If(mixed & (depth.mix.payload.slot == s)):
                    m.d.sync += X[s].eq(depth.mix.payload.v)
                    with m.If(depth.mix.payload.src == Src.X0):
                        m.d.sync += st[s].eq(Slot.READY)
                    with m.Elif(lay[s] == L - 1):
                        m.d.sync += st[s].eq(Slot.HEADQ)
                    with m.Else():
                        m.d.sync += [lay[s].eq(lay[s] + 1), st[s].eq(Slot.READY)]
        with m.If(accept):
            m.d.sync += [embed_busy.eq(1), embed_slot.eq(in_slot)]
        with m.Elif(embedded):
            m.d.sync += embed_busy.eq(0)

        # ---- the datapath: a ready slot whose layer the token half holds is offered to stage A
        # (registered, and held until taken: the stream rule, which stage A's early RMSNorm needs)
        offering = Signal()
        offer_slot = Signal(range(S))
        ready = [st[s] == Slot.READY for s in range(S)]
        cand = [ready[s] & (lay[s] == BA) & ~fa_busy for s in range(S)]
        with m.If(~offering):
            for s in reversed(range(S)):          # the lowest slot first
                with m.If(cand[s]):
                    m.d.sync += [offering.eq(1), offer_slot.eq(s)]
        m.d.comb += [dp.i.valid.eq(offering),
                     dp.i.payload.x.eq(Array(X)[offer_slot]), dp.i.payload.first.eq(Array(first)[offer_slot]),
                     dp.i.payload.layer.eq(Array(lay)[offer_slot]), dp.i.payload.tag.eq(Array(tags)[offer_slot]),
                     dp.i.payload.slot.eq(offer_slot)]
        if depth:
            # stage A's sum and stage B's output to the depth unit (ADD); the mix after stage
            # A's is stage B's input, the one after stage B's the slot's next X (above)
            m.d.comb += [depth.ya.valid.eq(dp.ha.valid), depth.ya.payload.eq(dp.ha.payload),
                         dp.ha.ready.eq(depth.ya.ready),
                         depth.yb.valid.eq(dp.o.valid), depth.yb.payload.v.eq(dp.o.payload.y),
                         depth.yb.payload.slot.eq(dp.o.payload.slot), dp.o.ready.eq(depth.yb.ready),
                         dp.hq.valid.eq(depth.mix.valid & (depth.mix.payload.src == Src.A)),
                         dp.hq.payload.eq(depth.mix.payload.v),
                         depth.mix.ready.eq(Mux(depth.mix.payload.src == Src.A, dp.hq.ready, 1))]
        else:
            m.d.comb += dp.o.ready.eq(1)
        for s in range(S):
            with m.If(dp.i.valid & dp.i.ready & (offer_slot == s)):
                m.d.sync += [offering.eq(0), st[s].eq(Slot.INSIDE)]
            if depth is None:
                with m.If(dp.o.valid & (dp.o.payload.slot == s)):
                    m.d.sync += X[s].eq(dp.o.payload.y)
                    with m.If(lay[s] == L - 1):
                        m.d.sync += st[s].eq(Slot.HEADQ)
                    with m.Else():
                        m.d.sync += [lay[s].eq(lay[s] + 1), st[s].eq(Slot.READY)]

        self._fetch_policy(m, loader, dp, ready, lay, (BA, BB), fb_busy, load_pending, offering,
                           (strobe, strobe_half, strobe_layer))

        # ---- the head, one token at a time; the next id (and its logits) out
        head_offer, head_busy = self._head_and_out(m, head, st, X, tags, cycles, token_cycles, accept, in_slot)

        busy = ~all_empty
        clear_pending = Signal()
        m.d.comb += clear_pending.eq(Cat(q.clear_pending for q in seqs).any())
        connect_status(m, csr, self, loader, busy=busy, loading=loading, clear_pending=clear_pending,
                       mac_beats=Cat(dp.mac_beat, head.mac_beat, *([depth.mac_beat] if depth else [])),
                       token_cycles=token_cycles)
        m.d.comb += [csr.ev_fetch.eq(loader.fetching), csr.ev_layer.eq(dp.busy),
                     csr.ev_head.eq(head_offer | head_busy)]
        return m

    def _ports(self, m, loader, dp, embed, head):
        """The weight port's clients onto one arbiter and out through register slices (the
        cache port too, on a hybrid), the depth unit where the config has Attention
        Residuals, the CSRs on the bus and the logits out.  Returns the depth unit (or None)
        and the CSRs."""
        cfg = self.cfg
        # fixed priority, most critical first: a FETCH gates a stage (the hand-over to stage B
        # waits for the channel half, stage A for the token half), and it is short (289 beats
        # at most on model-small), so it goes before stage A (the KDA), the longer stage; the
        # MoE streams in stage A's delta rule; the head has a slot's time.  (The KDA first, the
        # loader second: model-small-sram 16,549 against 16,630 cycles a token at 64-beat
        # pieces.)  Requests go down in pieces (WeightArbiter chunk) so a later, more urgent
        # one waits behind at most ARB_AHEAD pieces, not behind a whole expert
        # (the MLA unit, a hybrid's other token mixer, has stage A's rank after the
        # fetches: its layers are one in four and its first read is the one that waits)
        clients = [loader.wport] + ([dp.kda_wport] if dp.kda_layers else []) + [embed.wport] + \
            ([dp.mla_wport] if dp.mla_layers else []) + [dp.moe_wport, head.wport]
        depth = None
        if dp.attn_res:
            # Attention Residuals: every stage input is a mix of the depth unit (hw/attnres/chip.py);
            # its query reads gate a stage, so they rank after the fetches, before the MoE's
            m.submodules.depth = depth = DepthSequencer(cfg)
            m.d.comb += depth.params.eq(loader.attn_res_params)
            clients.insert(clients.index(dp.moe_wport), depth.wport)
        m.submodules.arbiter = arb = WeightArbiter(cfg.hw.weight_port_bytes, len(clients), priority=True,
                                                   chunk=ARB_CHUNK, ahead=ARB_AHEAD)
        for n, port in enumerate(clients):
            connect(m, port, arb.up[n])
        weight_port_slices(m, cfg, arb.down, self.wport)
        if dp.mla_layers:
            # the cache port through register slices too: its read requests come from the
            # unit's score loop and its responses feed the engine, as the weight port's
            weight_port_slices(m, cfg, dp.cport, self.cport, prefix="cache_")
            m.submodules.cache_wr_slice = cwr = SkidBuffer(cache_write_layout(cfg.hw.weight_port_bytes))
            connect(m, dp.cport.wr, cwr.i)
            connect(m, cwr.o, wiring.flipped(self.cport.wr))
        m.submodules.csr = csr = LayerCsr(cfg, model_macs_per_token(cfg), image_layout(cfg).length,
                                          engines=dp.engines + 1 + (depth is not None), stages=True,
                                          # the cache port feeds the MLA's scores beside the weight
                                          # port, the depth unit's kept keys its engine from registers
                                          mac_rate=2 if dp.mla_layers or depth is not None else 1)
        connect(m, wiring.flipped(self.bus), csr.bus)
        connect(m, head.logits, wiring.flipped(self.logits))
        m.d.comb += head.logits_en.eq(csr.logits_en)
        return depth, csr

    def _fetch_policy(self, m, loader, dp, ready, lay, banks, fb_busy, load_pending, offering, strobes) -> None:
        """Which half of the parameter bank the loader fills next, and with which layer."""
        L, S, lb = self.L, self.S, layer_bits(self.cfg)
        (BA, BB), (strobe, strobe_half, strobe_layer) = banks, strobes
        # ---- FETCH, one half at a time: the channel half for the token in stage A (so the
        # hand-over to stage B need not wait), else the token half for a ready slot, else
        # (nothing ready, and stage A empty or its token done with it) the token half of the
        # layer stage B's token goes to next, fetched while stage B works
        m.d.comb += dp.b_go.eq((BB == dp.a_layer) & ~fb_busy)
        any_ready, ba_wanted = Signal(), Signal()
        m.d.comb += [any_ready.eq(Cat(*ready).any()),
                     ba_wanted.eq(Cat(ready[s] & (lay[s] == BA) for s in range(S)).any())]
        first_ready = Signal(lb)
        for s in reversed(range(S)):
            with m.If(ready[s]):
                m.d.comb += first_ready.eq(lay[s])
        b_next = Signal(lb)
        m.d.comb += b_next.eq(Mux(dp.b_layer == L - 1, 0, dp.b_layer + 1))
        can_fetch = ~loader.busy & ~load_pending & loader.loaded
        a_free = dp.a_free & ~offering
        with m.If(can_fetch):
            with m.If(dp.b_idle & dp.a_busy & (dp.a_layer != BB)):
                m.d.comb += [strobe.eq(1), strobe_half.eq(1), strobe_layer.eq(dp.a_layer)]
            with m.Elif(a_free & any_ready & ~ba_wanted):
                m.d.comb += [strobe.eq(1), strobe_half.eq(0), strobe_layer.eq(first_ready),
                             dp.params_change.eq(1)]
            with m.Elif(a_free & ~any_ready & ~dp.b_idle & (b_next != BA)):
                m.d.comb += [strobe.eq(1), strobe_half.eq(0), strobe_layer.eq(b_next),
                             dp.params_change.eq(1)]

    def _head_and_out(self, m, head, st, X, tags, cycles, token_cycles, accept, in_slot) -> tuple:
        """The head, one token at a time (the lowest slot waiting for it first), the next id
        and its logits out on ``o``, the slot freed, and each slot's cycle count.  Returns
        the head's (offered, busy)."""
        S = self.S
        head_offer, head_busy = Signal(), Signal()
        head_slot = Signal(range(S))
        with m.If(~head_offer & ~head_busy):
            for s in reversed(range(S)):
                with m.If(st[s] == Slot.HEADQ):
                    m.d.sync += [head_offer.eq(1), head_slot.eq(s)]
        m.d.comb += [head.x.valid.eq(head_offer), head.x.payload.eq(Array(X)[head_slot])]
        with m.If(head.x.valid & head.x.ready):
            m.d.sync += [head_offer.eq(0), head_busy.eq(1)]
        out = self.o.valid & self.o.ready
        m.d.comb += [self.o.valid.eq(head_busy & head.next.valid), head.next.ready.eq(head_busy & self.o.ready),
                     self.o.payload.token.eq(head.next.payload.token),
                     self.o.payload.logit.eq(head.next.payload.logit),
                     self.o.payload.seq.eq(Array(tags)[head_slot])]
        if S > 1:
            m.d.comb += self.o.payload.slot.eq(head_slot)
        with m.If(out):
            m.d.sync += [head_busy.eq(0), token_cycles.eq(Array(c.next for c in cycles)[head_slot])]
        for s in range(S):
            with m.If(out & (head_slot == s)):
                m.d.sync += st[s].eq(Slot.EMPTY)
            # a token counts every cycle it is inside, the one it is given out in included
            m.d.comb += cycles[s].inc.eq(st[s] != Slot.EMPTY)
            cycles[s].load(accept & (in_slot == s), 1)
            cycles[s].elaborate(m)
        return head_offer, head_busy
