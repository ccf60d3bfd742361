"""The MLA layers' latent cache: where each cached latent lives, and the port that reaches it.

A Gated MLA layer keeps one latent c (model.kv_rank int8 values) per token of its sequence
(model/int_mla.py ``IntMLACache``): appended every token, all of it read every token,
once per head.  It is the only state of the model that grows with context, so it lives off
chip, in its own memory behind the cache port (decided against sharing the weight port:
the MLA layer reads H T r cache bytes per token against its fixed weights, and on the
model chip those reads would queue behind, and hold up, the MoE's expert streams).

Layout (one source of truth: the unit and the testbench memory read these functions):

* a latent is one row of ``row_stride(cfg)`` bytes: its kv_rank int8 values in
  little-endian byte lanes from the row's first byte, zero-padded to whole port beats and
  then to a power of two, so the address of (context, position, beat) is a concatenation
  of the three (no adder, no multiplier in the unit);
* a context (one MLA layer of one sequence slot: ``context = slot * n_mla + k`` for the
  k-th MLA layer of ``model.layers``) holds ``cache_tokens(cfg)`` = 2**formats.mla_context_bits
  rows, position 0 first; position T's row is written when the sequence's token T passes
  the layer;
* context c starts at ``c * cache_tokens * row_stride``.

The port (``CachePortSignature``) is a weight port (hw/stream/weight_port.py: ``req``,
``resp``, the same rules) plus ``wr``, a stream of single-beat writes {addr, data}.  The
memory applies a write when it accepts it, and a read request accepted after a write
returns the written bytes (one memory, requests in order).
"""
from __future__ import annotations

from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.stream.weight_port import ADDR_BITS, WeightRequest, padded_row_bytes, response_layout
from hw.image.memory_map import mixer_layers, sequence_slots
from moekda.formats import formats_for


def mla_layers(cfg) -> list[int]:
    """The model layers whose token mixer is Gated MLA, in order (k = index in this list)."""
    return mixer_layers(cfg, "mla")


def cache_contexts(cfg) -> int:
    """Latent caches the chip keeps: one per MLA layer and sequence slot."""
    return len(mla_layers(cfg)) * sequence_slots(cfg)


def cache_context(cfg, slot: int, layer: int) -> int:
    return slot * len(mla_layers(cfg)) + mla_layers(cfg).index(layer)


def cache_tokens(cfg) -> int:
    """Rows per context: the longest sequence an MLA layer attends over (the online
    softmax's sums are sized for it: moekda/formats.py derived_widths mla_sum, mla_acc)."""
    return 1 << formats_for(cfg).mla_context_bits


def row_stride(cfg) -> int:
    """Bytes per cached latent: kv_rank padded to whole beats, then to a power of two."""
    nbytes = padded_row_bytes(cfg.model.kv_rank, cfg.hw.weight_port_bytes)
    return 1 << (nbytes - 1).bit_length()


def row_beats(cfg) -> int:
    """Port beats that carry one latent (the padding to a power of two is never read)."""
    return padded_row_bytes(cfg.model.kv_rank, cfg.hw.weight_port_bytes) // cfg.hw.weight_port_bytes


def cache_address(cfg, context: int, pos: int, beat: int = 0) -> int:
    return (context * cache_tokens(cfg) + pos) * row_stride(cfg) + beat * cfg.hw.weight_port_bytes


def cache_bytes(cfg) -> int:
    """The address space of every context's cache (what a cache memory must decode)."""
    return cache_contexts(cfg) * cache_tokens(cfg) * row_stride(cfg)


def cache_write_layout(port_bytes: int) -> data.StructLayout:
    return data.StructLayout({"addr": unsigned(ADDR_BITS), "data": unsigned(8 * port_bytes)})


class CachePortSignature(wiring.Signature):
    """The block side of a cache port (an ``Out`` member): reads as a weight port, plus
    single-beat writes.  In generated Verilog ``wr`` payload bits [31:0] are ``addr``,
    the rest the beat."""

    def __init__(self, port_bytes: int):
        self.port_bytes = port_bytes
        super().__init__({
            "req": Out(stream.Signature(WeightRequest)),
            "resp": In(stream.Signature(response_layout(port_bytes))),
            "wr": Out(stream.Signature(cache_write_layout(port_bytes))),
        })

    def __eq__(self, other):
        return isinstance(other, CachePortSignature) and other.port_bytes == self.port_bytes

    def __hash__(self):
        return hash(("CachePortSignature", self.port_bytes))

    def __repr__(self):
        return f"CachePortSignature({self.port_bytes})"
