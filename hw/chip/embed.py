"""The embedding lookup of the model chip: token id in, x_0 out (issue 14).

Implements ``model.int_model.int_embed`` bit for bit: x_0 = emb[token], the int8
table entry taken as a resid_bits signed value.  The table is the ``embedding`` region
of the weight memory (hw/image/memory_map.py ``model_tensors``: V rows of d_model int8,
each row padded to whole port beats), read through ``wport``; nothing of the model is
in the RTL, so one netlist serves every model of the config.

Ports
-----
``i``      stream, one beat per token: ``token`` (``token_bits(cfg)`` unsigned) and
           ``first`` (a new sequence starts at this token; carried to ``o`` unchanged).
           The id must be below ``model.vocab`` (the host's contract, as for the integer
           model, which refuses it): an id past the table reads whatever follows it.
``o``      stream, one beat per token: hw/chip/layer.py ``token_in_layout``, i.e. ``x``
           (d_model x resid_bits signed, each the sign-extended int8 entry) and ``first``:
           what the layer stack takes.  Payload and valid come straight from registers.
``wport``  weight port (hw/stream/weight_port.py): one request per token of
           ``beats_per_row(d_model)`` beats at ``embedding.addr + token * row_bytes``.

Schedule
--------
The token is taken into a one-entry slot (``i.ready`` is that slot's empty flag, a
register); the row address is a product by the constant stride (hw/arith/booth_multiply.py:
the Booth digits of a constant fold into shifted copies of the id, so synthesis is left
with a shift-add) with the region's base as one more word of its tree, pipelined by the
clock (hw/arith/pipeline.py).  The request goes out when the output register is free, so
the block never holds the shared port's in-order responses back: from then on
``resp.ready`` is high until the row's last beat.  The beats shift into the output
register (no decode: they arrive in order).  The slot is free again when the request is
accepted, so the next token's address is ready by the time its row may be read.
Cycles per token without stalls: address stages + 1 + memory latency + beats_per_row,
and the output's hand-over (tiny: 1 + 4 + 4 + 2).
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import booth_multiply
from hw.arith.pipeline import Pipe, plan_pipeline
from hw.chip.layer import token_in_layout
from hw.stream.weight_port import MAX_BEATS, WeightPortSignature
from hw.image.memory_map import memory_map
from moekda.config import ConfigError
from moekda.formats import formats_for


def require_vocab(cfg, block: str, owner) -> None:
    """The one-line refusal of a block that needs a vocabulary (``owner``, the block being
    built, is never elaborated then: no warning about it after the error)."""
    if cfg.model.vocab == 0:
        owner._MustUse__silence = True
        raise ConfigError(f"config {cfg.name}: model.vocab = 0, there is no {block} "
                          "(a config with a vocabulary, 16 to 65536, has one)")


def token_bits(cfg) -> int:
    """Width of a token id: enough for 0 .. vocab - 1."""
    return max(1, (cfg.model.vocab - 1).bit_length())


def token_id_layout(cfg) -> data.StructLayout:
    """The embedding's input beat: ``token`` and ``first``."""
    return data.StructLayout({"token": token_bits(cfg), "first": 1})


class Embedding(wiring.Component):
    def __init__(self, cfg):
        require_vocab(cfg, "embedding", self)
        self.cfg = cfg
        self.fm = formats_for(cfg)
        self.region = memory_map(cfg)["embedding"]
        self.pb = cfg.hw.weight_port_bytes
        self.nb = self.region.row_beats
        if self.nb > MAX_BEATS:
            raise ConfigError(f"model.d_model = {cfg.model.d_model}: an embedding row needs {self.nb} beats, "
                              f"more than one weight request carries ({MAX_BEATS})")
        super().__init__({
            "i": In(stream.Signature(token_id_layout(cfg))),
            "o": Out(stream.Signature(token_in_layout(cfg))),
            "wport": Out(WeightPortSignature(self.pb)),
        })

    def elaborate(self, platform):
        m = Module()
        reg, pb, nb, d = self.region, self.pb, self.nb, self.cfg.model.d_model
        plan = plan_pipeline(self.cfg.hw.clock_period_ns)

        # ---- the token slot
        tok = Signal(token_bits(self.cfg), name="tok")
        tok_first = Signal(name="tok_first")
        tok_full = Signal(name="tok_full")
        accept = Signal()
        m.d.comb += [self.i.ready.eq(~tok_full), accept.eq(self.i.valid & ~tok_full)]
        addr_go = Signal(name="addr_go")       # the slot's token enters the address pipeline
        m.d.sync += addr_go.eq(accept)
        with m.If(accept):
            m.d.sync += [tok.eq(self.i.payload.token), tok_first.eq(self.i.payload.first), tok_full.eq(1)]

        # ---- row address = base + token * row_bytes (the base: one more word of the tree)
        width = reg.end.bit_length() + 1      # signed: the whole product fits
        pipe = Pipe(m, plan, "emb_addr")
        live = booth_multiply(pipe, {"valid": addr_go}, tok, Const(reg.row_bytes), width, "addr",
                              extra_words=[Const(reg.addr, width)])
        live = pipe.register(live)
        addr = Signal(32, name="row_addr")
        addr_ok = Signal(name="addr_ok")
        with m.If(live["valid"]):
            m.d.sync += [addr.eq(live["addr"][:width - 1]), addr_ok.eq(1)]

        # ---- request, then the row's beats into the output register
        collecting = Signal(name="collecting")
        out_valid = Signal(name="out_valid")
        out_first = Signal(name="out_first")
        beat = Signal(range(nb), name="beat")
        row = Signal(8 * pb * nb, name="row")     # beat j ends at bits [8 pb j, 8 pb (j + 1))
        req, resp = self.wport.req, self.wport.resp
        # the output register must be free for the whole row before it is asked for, so the
        # beats are always taken as they come (responses are in order on the shared port)
        m.d.comb += [req.valid.eq(addr_ok & ~collecting & ~out_valid),
                     req.payload.addr.eq(addr), req.payload.beats.eq(nb)]
        with m.If(req.valid & req.ready):
            m.d.sync += [addr_ok.eq(0), tok_full.eq(0), collecting.eq(1), beat.eq(0), out_first.eq(tok_first)]
        m.d.comb += resp.ready.eq(collecting)
        with m.If(resp.valid & collecting):
            m.d.sync += [row.eq(Cat(row[8 * pb:], resp.payload.data)), beat.eq(beat + 1)]
            with m.If(beat == nb - 1):
                m.d.sync += [collecting.eq(0), out_valid.eq(1)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += out_valid.eq(0)

        # the int8 entries sign-extended to resid_bits: wiring from the register
        m.d.comb += [self.o.valid.eq(out_valid), self.o.payload.first.eq(out_first)]
        m.d.comb += [self.o.payload.x[n].eq(row[8 * n:8 * n + 8].as_signed()) for n in range(d)]
        return m
