"""The model chip: token id in, next token id out; the L layers of the model on ONE layer datapath.

Implements ``sim.models.int_model.int_model_step`` bit for bit, token after token::

    x_0 = emb[token];  x_l+1 = layer l (x_l), l = 0 .. L-1;  logits = head(x_L);  next = argmax

Block diagram::

  i (token, first) -> Embedding -> x -+-> LayerDatapath (layer l, bank = layer l's block) -+-> Head -> o (next, logit, seq)
                                      +<-------------- y, while l < L-1 -------------------+      `-> logits (CTRL.LOGITS)
  ImageLoader: LOAD (the image, checked; layer 0's block, the head's block), FETCH (layer l's block)
  Embedding, datapath (KDA, MoE), loader, head -> WeightArbiter -> register slices -> wport
  bus (Wishbone) -> LayerCsr (hw/chip/csr.py; CTRL.LOGITS, N_LAYERS, VOCAB)

Sequencing.  One token at a time, one layer at a time: a token's layer l+1 needs
its layer l's output, and the datapath's two-stage pipeline (hw/chip/datapath.py)
only overlaps independent tokens, so the stages run one after the other here.
Before layer l runs, the loader FETCHes layer l's parameter block into the one
bank (hw/chip/loader.py) unless the bank already holds it: a model's per-layer
values are in the image (the chip is programmable), and one bank of one layer's
size keeps the area of the parameter flops flat in L.  The price is the block's
beats per layer and token on the weight port (model-tiny 947 beats of 4 bytes,
model-small 288 of 16), which the bench counts with the weights.  The units keep
one state per layer (KDA delta-rule state and short-convolution history) and take
the layer's index with the token.

Sequence rules as on the layer chip: a token starts a new sequence when its
``first`` bit is set, after a CLEAR write, a LOAD or a reset; every layer's state
then starts from zero (the token reaches each layer with ``first``).  ``seq`` on
``o`` is the token's position in its sequence.
"""
from __future__ import annotations

from amaranth import Cat, Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from hw.arith.counter import ChunkedCounter
from hw.chip.csr import LayerCsr, WishboneSignature
from hw.chip.datapath import SEQ_BITS, LayerDatapath
from hw.chip.embed import Embedding, token_bits, token_id_layout
from hw.chip.head import Head
from hw.chip.layer import connect_status, sequence_rules, weight_port_slices
from hw.chip.loader import ImageLoader
from hw.chip.weight_arbiter import WeightArbiter
from hw.chip.weight_port import WeightPortSignature
from hw.image.format import image_layout
from hw.image.memory_map import layer_bits, layer_count, layer_prefix, memory_map
from moekda.config import ConfigError
from moekda.formats import formats_for


def model_in_layout(cfg) -> data.StructLayout:
    """One input per token: its id and ``first`` (the embedding's input beat)."""
    return token_id_layout(cfg)


def model_out_layout(cfg) -> data.StructLayout:
    """One output per input token: the next token id (the argmax of the logits, lowest
    index on a tie), its logit (resid_bits), and ``seq`` as on the layer chip."""
    return data.StructLayout({"token": token_bits(cfg), "logit": signed(formats_for(cfg).resid_bits),
                              "seq": SEQ_BITS})


def _used_matrices(cfg) -> list[str]:
    """Memory-map regions a token reads, once each (the routed experts: top_k of them, all of
    one shape, so expert 0 stands for each chosen one), the LM head included."""
    mm = memory_map(cfg)
    m = cfg.model
    out = []
    for l in range(layer_count(cfg)):
        p = layer_prefix(cfg, l)
        out += [p + f"kda.{t}" for t in ("w_q", "w_k", "w_v", "w_f_down", "w_g_down", "w_b",
                                         "w_f_up", "w_g_up", "w_o")]
        if m.mixers[l] == "dense":
            out += [p + f"dense.chunk{c}.{t}" for c in range(m.dense_chunks) for t in ("gate", "up", "down")]
        else:
            out.append(p + "moe.router")
            out += [p + f"moe.shared{s}.{t}" for s in range(m.n_shared) for t in ("gate", "up", "down")]
            out += [p + f"moe.expert0.{t}" for _ in range(m.top_k) for t in ("gate", "up", "down")]
    out.append("lm_head" if "lm_head" in mm else "embedding")
    return out


