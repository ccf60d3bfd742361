"""Streaming top-k selector: n scored candidates in, the k best out.

The router produces its E expert scores one per engine result, so the
selector takes them as a stream, in index order, and keeps a sorted list of
the best k seen so far (an insertion register file).  Every candidate costs
one cycle whatever E is, and the logic per cycle is one comparator per slot
followed by a 2:1 multiplexer, independent of E: it meets the clock for any
E (64, 384, ...), and the k comparators work in parallel.

Order and tie rule (the one the integer model states): candidates are ranked
by ``key``, largest first; among equal keys the lower index wins.  Indices
are the arrival order 0..n-1, so a newcomer replaces a slot only when its key
is strictly greater: an equal key never overtakes an earlier (lower) index.

Each candidate carries a ``tag`` that is not compared (the MoE router passes
the un-biased sigmoid score there: weights come from s, ranking from s+bias).

Interface:
  ``inp``  stream, payload {key, tag}; exactly n beats per selection.
  ``out``  stream, one beat per selection, payload {entries: k x {index, key, tag}},
           entries[0] the best.  While ``out`` waits, ``inp`` is not ready.
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out


def index_bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


def candidate_layout(key_bits: int, tag_bits: int) -> data.StructLayout:
    return data.StructLayout({"key": signed(key_bits), "tag": unsigned(max(tag_bits, 1))})


def entry_layout(n: int, key_bits: int, tag_bits: int) -> data.StructLayout:
    return data.StructLayout({"index": unsigned(index_bits(n)), "key": signed(key_bits),
                              "tag": unsigned(max(tag_bits, 1))})


def selection_layout(n: int, k: int, key_bits: int, tag_bits: int) -> data.StructLayout:
    return data.StructLayout({"entries": data.ArrayLayout(entry_layout(n, key_bits, tag_bits), k)})


class TopK(wiring.Component):
    def __init__(self, n: int, k: int, key_bits: int, tag_bits: int = 0):
        if not 1 <= k <= n:
            raise ValueError(f"top-k: k = {k} must be between 1 and n = {n}")
        self.n, self.k, self.key_bits, self.tag_bits = n, k, key_bits, tag_bits
        super().__init__({
            "inp": In(stream.Signature(candidate_layout(key_bits, tag_bits))),
            "out": Out(stream.Signature(selection_layout(n, k, key_bits, tag_bits))),
        })

    def elaborate(self, platform):
        m = Module()
        n, k = self.n, self.k
        elay = entry_layout(n, self.key_bits, self.tag_bits)
        slots = [Signal(elay, name=f"slot{i}") for i in range(k)]
        used = Signal(k)          # slot i holds a candidate (empty slots lose to anyone)
        count = Signal(range(n))  # index of the next candidate
        full = Signal()           # n candidates seen, result waiting on ``out``

        new = Signal(elay)
        m.d.comb += [new.index.eq(count), new.key.eq(self.inp.payload.key), new.tag.eq(self.inp.payload.tag)]

        # beats[i]: the newcomer ranks above slot i.  The list is sorted, so
        # ``beats`` is a thermometer code 0..01..1 and its first 1 is where
        # the newcomer goes; slots below it shift down by one.
        beats = Signal(k)
        for i in range(k):
            m.d.comb += beats[i].eq(~used[i] | (new.key > slots[i].key))

        m.d.comb += self.inp.ready.eq(~full)
        with m.If(self.inp.valid & self.inp.ready):
            for i in range(k):
                with m.If(beats[i]):
                    if i == 0:
                        m.d.sync += slots[i].eq(new)
                    else:
                        m.d.sync += slots[i].eq(Mux(beats[i - 1], slots[i - 1], new))
            m.d.sync += used.eq((used << 1) | 1)  # one more slot is in use (bits past k drop off)
            with m.If(count == n - 1):
                m.d.sync += [count.eq(0), full.eq(1)]
            with m.Else():
                m.d.sync += count.eq(count + 1)

        m.d.comb += self.out.valid.eq(full)
        for i in range(k):
            m.d.comb += self.out.payload.entries[i].eq(slots[i])
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += [full.eq(0), used.eq(0)]
        return m

