"""Several weight ports onto one: the chip has one weight memory, every block its own port.

``WeightArbiter(port_bytes, n)`` has ``n`` block-side ports ``up[i]`` (the
memory end of a block's ``WeightPortSignature``) and one ``down`` port (the
block end, towards the memory).

Requests: round-robin among the ports whose ``req.valid`` is high, or with
``priority`` the lowest-numbered one (a chip whose critical block must not
wait behind the others' requests: the model chip's KDA unit).  The grant is
registered first and the request offered on ``down`` the cycle after, then
held until the memory takes it, so the payload never changes under a valid
(the stream rule) and the pick never meets the payload mux in one cycle.  Every
request that goes down is also written, as ``(port, beats)``, into an order
queue of ``depth`` entries; a full queue holds further requests back, which
bounds the requests in flight.

``chunk`` > 0 cuts requests: a port's request is taken into the port's own
remainder register at once, and the arbiter sends it on in pieces of at most
``chunk`` beats, arbitrating again before each piece, with at most ``ahead``
pieces in flight.  Without it a long request (an expert's 768 beats) holds the
in-order memory for its whole length, and a block asking later waits behind
all of it; with it the wait is about ``ahead`` x ``chunk`` beats, so priority
means what it says.  A port's next request is taken when its remainder is sent.

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

from hw.stream.weight_port import BEATS_BITS, WeightPortSignature


class WeightArbiter(wiring.Component):
    def __init__(self, port_bytes: int, n: int, depth: int = 8, priority: bool = False, chunk: int = 0,
                 ahead: int = 2):
        if n < 1:
            raise ValueError("weight arbiter: at least one port")
        if depth < 1:
            raise ValueError("weight arbiter: order queue depth must be >= 1")
        if chunk and not 1 <= ahead <= depth:
            raise ValueError(f"weight arbiter: ahead = {ahead}, allowed 1 to the queue depth {depth}")
        self.port_bytes, self.n, self.depth, self.priority = port_bytes, n, depth, priority
        self.chunk, self.ahead = chunk, ahead
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

        # ---- request side: one grant, registered, held while the memory waits ------------
        # the grant is registered before the request is offered: the round-robin pick over n
        # valids and the n:1 payload mux in one cycle into the port's register slice did not
        # fit model-small's 1 ns with five clients (-0.184 ns from ``last``); a request waits
        # one cycle for its grant, and requests are a few per token
        last = Signal(range(max(2, n)))        # port granted last (lowest priority next)
        held, grant = Signal(), Signal(range(max(2, n)))
        pick = Signal(range(max(2, n)))
        any_valid = Signal()
        room = Signal()
        if self.chunk:
            # a piece is offered only while fewer than ``ahead`` are in flight (the order
            # queue's level), so a block that asks now waits behind at most ``ahead`` pieces
            m.d.comb += room.eq(order.w_rdy & (order.r_level < self.ahead))
        else:
            m.d.comb += room.eq(order.w_rdy)
        valid = Signal()
        m.d.comb += [valid.eq(held & room), self.down.req.valid.eq(valid)]
        go = valid & self.down.req.ready
        m.d.comb += [order.w_en.eq(go), order.w_data.eq(Cat(grant, self.down.req.payload.beats))]   # = entry
        if self.chunk:
            self._pick(m, self._chunked(m, grant, go), last, pick, any_valid)
        else:
            self._pick(m, [self.up[i].req.valid for i in range(n)], last, pick, any_valid)
            for i in range(n):
                with m.If(grant == i):
                    m.d.comb += [self.down.req.payload.eq(self.up[i].req.payload),
                                 self.up[i].req.ready.eq(go)]
        with m.If(go):
            m.d.sync += [held.eq(0), last.eq(grant)]
        with m.Elif(~held & any_valid):
            m.d.sync += [held.eq(1), grant.eq(pick)]
        self._responses(m, order, entry)
        return m

    def _pick(self, m, valids, last, pick, any_valid) -> None:
        # first valid port after ``last``, cyclically (or the lowest with ``priority``): scan
        # in reverse so the winning candidate is assigned last
        n = self.n
        if self.priority:
            for port in reversed(range(n)):
                with m.If(valids[port]):
                    m.d.comb += [pick.eq(port), any_valid.eq(1)]
        else:
            for k in reversed(range(n)):
                for i in range(n):
                    with m.If(last == i):
                        port = (i + 1 + k) % n
                        with m.If(valids[port]):
                            m.d.comb += [pick.eq(port), any_valid.eq(1)]

    def _chunked(self, m, grant, go) -> list:
        """Requests taken into per-port remainders and sent on ``chunk`` beats at a time; returns
        the remainders' valid flags (what the pick chooses among)."""
        n, W, K = self.n, self.port_bytes, self.chunk
        rem_valid = [Signal(name=f"rem{i}_valid") for i in range(n)]
        rem_addr = [Signal(32, name=f"rem{i}_addr") for i in range(n)]
        rem_beats = [Signal(BEATS_BITS, name=f"rem{i}_beats") for i in range(n)]
        # remainder > K, registered with it: the piece's size and the remainder's next value
        # do not wait for a compare behind the grant mux (that path, mux -> compare -> mux ->
        # subtract, was model-small-sram's worst at -0.463 ns)
        rem_big = [Signal(name=f"rem{i}_big") for i in range(n)]
        for i in range(n):
            up = self.up[i].req
            m.d.comb += up.ready.eq(~rem_valid[i])
            with m.If(up.valid & ~rem_valid[i]):
                m.d.sync += [rem_valid[i].eq(1), rem_addr[i].eq(up.payload.addr), rem_beats[i].eq(up.payload.beats),
                             rem_big[i].eq(up.payload.beats > K)]
            with m.If(grant == i):
                m.d.comb += [self.down.req.payload.addr.eq(rem_addr[i]),
                             self.down.req.payload.beats.eq(Mux(rem_big[i], K, rem_beats[i]))]
                with m.If(go):
                    # a remainder of at most K went down whole; a bigger one loses K
                    m.d.sync += [rem_addr[i].eq(rem_addr[i] + K * W), rem_beats[i].eq(rem_beats[i] - K),
                                 rem_big[i].eq(rem_beats[i] > 2 * K), rem_valid[i].eq(rem_big[i])]
        return rem_valid

    def _responses(self, m, order, entry) -> None:
        n = self.n
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
