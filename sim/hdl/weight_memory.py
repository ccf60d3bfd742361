"""HdlWeightMemory: the weight memory the layer bench simulates in the HDL, not in Python.

Not part of the chip.  It is the other end of a weight port (hw/stream/weight_port.py)
with the timing of the Python model sim/cocotb/weight_memory.py, so a long
simulation needs no Python call per clock cycle:

* the memory holds ``slots`` images of ``image_bytes`` each, one word per
  ``port_bytes`` beat (little-endian lanes, as the port defines); ``slot``
  picks the one requests read (the chip always reads from address 0: a second
  slot lets a bench LOAD a damaged image, then a good one).  The contents are
  the initial image (if given) or written by the bench through ``wr_*``, one
  word per rising edge of ``wr_clk``, a clock of its own: the bench writes an
  image in a few picoseconds of simulated time, with no edge of the chip's
  clock (so no cycle of a gate-level chip), and one simulator build serves
  every model;
* requests are queued (up to ``max_outstanding``) and answered in order; the
  first beat of a request accepted in cycle ``c`` is offered in cycle
  ``c + latency`` at the earliest, further beats one per cycle;
* random stalls: in each cycle ``req.ready`` drops with probability
  ``req_stall / 256`` and a beat not yet offered is held back with
  probability ``resp_stall / 256`` (an offered beat stays until taken, the
  stream rule).  The random numbers come from a xorshift32 generator that is
  not reset with the design (a reset must not replay the same stalls) and is
  (re)seeded by ``seed_load``; the bench sets the thresholds and seed;
* counters of requests, beats and bytes served since reset, for the bench to
  compare with the chip's own WEIGHT_BYTES counter;
* ``error`` (sticky until reset) flags a request the port contract forbids:
  bit 0 address not aligned to ``port_bytes``, bit 1 zero beats, bit 2 a read
  beyond the image.  The Python model raises at once; here the bench reads
  the flags (they cannot stop the simulation by themselves).

HdlCacheMemory is the same memory behind an MLA unit's cache port (hw/mla/cache.py): the
reads as above, plus the port's ``wr`` stream of single-beat writes in the chip's clock
(``wr_port``; its ready drops with the request stall probability, on a random bit of its
own), applied when accepted.  It decodes the first ``rows`` positions of each context
(the cache's address space is 2**16 rows a context; a bench that runs fewer tokens needs
fewer), and flags a read or write beyond them with error bit 2.
"""
from __future__ import annotations

from amaranth import Array, ClockDomain, ClockSignal, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.stream.weight_port import BEATS_BITS, WeightRequest, ceil_div, response_layout
from hw.mla.cache import cache_contexts, cache_tokens, cache_write_layout, row_stride

COUNT_BITS = 48          # bytes of a 4096-token run of small (~0.5 GB) fit with room to spare
STALL_BITS = 8           # thresholds are in 1/256


def control_members(port_bytes: int) -> dict:
    """Run-time controls (stall thresholds, seed, slot, writes) and counters, also exposed by
    tops that wrap the memory."""
    return {
        "seed": In(32), "seed_load": In(1),
        "req_stall": In(STALL_BITS), "resp_stall": In(STALL_BITS),
        "slot": In(1), "wr_clk": In(1), "wr_en": In(1), "wr_addr": In(32), "wr_data": In(8 * port_bytes),
        "requests": Out(COUNT_BITS), "beats": Out(COUNT_BITS), "bytes": Out(COUNT_BITS),
        "error": Out(3),
    }


def xorshift32(x):
    """One step of Marsaglia's xorshift32 (full period over the non-zero states)."""
    x = x ^ (x << 13)[:32]
    x = x ^ (x >> 17)
    return x ^ (x << 5)[:32]