def model_macs_per_token(cfg) -> int:
    """Weight elements used per token: every layer's KDA matrices, router, shared and chosen
    experts (a dense layer: its chunks), and the LM head (V x d); the embedding row is a
    lookup, not a MAC."""
    mm = memory_map(cfg)
    return sum(mm[n].rows * mm[n].cols for n in _used_matrices(cfg))


def model_engine_macs_per_token(cfg) -> int:
    """What the MACS counter grows by per token: ``hw.lanes`` per beat the three engines
    (KDA's, MoE's, the head's) take, i.e. every used row padded to whole beats."""
    mm = memory_map(cfg)
    return cfg.hw.lanes * sum(mm[n].beats for n in _used_matrices(cfg))


class ModelTop(wiring.Component):
    def __init__(self, cfg):
        if cfg.model.vocab == 0:
            raise ConfigError(f"config {cfg.name}: model.vocab = 0, no tokens: the model chip needs a "
                              "vocabulary (16 to 65536); a one-layer config builds the layer chip")
        self.cfg = cfg
        self.L = layer_count(cfg)
        super().__init__({
            "i": In(stream.Signature(model_in_layout(cfg))),
            "o": Out(stream.Signature(model_out_layout(cfg))),
            "logits": Out(Head.logits_signature(cfg)),
            "wport": Out(WeightPortSignature(cfg.hw.weight_port_bytes)),
            "bus": In(WishboneSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, L = self.cfg, self.L
        fm = formats_for(cfg)
        d = cfg.model.d_model

        m.submodules.loader = loader = ImageLoader(cfg)
        m.submodules.datapath = dp = LayerDatapath(cfg)
        m.submodules.embed = embed = Embedding(cfg)
        m.submodules.head = head = Head(cfg)
        m.d.comb += [dp.bank.eq(loader.bank), head.params.eq(loader.head_params)]
        clients = [dp.kda_wport, dp.moe_wport, loader.wport, embed.wport, head.wport]
        m.submodules.arbiter = arb = WeightArbiter(cfg.hw.weight_port_bytes, len(clients))
        for n, port in enumerate(clients):
            connect(m, port, arb.up[n])
        weight_port_slices(m, cfg, arb.down, self.wport)
        m.submodules.csr = csr = LayerCsr(cfg, model_macs_per_token(cfg), image_layout(cfg).length, engines=3,
                                          stages=True)
        connect(m, wiring.flipped(self.bus), csr.bus)
        connect(m, head.logits, wiring.flipped(self.logits))
        m.d.comb += head.logits_en.eq(csr.logits_en)

        seq_r = Signal(SEQ_BITS)                      # the tag of the token inside
        first = Signal()                              # the token inside starts a sequence
        layer = Signal(layer_bits(cfg))               # the layer it is at
        bank_layer = Signal(layer_bits(cfg))          # the layer whose block the bank holds
        X = Signal(data.ArrayLayout(signed(fm.resid_bits), d))   # x_l of the token inside
        token_cycles = Signal(32)
        # cycles since the token was accepted (chunked: no 32-bit carry chain)
        cycles = ChunkedCounter(32, name="token_cycles_count")

        load_pending, loading, load_start = Signal(), Signal(), Signal()
        m.d.comb += loading.eq(load_pending | (loader.busy & ~loader.fetching))
        with m.If(csr.load):
            m.d.sync += load_pending.eq(1)
        allowed = csr.run & loader.loaded & ~loading

        accept = self.i.valid & self.i.ready
        seq = sequence_rules(m, csr, self.i.payload.first, accept, load_start)
        with m.If(accept):
            m.d.sync += [seq_r.eq(seq.tag), first.eq(seq.starts)]

        m.d.comb += [dp.i.payload.x.eq(X), dp.i.payload.first.eq(first), dp.i.payload.layer.eq(layer),
                     dp.i.payload.tag.eq(seq_r), head.x.payload.eq(X),
                     embed.i.payload.token.eq(self.i.payload.token), embed.i.payload.first.eq(seq.starts),
                     loader.fetch_layer.eq(layer),
                     self.o.payload.token.eq(head.next.payload.token),
                     self.o.payload.logit.eq(head.next.payload.logit), self.o.payload.seq.eq(seq_r)]

        with m.FSM(name="model") as fsm:
            with m.State("IDLE"):
                # LOAD waits until no token is inside; it leaves layer 0's block in the bank
                with m.If(load_pending & dp.idle & ~loader.busy):
                    m.d.comb += [load_start.eq(1), loader.start.eq(1), dp.params_change.eq(1)]
                    m.d.sync += [load_pending.eq(0), bank_layer.eq(0)]
                with m.Else():
                    # the token goes straight to the embedding's request
                    m.d.comb += [embed.i.valid.eq(self.i.valid & allowed),
                                 self.i.ready.eq(embed.i.ready & allowed)]
                    with m.If(accept):
                        m.d.sync += layer.eq(0)
                        m.next = "EMBED"
            with m.State("EMBED"):
                m.d.comb += embed.o.ready.eq(1)
                with m.If(embed.o.valid):
                    m.d.sync += X.eq(embed.o.payload.x)
                    m.next = "PARAMS"
            with m.State("PARAMS"):
                # the bank must hold this layer's block; the datapath is idle here
                with m.If(bank_layer != layer):
                    m.d.comb += [loader.fetch.eq(1), dp.params_change.eq(1)]
                    m.d.sync += bank_layer.eq(layer)
                    m.next = "FETCH"
                with m.Else():
                    m.next = "LAYER"
            with m.State("FETCH"):
                with m.If(~loader.busy):
                    m.next = "LAYER"
            with m.State("LAYER"):
                m.d.comb += dp.i.valid.eq(1)
                with m.If(dp.i.ready):
                    m.next = "LAYER_WAIT"
            with m.State("LAYER_WAIT"):
                m.d.comb += dp.o.ready.eq(1)
                with m.If(dp.o.valid):
                    m.d.sync += X.eq(dp.o.payload.y)
                    with m.If(layer == L - 1):
                        m.next = "HEAD"
                    with m.Else():
                        m.d.sync += layer.eq(layer + 1)
                        m.next = "PARAMS"
            with m.State("HEAD"):
                m.d.comb += head.x.valid.eq(1)
                with m.If(head.x.ready):
                    m.next = "OUTPUT"
            with m.State("OUTPUT"):
                m.d.comb += [self.o.valid.eq(head.next.valid), head.next.ready.eq(self.o.ready)]
                with m.If(head.next.valid & self.o.ready):
                    m.d.sync += token_cycles.eq(cycles.next)
                    m.next = "IDLE"
        busy = ~fsm.ongoing("IDLE")
        # a token counts every cycle it is inside, the one it is given out in included
        m.d.comb += cycles.inc.eq(busy)
        cycles.load(accept, 1)
        cycles.elaborate(m)

        connect_status(m, csr, self, loader, busy=busy, loading=loading, clear_pending=seq.clear_pending,
                       mac_beats=Cat(dp.mac_beat, head.mac_beat), token_cycles=token_cycles)
        m.d.comb += [csr.ev_fetch.eq(fsm.ongoing("FETCH")),
                     csr.ev_layer.eq(fsm.ongoing("LAYER") | fsm.ongoing("LAYER_WAIT")),
                     csr.ev_head.eq(fsm.ongoing("HEAD") | fsm.ongoing("OUTPUT"))]
        return m
