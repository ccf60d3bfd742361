"""Several weight ports onto one: the chip has one weight memory, every block its own port.

``WeightArbiter(port_bytes, n)`` has ``n`` block-side ports ``up[i]`` (the
memory end of a block's ``WeightPortSignature``) and one ``down`` port (the
block end, towards the memory).

Requests: round-robin among the ports whose ``req.valid`` is high.  The grant
is registered first and the request offered on ``down`` the cycle after, then
held until the memory takes it, so the payload never changes under a valid
(the stream rule) and the pick never meets the payload mux in one cycle.  Every
request that goes down is also written, as ``(port, beats)``, into an order
queue of ``depth`` entries; a full queue holds further requests back, which
bounds the requests in flight.

Responses: the memory answers in request order (the port contract), so the
head of the order queue says whose beats are arriving; after ``beats`` of
them the head is dropped.  ``resp.ready`` of the memory is the ready of that
one block, so a block that stalls its response stalls only the memory - the
stream of beats is in order and cannot be given to anyone else anyway.
"""
from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.chip.weight_port import BEATS_BITS, WeightPortSignature


class WeightArbiter(wiring.Component):
    def __init__(self, port_bytes: int, n: int, depth: int = 8):
        if n < 1:
            raise ValueError("weight arbiter: at least one port")
        if depth < 1:
            raise ValueError("weight arbiter: order queue depth must be >= 1")
        self.port_bytes, self.n, self.depth = port_bytes, n, depth
        sig = WeightPortSignature(port_bytes)
        super().__init__({
            "up": In(sig).array(n),     # from the blocks
            "down": Out(sig),           # to the memory
        })

    def elaborate(self, platform):
        m = Module()
        n = self.n
        entry = data.StructLayout({"port": range(max(2, n)), "beats": BEATS_BITS})
        m.submodules.order = order = SyncFIFOBuffered(width=entry.size, depth=self.depth)

        # ---- request side: round-robin grant, held while the memory waits --------------
        last = Signal(range(max(2, n)))        # port granted last (lowest priority next)
        held, held_port = Signal(), Signal(range(max(2, n)))
        pick = Signal(range(max(2, n)))
        any_valid = Signal()
        # first valid port after ``last``, cyclically: scan in reverse priority so the
        # highest-priority candidate is assigned last and wins
        for k in reversed(range(n)):
            for i in range(n):
                with m.If(last == i):
                    port = (i + 1 + k) % n
                    with m.If(self.up[port].req.valid):
                        m.d.comb += [pick.eq(port), any_valid.eq(1)]
        # the grant is registered before the request is offered: the round-robin pick over n
        # valids and the n:1 payload mux in one cycle into the port's register slice did not
        # fit model-small's 1 ns with five clients (-0.184 ns from ``last``); a request waits
        # one cycle for its grant, and requests are a few per token
        grant = held_port
        valid = Signal()
        m.d.comb += valid.eq(held & order.w_rdy)
        m.d.comb += self.down.req.valid.eq(valid)
        for i in range(n):
            with m.If(grant == i):
                m.d.comb += self.down.req.payload.eq(self.up[i].req.payload)
                m.d.comb += self.up[i].req.ready.eq(held & self.down.req.ready & order.w_rdy)
        go = valid & self.down.req.ready
        m.d.comb += [order.w_en.eq(go),
                     order.w_data.eq(Cat(grant, self.down.req.payload.beats))]   # = entry
        with m.If(go):
            m.d.sync += [held.eq(0), last.eq(grant)]
        with m.Elif(~held & any_valid):
            m.d.sync += [held.eq(1), held_port.eq(pick)]

        # ---- response side: beats go to the port at the head of the order queue -----------
        head = data.View(entry, order.r_data)
        # the number of the arriving beat, counted from 1.  Whether it is the head's last is
        # known a cycle ahead (``last_r``, or ``beats == 1`` for a head none of whose beats has
        # been taken yet), so the memory's ready -> pop path has no comparator on it: that
        # path starts deep in a block (its resp.ready) and was the chip's worst path on small.
        nth = Signal(BEATS_BITS, init=1)
        fresh = Signal(init=1)             # no beat of the head taken yet (nth == 1)
        last_r = Signal()                  # valid when ~fresh: nth == head.beats
        is_last = Signal()
        m.d.comb += is_last.eq(Mux(fresh, head.beats == 1, last_r))
        for i in range(n):
            m.d.comb += self.up[i].resp.payload.eq(self.down.resp.payload)
            with m.If(order.r_rdy & (head.port == i)):
                m.d.comb += [self.up[i].resp.valid.eq(self.down.resp.valid),
                             self.down.resp.ready.eq(self.up[i].resp.ready)]
        beat = self.down.resp.valid & self.down.resp.ready
        with m.If(beat):
            with m.If(is_last):
                m.d.comb += order.r_en.eq(1)
                m.d.sync += [nth.eq(1), fresh.eq(1)]
            with m.Else():
                m.d.sync += [nth.eq(nth + 1), fresh.eq(0), last_r.eq(nth + 1 == head.beats)]
        return m
