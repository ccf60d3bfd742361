"""Causal depthwise short convolution over tokens, one channel per cycle.

For channel c of token t (kernel K, taps ``w[c, 0..K-1]``, tap j weighting
the input of token t-(K-1)+j, as sim/models/params.py stores ``conv_*``):

    acc[c] = sum_j w[c, j] * x_{t-(K-1)+j}[c]

Inputs before the start of the sequence count as zero.  The unit keeps, per
channel, the last K-1 inputs (a memory of ``channels`` words of (K-1) int8);
after a ``restart`` the stale history is *masked* by a count of the tokens
seen since, instead of being overwritten, so a new sequence costs no cycles.

The taps are elaboration-time constants (a ROM): they are few (channels x K
bytes) and needed one channel per cycle, which a port-width weight stream
would deliver in the wrong shape.

Streams: ``i`` carries the channels of a token in order 0..channels-1, then
the next token; ``o`` carries ``acc`` in the same order.  ``restart`` is a
strobe allowed only between tokens (before channel 0 is sent).  Throughput
one channel per cycle, latency two cycles; back-pressure on ``o`` stalls
``i``.
"""
from __future__ import annotations

import numpy as np
from amaranth import Cat, Module, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out


def conv_acc_bits(in_bits: int, weight_bits: int, kernel: int) -> int:
    """Exact width of a K-tap sum of ``in_bits`` x ``weight_bits`` products."""
    return in_bits + weight_bits - 1 + max(1, (kernel - 1).bit_length()) + 1


class ShortConv(wiring.Component):
    def __init__(self, weights, in_bits: int = 8, weight_bits: int = 8):
        w = np.asarray(weights, dtype=np.int64)
        if w.ndim != 2 or w.shape[0] < 2 or w.shape[1] < 1:
            raise ValueError(f"conv weights must be (channels >= 2, kernel >= 1), got {w.shape}")
        lim = 1 << (weight_bits - 1)
        if w.min() < -lim or w.max() >= lim:
            raise ValueError(f"conv weights must fit {weight_bits} signed bits")
        self.weights = w
        self.channels, self.kernel = w.shape
        self.in_bits, self.weight_bits = in_bits, weight_bits
        self.acc_bits = conv_acc_bits(in_bits, weight_bits, self.kernel)
        super().__init__({
            "i": In(stream.Signature(signed(in_bits))),
            "o": Out(stream.Signature(signed(self.acc_bits))),
            "restart": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        C, K = self.channels, self.kernel
        hist_layout = data.ArrayLayout(signed(self.in_bits), max(1, K - 1))
        taps_layout = data.ArrayLayout(signed(self.weight_bits), K)

        m.submodules.hist = hist = memory.Memory(shape=hist_layout, depth=C, init=[])
        m.submodules.taps = taps = memory.Memory(
            shape=taps_layout, depth=C, init=[[int(v) for v in row] for row in self.weights])
        hist_rd = hist.read_port(domain="sync")
        hist_wr = hist.write_port()
        taps_rd = taps.read_port(domain="sync")

        chan = Signal(range(C))
        seen = Signal(range(K))       # tokens since restart, saturating at K-1

        # stage 1: the accepted input, while its history and taps are read
        s1_valid = Signal()
        s1_x = Signal(signed(self.in_bits))
        s1_chan = Signal(range(C))
        s1_seen = Signal(range(K))

        advance = s1_valid & (~self.o.valid | self.o.ready)
        accept = self.i.valid & self.i.ready
        m.d.comb += [
            self.i.ready.eq(~s1_valid | advance),
            hist_rd.en.eq(accept), hist_rd.addr.eq(chan),
            taps_rd.en.eq(accept), taps_rd.addr.eq(chan),
        ]
        with m.If(accept):
            m.d.sync += [s1_x.eq(self.i.payload), s1_chan.eq(chan), s1_seen.eq(seen)]
            with m.If(chan == C - 1):
                m.d.sync += chan.eq(0)
                with m.If(seen != K - 1):
                    m.d.sync += seen.eq(seen + 1)
            with m.Else():
                m.d.sync += chan.eq(chan + 1)
        with m.If(advance & ~accept):
            m.d.sync += s1_valid.eq(0)
        with m.Elif(accept):
            m.d.sync += s1_valid.eq(1)
        with m.If(self.restart):
            m.d.sync += [chan.eq(0), seen.eq(0)]

        # the window x_{t-K+1} .. x_t; slot m of the history is x_{t-(K-1)+m},
        # present only if at least K-1-m tokens came before in this sequence
        window = [Signal(signed(self.in_bits), name=f"win{slot}") for slot in range(K - 1)]
        for slot, v in enumerate(window):
            m.d.comb += v.eq(0)
            with m.If(s1_seen >= (K - 1 - slot)):
                m.d.comb += v.eq(hist_rd.data[slot])
        window.append(s1_x)

        acc = sum(taps_rd.data[j] * window[j] for j in range(K))
        with m.If(advance):
            m.d.sync += [self.o.payload.eq(acc), self.o.valid.eq(1)]
        with m.Elif(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        # shift the new input into the channel's history
        if K > 1:
            m.d.comb += [
                hist_wr.en.eq(advance),
                hist_wr.addr.eq(s1_chan),
                hist_wr.data.eq(Cat(*window[1:])),
            ]
        return m
