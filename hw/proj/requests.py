"""A token's weight requests as a table: the KDA and MLA units' reads.

A unit reads its matrices in memory order, in a few groups (the KDA's projections at
acceptance and W_o after the delta rule; the MLA's W_dkv .. W_uk, then W_uv and W_o after
the softmax): the memory answers in request order, so a group goes out only when the unit
can take its beats.  Every request is a constant per (layer, index): one address table per
layer, the beats the same for all layers.
"""
from __future__ import annotations

from amaranth.hdl import Array, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


class RequestTable(wiring.Component):
    """``layer_reqs``: per layer, the token's requests as (byte address, beats), every
    layer's beats the same; ``first``: how many of them the first group holds.

    ``start`` (a token is accepted): the requests restart at index 0 and the first group is
    open; ``more``: the rest are open too.  A request is offered (``valid``, ``addr``,
    ``beats``) while the index is below the open end and moves on when ``ready``.  ``layer``:
    the token's layer (a register of the owner), used with more than one table."""

    def __init__(self, layer_reqs: list[list[tuple[int, int]]], first: int, addr_bits: int = 32,
                 beats_bits: int = 16):
        self.layer_reqs, self.n_first = layer_reqs, first
        self.beats_n = [n for _, n in layer_reqs[0]]
        for reqs in layer_reqs:
            if [n for _, n in reqs] != self.beats_n:
                raise ValueError("RequestTable: the layers' requests differ in size")
        self.addr_bits, self.beats_bits = addr_bits, beats_bits
        super().__init__({
            "start": In(1), "more": In(1),
            "layer": In(range(max(2, len(layer_reqs)))),
            "valid": Out(1), "ready": In(1),
            "addr": Out(addr_bits), "beats": Out(beats_bits),
        })

    def elaborate(self, platform):
        m = Module()
        n = len(self.beats_n)
        idx = Signal(range(n + 1), init=n, name="req_idx")       # the next request
        end = Signal(range(n + 1), init=n, name="req_end")       # the open groups' end
        if len(self.layer_reqs) == 1:
            addr = Array(Const(ad, self.addr_bits) for ad, _ in self.layer_reqs[0])[idx]
        else:
            # one address table per layer; the layer is the owner's register, constant for the token
            addr = Array(Array(Const(ad, self.addr_bits) for ad, _ in reqs)
                         for reqs in self.layer_reqs)[self.layer][idx]
        m.d.comb += [self.valid.eq(idx != end), self.addr.eq(addr),
                     self.beats.eq(Array(Const(b, self.beats_bits) for b in self.beats_n)[idx])]
        with m.If(self.valid & self.ready):
            m.d.sync += idx.eq(idx + 1)
        with m.If(self.start):
            m.d.sync += [idx.eq(0), end.eq(self.n_first)]
        with m.If(self.more):
            m.d.sync += end.eq(n)
        return m


def unit_layer(m: Module, n_layers: int, layers: list[int], layer, slot, slots: int, direct: bool = True):
    """(k, ctx), comb: the unit's index k of the model layer on ``layer`` (its k-th of
    ``layers``, the model layers of its kind: the index of its requests' address table)
    and the context of (layer, ``slot``), k + K slot (its state, history or cache).  With
    every one of the ``n_layers`` a layer of the unit and ``direct``, k is ``layer`` itself."""
    K = len(layers)
    if direct and layers == list(range(n_layers)):
        k = layer
    else:
        k = Signal(range(max(2, K)), name="k_now")
        m.d.comb += k.eq(Array(Const(layers.index(l) if l in layers else 0, len(k)) for l in range(n_layers))[layer])
    ctx = Signal(range(max(2, K * slots)), name="ctx_now")
    m.d.comb += ctx.eq(k + K * slot if slots > 1 else k)
    return k, ctx