class HdlWeightMemory(wiring.Component):
    """``image``: the initial contents of slot 0 (bytes), or the slot size in bytes (an int:
    zeros, to be written through ``wr_*``)."""

    def __init__(self, image, port_bytes: int, latency: int, max_outstanding: int = 8, slots: int = 1,
                 members: dict | None = None):
        if latency < 1:
            raise ValueError("latency must be at least one cycle")
        if max_outstanding < 1:
            raise ValueError("max_outstanding must be at least 1")
        if slots not in (1, 2):
            raise ValueError("slots must be 1 or 2")
        self.port_bytes, self.latency, self.depth, self.slots = port_bytes, latency, max_outstanding, slots
        image = bytes(image)          # bytes(n) of an int: n zero bytes
        self.image_bytes = len(image)
        self.words = max(1, ceil_div(len(image), port_bytes))
        padded = image + bytes(self.words * port_bytes - len(image))
        self.init = [int.from_bytes(padded[w * port_bytes:(w + 1) * port_bytes], "little")
                     for w in range(self.words)]
        super().__init__({
            "req": In(stream.Signature(WeightRequest)),
            "resp": Out(stream.Signature(response_layout(port_bytes))),
            **control_members(port_bytes),
            **(members or {}),
        })

    def word_of(self, addr, beats):
        """(word of byte address ``addr`` in the current slot, its request of ``beats`` beats
        reaches past what the memory holds)."""
        return (addr // self.port_bytes + Mux(self.slot, self.words, 0),
                addr + beats * self.port_bytes > self.image_bytes)

    def chip_writes(self, m, mem, rand) -> None:
        """Writes from the chip's side (none: the weight memory is read-only to the chip)."""

    def elaborate(self, platform):
        m = Module()
        pb, depth = self.port_bytes, self.depth

        m.submodules.mem = mem = Memory(shape=unsigned(8 * pb), depth=self.words * self.slots, init=self.init)
        rd = mem.read_port(domain="comb")
        m.domains.wr = ClockDomain("wr", local=True, reset_less=True)
        m.d.comb += ClockSignal("wr").eq(self.wr_clk)
        wr = mem.write_port(domain="wr")
        m.d.comb += [wr.en.eq(self.wr_en), wr.addr.eq(self.wr_addr), wr.data.eq(self.wr_data)]

        rand = Signal(32, init=1, reset_less=True)
        m.d.sync += rand.eq(Mux(self.seed_load, Mux(self.seed == 0, 1, self.seed), xorshift32(rand)))
        req_stalled = rand[0:STALL_BITS] < self.req_stall
        resp_stalled = rand[16:16 + STALL_BITS] < self.resp_stall
        self.chip_writes(m, mem, rand)

        now = Signal(32)                      # cycle count; due times compare modulo 2**32
        m.d.sync += now.eq(now + 1)

        # the queue of accepted requests: word address, beats, earliest cycle of the first beat
        q_word = Array(Signal(32, name=f"q_word{n}") for n in range(depth))
        q_beats = Array(Signal(BEATS_BITS, name=f"q_beats{n}") for n in range(depth))
        q_due = Array(Signal(32, name=f"q_due{n}") for n in range(depth))
        head, tail = Signal(range(depth)), Signal(range(depth))
        count = Signal(range(depth + 1))
        served = Signal(BEATS_BITS)           # beats of the head request already taken

        def bump(ptr):
            return Mux(ptr == depth - 1, 0, ptr + 1)

        # ---- responses
        nonempty = count != 0
        due = (now - q_due[head])[31] == 0    # now >= due, modulo 2**32
        hold = Signal()                       # a beat was offered and not taken: keep it
        m.d.comb += [
            rd.addr.eq(q_word[head] + served),
            self.resp.payload.data.eq(rd.data),
            self.resp.valid.eq(hold | (nonempty & due & ~resp_stalled)),
        ]
        take = self.resp.valid & self.resp.ready
        m.d.sync += hold.eq(self.resp.valid & ~self.resp.ready)
        pop = Signal()
        with m.If(take):
            m.d.sync += [self.beats.eq(self.beats + 1), self.bytes.eq(self.bytes + pb)]
            with m.If(served + 1 == q_beats[head]):
                m.d.comb += pop.eq(1)
                m.d.sync += [served.eq(0), head.eq(bump(head))]
            with m.Else():
                m.d.sync += served.eq(served + 1)

        # ---- requests
        m.d.comb += self.req.ready.eq((count < depth) & ~req_stalled)
        accept = self.req.valid & self.req.ready
        addr, beats = self.req.payload.addr, self.req.payload.beats
        word, beyond = self.word_of(addr, beats)
        with m.If(accept):
            m.d.sync += [q_word[tail].eq(word), q_beats[tail].eq(beats),
                         q_due[tail].eq(now + self.latency), tail.eq(bump(tail)),
                         self.requests.eq(self.requests + 1)]
            with m.If(addr % pb != 0):
                m.d.sync += self.error[0].eq(1)
            with m.If(beats == 0):
                m.d.sync += self.error[1].eq(1)
            with m.If(beyond):
                m.d.sync += self.error[2].eq(1)
        m.d.sync += count.eq(count + accept - pop)
        return m


class HdlCacheMemory(HdlWeightMemory):
    """The latent cache of ``cfg``'s MLA layers, ``rows`` positions of each context decoded
    (hw/mla/cache.py's layout: context, position, beat; the memory keeps them in that
    order, the rows beyond ``rows`` left out)."""

    def __init__(self, cfg, rows: int, max_outstanding: int = 8):
        self.stride = row_stride(cfg)
        self.rows = min(rows, cache_tokens(cfg))
        self.contexts = cache_contexts(cfg)
        self.context_bytes = cache_tokens(cfg) * self.stride       # the address space's
        pb = cfg.hw.weight_port_bytes
        super().__init__(self.contexts * self.rows * self.stride, pb, cfg.hw.weight_port_latency, max_outstanding,
                         members={"wr_port": In(stream.Signature(cache_write_layout(pb)))})

    def word_of(self, addr, beats):
        pb = self.port_bytes
        context = addr // self.context_bytes
        within = addr % self.context_bytes                 # byte offset inside the context
        held = self.rows * self.stride                     # of which the memory holds the first
        return ((context * held + within) // pb,
                (context >= self.contexts) | (within + beats * pb > held))

    def chip_writes(self, m, mem, rand) -> None:
        wp = mem.write_port()
        word, beyond = self.word_of(self.wr_port.payload.addr, 1)
        m.d.comb += [self.wr_port.ready.eq(~(rand[8:8 + STALL_BITS] < self.req_stall)),
                     wp.addr.eq(word), wp.data.eq(self.wr_port.payload.data),
                     wp.en.eq(self.wr_port.valid & self.wr_port.ready & ~beyond)]
        with m.If(self.wr_port.valid & self.wr_port.ready):
            with m.If(self.wr_port.payload.addr % self.port_bytes != 0):
                m.d.sync += self.error[0].eq(1)
            with m.If(beyond):
                m.d.sync += self.error[2].eq(1)
