"""The layer datapath: one decoder layer on one KDA unit and one MoE unit, any layer of a stack.

    xn = RMSNorm(x);  h = x (+) Mix(xn);  hn = RMSNorm(h);  y = h (+) Mixer(hn)

(``model.int_layer.int_layer_step`` bit for bit; Mix is the layer's token mixer, the
KDA, or on a hybrid's ``"mla"`` layer the Gated MLA unit (hw/mla/unit.py), built only when
the model has such layers; Mixer is the MoE, or the dense SwiGLU on the MoE unit's
shared-expert path for a dense layer).  Both chips are built on it: the
layer chip (hw/chip/layer.py) feeds it the input stream, the model chip (hw/chip/model.py)
feeds it each layer of a token in turn, with that layer's parameter block in ``bank``.

Block diagram::

      stage A (token mixer)                               stage B (channel mixer)
  i -> XA -> norm -> NA -> KdaUnit -> res1 -> XA(h) -> HQ => HB -> norm -> NB -> MoEUnit -> res2 -> HB(y) -> o
                               |                                             |
                          kda_wport                                      moe_wport
                     (or MlaUnit: mla_wport, cport)

The two stages are a two-token pipeline: while stage B runs the MoE of token t, stage A
already runs the RMSNorm and KDA of token t+1 (a token's KDA never needs an earlier
token's MoE).  A finished ``h`` leaves stage A for the hand-over register HQ at once, so
stage A takes its next token (and the KDA starts that token's weight reads) while stage B
still finishes the MoE, its residual add and its output; ``h`` moves from HQ to B in one
cycle (``=>``) when B is idle.  (Without HQ the port sat idle between the MoE's last
weight read and the next token's first KDA read: about 100 cycles a hand-over on
model-small.)  Within a
stage the phases run one after the other: RMSNorm (hw/kda/norm.py), the block, the
element-serial residual add (hw/arith/residual.py), which writes its sum over its own
input (``h`` over ``x``, ``y`` over ``h``).  Stage A's RMSNorm of the next token need not
wait for the hand-over: it runs on the token waiting on ``i`` as soon as the KDA has taken
the current ``xn``, so the KDA starts the next token, and its weight reads, right at
acceptance.

Ports
-----
``i``      stream, one beat per (token, layer): ``x`` (d_model x resid_bits signed), ``first``
           (the layer's state starts from zero before this token), ``layer`` (the index
           the units use for addresses and state, hw/image/memory_map.py layer_bits),
           ``slot`` (the sequence slot: with ``layer`` it picks the KDA's state) and
           ``tag`` (carried to ``o`` unchanged: the top's sequence position).
``o``      stream: ``y``, ``layer``, ``slot``, ``tag``.
``bank``   the parameter block of the layer inside (hw/image/param_map.py; on a model, one
           layer's block of ``layer_block_bytes``, its first byte at bit 0).  Stage A reads
           only its token-mixer half (bits below ``mixer_split_bit``), stage B only the rest;
           a half must hold still while its stage has a token (``a_free``, ``b_idle``);
           ``params_change`` says the token half is about to change, which voids an early
           RMSNorm of a waiting token.
``kda_wport``, ``moe_wport``  the units' weight ports (the top arbitrates them); with MLA
           layers also ``mla_wport`` and the MLA unit's cache port ``cport``
           (hw/mla/cache.py), which the top passes out.  A model of MLA layers only has
           no KDA unit and no ``kda_wport``.
``ha``, ``hq``  with Attention Residuals (model.attn_res != "none") only: stage A's sum (the
           residual add with m_a = 0: the sub-layer's output at the depth scale) leaves on
           ``ha`` (v, slot) instead of going to HQ, and stage B's input, the depth unit's mix,
           comes back on ``hq`` into HQ (reserved meanwhile: ``q_wait``).  Stage B's output
           ``o`` is likewise the sub-layer's output, not a residual sum (hw/attnres/chip.py).
``idle``   no token inside and no early RMSNorm running: the bank may change.
``b_go``   stage B may take the token stage A holds (default high; the model chip lowers it
           until the bank's channel-mixer half holds that token's layer).
``a_free`` stage A reads no parameters now (no token, or its token waits for stage B, and
           no early RMSNorm running): the bank's token-mixer half may change (with
           ``params_change``); ``a_busy``/``a_layer`` a token is in stage A or in HQ, and
           the layer of the one that goes to stage B next (HQ's, else stage A's);
           ``b_idle`` stage B has none: the channel-mixer half may change (``b_layer``: the
           layer of stage B's token otherwise).
``busy``   a token is inside; ``token_cycles`` the cycles the last token took from ``i``
           to ``o`` offered; ``mac_beat`` the engines' beats (the MACS counter): the KDA's,
           the MLA's, the MoE's, those the config has.

The token mixer is chosen per layer: the layer's kind (``model.layers``, a constant per
layer) is registered with the token at stage A's acceptance and steers stage A's stream to
the KDA or the MLA unit (their inputs and outputs are both d x act_bits).  An MLA token's
position in its sequence (``pos``, the unit's cache row) is its ``tag``, the sequence
position the top counts.
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.counter import ChunkedCounter
from hw.attnres.chip import vec_layout
from hw.arith.residual import ResidualAdd
from hw.stream.weight_port import WeightPortSignature
from hw.image.memory_map import layer_bits, layer_count, layer_mixer, mixer_layers, slot_bits
from hw.image.param_map import layer_bank_bits, param_layout, param_map, tap_words
from hw.arith.rsqrt import SharedRsqrt
from hw.kda.norm import Normalizer
from hw.kda.short_conv import tap_write_signature
from hw.kda.unit import KdaUnit
from hw.mla.cache import CachePortSignature
from hw.mla.unit import MlaUnit
from hw.moe.unit import MoEUnit
from moekda.formats import derived_widths, formats_for

SEQ_BITS = 16     # the sequence-position tag's width (it wraps after 2**16 tokens of one sequence)


def datapath_in_layout(cfg) -> data.StructLayout:
    fm = formats_for(cfg)
    return data.StructLayout({"x": data.ArrayLayout(signed(fm.resid_bits), cfg.model.d_model), "first": 1,
                              "layer": layer_bits(cfg), "slot": slot_bits(cfg), "tag": SEQ_BITS})


def datapath_out_layout(cfg) -> data.StructLayout:
    fm = formats_for(cfg)
    return data.StructLayout({"y": data.ArrayLayout(signed(fm.resid_bits), cfg.model.d_model),
                              "layer": layer_bits(cfg), "slot": slot_bits(cfg), "tag": SEQ_BITS})


def has_dense(cfg) -> bool:
    return any(layer_mixer(cfg, l) == "dense" for l in range(layer_count(cfg)))


class LayerDatapath(wiring.Component):
    def __init__(self, cfg):
        self.cfg = cfg
        self.fm = formats_for(cfg)
        self.d = cfg.model.d_model
        pb = cfg.hw.weight_port_bytes
        self.kda_layers, self.mla_layers = mixer_layers(cfg, "kda"), mixer_layers(cfg, "mla")
        units = {"kda_wport": Out(WeightPortSignature(pb))} if self.kda_layers else {}
        if self.mla_layers:
            units.update(mla_wport=Out(WeightPortSignature(pb)), cport=Out(CachePortSignature(pb)))
        self.engines = bool(self.kda_layers) + bool(self.mla_layers) + 1
        # Attention Residuals: stage A's sum leaves on ``ha`` (the depth unit keeps it) and
        # stage B's input comes back on ``hq`` (the unit's mix), not from stage A's sum
        self.attn_res = cfg.model.attn_res != "none"
        if self.attn_res:
            vec = vec_layout(cfg)
            units.update(ha=Out(stream.Signature(vec)), hq=In(stream.Signature(vec["v"].shape)))
        self.tap_words = tap_words(cfg)       # the KDA's taps in SRAM, written by LOAD (0: in the bank)
        super().__init__({
            "i": In(stream.Signature(datapath_in_layout(cfg))),
            "o": Out(stream.Signature(datapath_out_layout(cfg))),
            "bank": In(layer_bank_bits(cfg)),
            # LOAD's writes of the KDA's short-convolution taps, when they live in SRAM
            **({"tap_w": In(tap_write_signature(self.tap_words, pb))} if self.tap_words else {}),
            "params_change": In(1),
            "b_go": In(1, init=1),
            "a_free": Out(1),
            "a_busy": Out(1),
            "a_layer": Out(layer_bits(cfg)),
            "b_idle": Out(1),
            "b_layer": Out(layer_bits(cfg)),
            **units,
            "moe_wport": Out(WeightPortSignature(pb)),
            "idle": Out(1),
            "busy": Out(1),
            "token_cycles": Out(32),
            "mac_beat": Out(self.engines),
        })

    def _views(self, m):
        """(moe-kind view, dense-kind view or None, MLA-kind view or None) of the bank.  The
        fields before the channel mixer's (attn_norm, the token mixer's, res1, mlp_norm) are
        at the same offsets in both channel-mixer kinds (param_fields lists them first), so
        the token mixer and the norms read the moe view; only res2 moves.  attn_norm, res1
        and the channel mixer's fields are also at the same bits in a KDA and an MLA layer
        (the shorter token mixer is padded), so only the token mixer's own fields come
        from the MLA view."""
        cfg = self.cfg
        kind = "kda" if self.kda_layers else "mla"

        def view(mixer, kind):
            return data.View(param_layout(cfg, mixer=mixer, kind=kind), self.bank[:param_map(cfg, mixer, kind).bits])
        moe_v = view("moe", kind)
        a = param_map(cfg, "moe", kind).offsets()
        mla_v = None
        if self.mla_layers:
            mx = layer_mixer(cfg, self.mla_layers[0])
            b = param_map(cfg, mx, "mla").offsets()
            for name in ("attn_norm.eps_int", "res1.m_a", "mlp_norm.eps_int"):
                assert a[name] == b[name], f"{name}: the token mixer kinds' parameter blocks differ outside the mixer"
            mla_v = view(mx, "mla")
        if not has_dense(cfg):
            return moe_v, None, mla_v
        b = param_map(cfg, "dense", kind).offsets()
        for name in ("attn_norm.eps_int", f"{kind}.q_proj.m", "res1.m_a", "mlp_norm.eps_int"):
            assert a[name] == b[name], f"{name}: the mixer kinds' parameter blocks differ before the mixer"
        return moe_v, view("dense", kind), mla_v

    def elaborate(self, platform):
        # the stages' registers, the hand-over and the two stage FSMs here; the token mixers,
        # the shared RMSNorm's owner, its early run and the status outputs are methods of their
        # own, building into this Module (they share the stages' registers and FSMs)
        m = Module()
        cfg, fm, d = self.cfg, self.fm, self.d
        rb, a = fm.resid_bits, fm.act_bits
        L = layer_count(cfg)
        P, D, M = self._views(m)

        # the token mixers: mix_in / mix_out stand for the unit of stage A's token
        mix_in, mix_out, is_mla, units, kda, mla = self._token_mixers(m, P, M)
        m.submodules.moe = moe = MoEUnit(cfg)
        m.d.comb += moe.params.eq(P.moe)
        if D is not None:
            m.d.comb += moe.dense_params.eq(D.dense)
        wiring.connect(m, moe.wport, wiring.flipped(self.moe_wport))
        norm = self._layer_norm(m, P, kda)
        m.submodules.res1 = res1 = ResidualAdd.for_config(cfg, a, d)
        m.submodules.res2 = res2 = ResidualAdd.for_config(cfg, moe.out_bits, d)
        m.d.comb += res1.params.eq(P.res1)

        # stage A (token mixer): x -> xn -> KDA -> h, all in place in XA / NA
        XA = [Signal(signed(rb), name=f"xa{n}") for n in range(d)]   # x, then h
        NA = [Signal(signed(a), name=f"na{n}") for n in range(d)]     # xn
        # stage B (channel mixer): h -> hn -> MoE -> y, in place in HB / NB
        HB = [Signal(signed(rb), name=f"hb{n}") for n in range(d)]   # h, then y
        NB = [Signal(signed(a), name=f"nb{n}") for n in range(d)]     # hn
        first = Signal()
        # what travels with the token: its layer (the units' addresses and state, stage B's
        # res2 parameters) and the top's tag, moved to stage B with h
        layer_a, layer_b = Signal(layer_bits(cfg)), Signal(layer_bits(cfg))
        tag_a, tag_b = Signal(SEQ_BITS), Signal(SEQ_BITS)
        slot_a, slot_b = Signal(slot_bits(cfg)), Signal(slot_bits(cfg))
        m.d.comb += moe.layer.eq(layer_b)
        if self.kda_layers:
            m.d.comb += [kda.layer.eq(layer_a), kda.slot.eq(slot_a), kda.i.payload.first.eq(first)]
        if self.mla_layers:
            # the sequence position is the cache row (an MLA token starts its sequence at 0)
            m.d.comb += [mla.layer.eq(layer_a), mla.slot.eq(slot_a), mla.pos.eq(tag_a[:len(mla.pos)])]
        if D is not None:
            # res2 is the one field whose place depends on the mixer kind; the kind is a
            # constant per layer, registered with stage B's layer at the hand-over
            dense_b = Signal()
            m.d.comb += res2.params.eq(Mux(dense_b, D.res2.as_value(), P.res2.as_value()))
        else:
            m.d.comb += res2.params.eq(P.res2)
        # cycles since the stage's token was accepted (chunked: no 32-bit carry chain)
        lat_a, lat_b = ChunkedCounter(32, name="lat_a"), ChunkedCounter(32, name="lat_b")
        handoff = Signal()                      # h moves from HQ to stage B this cycle
        enq = Signal()                          # h moves from stage A to HQ this cycle
        stage_b_idle = Signal()
        # HQ: the hand-over register between the stages, with what travels with h
        HQ = Signal(rb * d, name="hq")
        q_full = Signal()
        q_wait = Signal()                       # AttnRes: HQ reserved, the depth unit's mix to come
        layer_q, tag_q, slot_q = Signal(layer_bits(cfg)), Signal(SEQ_BITS), Signal(slot_bits(cfg))
        lat_q = ChunkedCounter(32, name="lat_q")

        # the shared RMSNorm's owner, and stage A's RMSNorm early: once the KDA has taken NA
        # (stage A past SEND), the norm normalises the token waiting on ``i`` straight from
        # the stream's payload (held stable while valid, the stream rule), so the next token
        # goes to the KDA right at acceptance and its weight reads fill the port (docs/chip.md)
        pre_want, pre_start, pre_run, pre_done, req_a, req_b, grant_a, grant_b = \
            self._norm_owner(m, norm, XA, NA, HB, NB)
        # residual adds: they select element idx themselves (registered one-hot select) and write it
        # back a fixed number of cycles later, so the sum replaces its own input (x by h,
        # h by y); the block's output stays on its stream (ready low) until the last write
        m.d.comb += [res1.a.eq(Cat(*XA)), res1.b.eq(mix_out.payload),
                     res2.a.eq(Cat(*HB)), res2.b.eq(moe.out.payload)]
        with m.If(res1.wr_en):
            m.d.sync += Array(XA)[res1.wr_idx].eq(res1.wr_y)
        with m.If(res2.wr_en):
            m.d.sync += Array(HB)[res2.wr_idx].eq(res2.wr_y)
        with m.If(enq):
            m.d.sync += [tag_q.eq(tag_a), layer_q.eq(layer_a), slot_q.eq(slot_a)]
            if self.attn_res:
                m.d.sync += q_wait.eq(1)
            else:
                m.d.sync += [HQ.eq(Cat(*XA)), q_full.eq(1)]
        with m.Elif(handoff):
            m.d.sync += q_full.eq(0)
        if self.attn_res:
            m.d.comb += [self.ha.payload.v.eq(Cat(*XA)), self.ha.payload.slot.eq(slot_a),
                         self.hq.ready.eq(q_wait)]
            with m.If(self.hq.valid & q_wait):
                m.d.sync += [HQ.eq(self.hq.payload), q_full.eq(1), q_wait.eq(0)]
        with m.If(handoff):
            m.d.sync += [Cat(*HB).eq(HQ), tag_b.eq(tag_q), layer_b.eq(layer_q), slot_b.eq(slot_q)]
            if D is not None:
                m.d.sync += dense_b.eq(Array(Const(int(layer_mixer(cfg, l) == "dense"), 1)
                                             for l in range(L))[layer_q])

        m.d.comb += [mix_in.payload.eq(Cat(*NA)),
                     moe.tokens.payload.eq(Cat(*NB)), self.o.payload.y.eq(Cat(*HB)),
                     self.o.payload.tag.eq(tag_b), self.o.payload.layer.eq(layer_b),
                     self.o.payload.slot.eq(slot_b)]

        accept = self.i.valid & self.i.ready
        with m.FSM(name="stage_a") as stage_a:
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(~pre_run)          # not while its RMSNorm runs early
                with m.If(accept):
                    m.d.sync += [Cat(*XA).eq(self.i.payload.x), first.eq(self.i.payload.first),
                                 tag_a.eq(self.i.payload.tag), layer_a.eq(self.i.payload.layer),
                                 slot_a.eq(self.i.payload.slot)]
                    if self.kda_layers and self.mla_layers:
                        m.d.sync += is_mla.eq(Array(Const(int(l in self.mla_layers), 1)
                                                    for l in range(L))[self.i.payload.layer])
                    # an early RMSNorm is of this very token: the payload was held still
                    with m.If(pre_done):
                        m.next = "SEND"
                    with m.Else():
                        m.next = "NORM_START"
            norm_unit_residual(m, d, norm, req_a, grant_a, mix_in, mix_out, res1, then="HOLD", name="stage_a")
            with m.State("HOLD"):                         # h waits for HQ (full only while
                if self.attn_res:                         # stage B is busy)
                    m.d.comb += [self.ha.valid.eq(~q_full & ~q_wait), enq.eq(self.ha.valid & self.ha.ready)]
                else:
                    m.d.comb += enq.eq(~q_full)
                with m.If(enq):
                    m.next = "IDLE"
        m.d.comb += handoff.eq(q_full & stage_b_idle & self.b_go)

        with m.FSM(name="stage_b") as stage_b:
            with m.State("IDLE"):
                with m.If(handoff):
                    m.next = "NORM_START"
            done_b = norm_unit_residual(m, d, norm, req_b, grant_b, moe.tokens, moe.out, res2, then="OUTPUT",
                                        name="stage_b")
            with m.State("OUTPUT"):
                m.d.comb += self.o.valid.eq(1)
                with m.If(self.o.ready):
                    m.next = "IDLE"

        self._early_norm(m, norm, stage_a, accept, pre_want, pre_start, pre_run, pre_done)

        self._status(m, stage_a, stage_b, units, moe, accept, enq, handoff, done_b, pre_run,
                     (q_full, q_wait), (layer_a, layer_q, layer_b), stage_b_idle, (lat_a, lat_q, lat_b))
        return m

    def _layer_norm(self, m, P, kda) -> Normalizer:
        """The layer's RMSNorm, one for both stages, and its rsqrt, shared with the KDA's."""
        cfg, fm, d = self.cfg, self.fm, self.d
        rb, a = fm.resid_bits, fm.act_bits
        ss_bits = derived_widths(cfg)["ss_rmsnorm"]
        period = cfg.hw.clock_period_ns
        # one RMSNorm for both stages, shared in time (issue 45): mode 0 is stage A's
        # attn_norm, mode 1 stage B's mlp_norm.  A run is 2 d + rsqrt + ~10 cycles, a few
        # per cent of a token; when both stages want it, one waits (the arbitration below;
        # no cycle per token lost on tiny, docs/chip.md)
        m.submodules.norm = norm = Normalizer(fm, d, rb, ss_bits, [a, a], param_layout(cfg, "attn_norm"),
                                              clock_period_ns=period, shared_rsqrt=True)
        # its rsqrt is shared with the KDA's q, k, o normaliser (issue 45 item 4): each needs
        # it a few times a token; the layer's RMSNorm first (it holds up a stage's weight
        # reads), docs/chip.md "Units shared in time" gives the cycles
        users = [norm.rsqrt] + ([kda.rsqrt] if kda is not None else [])
        m.submodules.rsqrt = shared = SharedRsqrt(fm, [len(u.i.payload) for u in users], period)
        for n, u in enumerate(users):
            wiring.connect(m, u, getattr(shared, f"c{n}"))
        m.d.comb += [norm.norms[0].eq(P.attn_norm), norm.norms[1].eq(P.mlp_norm)]
        return norm

    def _token_mixers(self, m, P, M):
        """Stage A's token mixers, the KDA and the MLA unit of the config's layers, behind one
        pair of streams: mix_in / mix_out stand for the unit of stage A's token (``is_mla``
        picks it).  Returns the streams, the pick, the (unit, selected) pairs and each unit
        (None where the config has no layer of its kind)."""
        cfg, a, d = self.cfg, self.fm.act_bits, self.d
        kda = mla = None
        mix_in = stream.Signature(data.ArrayLayout(signed(a), d)).create(path=("mix_in",))
        mix_out = stream.Signature(data.ArrayLayout(signed(a), d)).create(path=("mix_out",))
        is_mla = Signal()                       # stage A's token is of an MLA layer
        units = []                              # (unit, selected)
        if self.kda_layers:
            m.submodules.kda = kda = KdaUnit(cfg, shared_rsqrt=True)
            m.d.comb += kda.params.eq(P.kda)
            if self.tap_words:
                wiring.connect(m, wiring.flipped(self.tap_w), kda.tap_w)
            wiring.connect(m, kda.wport, wiring.flipped(self.kda_wport))
            units.append((kda, ~is_mla if self.mla_layers else Const(1)))
        if self.mla_layers:
            m.submodules.mla = mla = MlaUnit(cfg)
            m.d.comb += mla.params.eq(M.mla)
            wiring.connect(m, mla.wport, wiring.flipped(self.mla_wport))
            wiring.connect(m, mla.cport, wiring.flipped(self.cport))
            units.append((mla, is_mla if self.kda_layers else Const(1)))
        for unit, sel in units:
            m.d.comb += [unit.i.valid.eq(mix_in.valid & sel), unit.i.payload.x.eq(mix_in.payload),
                         unit.o.ready.eq(mix_out.ready & sel)]
            with m.If(sel):
                m.d.comb += [mix_in.ready.eq(unit.i.ready), mix_out.valid.eq(unit.o.valid),
                             mix_out.payload.eq(unit.o.payload)]
        return mix_in, mix_out, is_mla, units, kda, mla

    def _norm_owner(self, m, norm, XA, NA, HB, NB):
        """The shared RMSNorm's owner and its early run's handshake: who starts it (stage B
        first), which registers it reads (HB, ``i``'s payload or XA) and writes (NB or NA).
        Returns the early run's (want, start, run, done) and the stages' (request, grant)."""
        d = self.d
        pre_want, pre_start, pre_run, pre_done = Signal(), Signal(), Signal(), Signal()
        # the shared norm's owner: a stage asks in its NORM_START (the early run asks by
        # pre_want) and starts it when it is idle.  Stage B goes first: its RMSNorm holds
        # up the MoE's weight reads now, an early run only the next token's, and that one
        # still ends long before the KDA is done with the current token
        req_a, req_b, grant_a, grant_b = Signal(), Signal(), Signal(), Signal()
        owner_b = Signal()                      # the run under way is stage B's
        free = ~norm.busy
        m.d.comb += [grant_b.eq(free & req_b), grant_a.eq(free & req_a & ~req_b),
                     pre_start.eq(free & pre_want & ~req_b),
                     norm.start.eq(grant_a | grant_b | pre_start), norm.mode.eq(req_b)]
        with m.If(norm.start):
            m.d.sync += owner_b.eq(grant_b)
        # (the source is chosen per element by the owner and pre_run registers, ahead of
        # the index mux: no extra level after it; the norm reads nothing in its start cycle)
        m.d.comb += norm.rd_x.eq(Array(Mux(owner_b, HB[n], Mux(pre_run, self.i.payload.x[n], XA[n]))
                                       for n in range(d))[norm.rd_idx])
        with m.If(norm.wr_en):
            with m.If(owner_b):
                m.d.sync += Array(NB)[norm.wr_idx].eq(norm.wr_y)
            with m.Else():
                m.d.sync += Array(NA)[norm.wr_idx].eq(norm.wr_y)
        return pre_want, pre_start, pre_run, pre_done, req_a, req_b, grant_a, grant_b

    def _early_norm(self, m, norm, stage_a, accept, pre_want, pre_start, pre_run, pre_done) -> None:
        """Stage A's RMSNorm early (docs/chip.md): wanted once the KDA holds NA, for the token
        waiting on ``i``; its result kept until that token is accepted, voided when it is
        withdrawn or the parameters change."""
        kda_has_na = Signal()
        m.d.comb += kda_has_na.eq(stage_a.ongoing("WAIT") | stage_a.ongoing("RES") |
                                  stage_a.ongoing("RES_DRAIN") | stage_a.ongoing("HOLD"))
        m.d.comb += pre_want.eq(kda_has_na & self.i.valid & ~pre_run & ~pre_done)
        with m.If(pre_start):
            m.d.sync += pre_run.eq(1)
        # a token withdrawn from ``i`` (never on a well-behaved stream; a producer reset, or
        # the top gating valid) voids the early result, even if valid is back with another
        # token before the early run ends
        pre_ok = Signal()
        with m.If(pre_start):
            m.d.sync += pre_ok.eq(1)
        with m.If(pre_run & ~norm.busy):
            m.d.sync += [pre_run.eq(0), pre_done.eq(pre_ok & self.i.valid)]
        with m.If(accept | ~self.i.valid | self.params_change):   # used, withdrawn, or parameters change
            m.d.sync += [pre_done.eq(0), pre_ok.eq(0)]

    def _status(self, m, stage_a, stage_b, units, moe, accept, enq, handoff, done_b, pre_run, q, layers,
                stage_b_idle, lats) -> None:
        """What the top reads: busy and idle, where each stage is and its layer, the MAC
        beats, and the latency counters behind ``token_cycles``."""
        (q_full, q_wait), (layer_a, layer_q, layer_b), (lat_a, lat_q, lat_b) = q, layers, lats
        busy_a, busy_b = ~stage_a.ongoing("IDLE"), ~stage_b.ongoing("IDLE")
        q_used = q_full | q_wait
        m.d.comb += [self.busy.eq(busy_a | q_used | busy_b), self.idle.eq(~busy_a & ~q_used & ~busy_b & ~pre_run),
                     stage_b_idle.eq(stage_b.ongoing("IDLE")),
                     self.a_free.eq((stage_a.ongoing("IDLE") | stage_a.ongoing("HOLD")) & ~pre_run),
                     self.a_busy.eq(busy_a | q_used), self.a_layer.eq(Mux(q_used, layer_q, layer_a)),
                     self.b_idle.eq(stage_b_idle),
                     self.b_layer.eq(layer_b),
                     self.mac_beat.eq(Cat(*(u.mac_beat for u, _ in units), moe.mac_beat))]
        # a stage counts every cycle it is not idle, the cycle of its last step included,
        # so "lat + 1" at the handoff and at the end is the counter's own next value
        m.d.comb += [lat_a.inc.eq(busy_a), lat_q.inc.eq(q_used), lat_b.inc.eq(busy_b)]
        lat_a.load(accept, 1)
        lat_q.load(enq, lat_a.next)
        lat_b.load(handoff, lat_q.next)
        for c in (lat_a, lat_q, lat_b):
            c.elaborate(m)
        with m.If(done_b):
            m.d.sync += self.token_cycles.eq(lat_b.next)

def norm_unit_residual(m, d: int, norm, req, grant, unit_in, unit_out, res, then: str, name: str) -> Signal:
    """The states one stage runs per token, inside the caller's FSM, from NORM_START to
    ``then``: RMSNorm of the stage's vector on the shared ``norm`` (``req`` asks for it,
    ``grant`` starts it for this stage), the block (``unit_in`` takes the normalised
    vector, ``unit_out`` gives the branch output), then the residual add over all d
    elements.  Returns ``done``: high in the cycle the last sum is written back, which
    is also when the block's output is released."""
    idx = Signal(range(d), name=f"{name}_idx")
    done = Signal()
    m.d.comb += res.idx.eq(idx)
    with m.State("NORM_START"):
        m.d.comb += req.eq(1)
        with m.If(grant):
            m.next = "NORM_WAIT"
    with m.State("NORM_WAIT"):
        # busy from the cycle after the grant: no other run can start before this one ends
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
