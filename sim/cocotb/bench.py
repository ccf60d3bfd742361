"""The base of the block benches (sim/cocotb/tb_embed.py, tb_head.py, tb_matvec.py,
tb_mla_softmax.py, tb_attnres.py): the clock, the reset and the stream helpers they share.

``BlockBench(dut, seed)`` holds the DUT and the bench's one random source (every stall and
back-pressure draw comes from it, so a seed replays a run).  ``start()`` starts the clock
and its cycle count (sim/cocotb/clocking.py: CLOCK_NS, the one simulation period), runs
the bench's ``setup()`` (inputs held at a value, stream tasks), then resets the DUT.  The
stream helpers build the drivers and sinks of sim/cocotb/streams.py on the DUT's ports
with the bench's random source; ``wait_for`` waits for a stream's outputs within the cycle
limit of sim/cocotb_util.py.
"""
from __future__ import annotations

import random

import cocotb
from cocotb.triggers import RisingEdge

from sim.cocotb.clocking import CLOCK_NS, CycleCount, reset_pulse
from sim.cocotb.streams import EdgeStreamSink, StreamDriver, StreamMonitor
from sim.cocotb_util import cycle_limit, over_limit


class BlockBench:
    def __init__(self, dut, seed: int):
        self.dut = dut
        self.rng = random.Random(seed)
        self.clock = None

    async def start(self):
        """The clock on, ``setup()``, then a reset."""
        self.clock = CycleCount(self.dut.clk, CLOCK_NS)
        self.setup()
        await self.reset()

    def setup(self):
        """What a bench does between the clock's start and the first reset (none here)."""

    @property
    def cycle(self) -> int:
        """Clock cycles since ``start()``."""
        return self.clock.value

    async def reset(self, cycles: int = 3):
        await reset_pulse(self.dut, cycles)

    # ---- streams on the DUT's ports ----
    def stream_driver(self, port: str, codec, stall: float = 0.0) -> StreamDriver:
        """A driver of the input stream ``port`` (its ``run()``: ``start_streams``)."""
        return StreamDriver(self.dut, port, self.dut.clk, codec, self.rng, stall)

    def stream_monitor(self, port: str, codec, backpressure: float = 0.0) -> StreamMonitor:
        """A monitor of the output stream ``port`` (its ``run()``: ``start_streams``)."""
        return StreamMonitor(self.dut, port, self.dut.clk, codec, self.rng, backpressure)

    def stream_sink(self, port: str, codec, backpressure: float = 0.0) -> EdgeStreamSink:
        """An edge sink on the output stream ``port``, started."""
        return EdgeStreamSink(self.dut, port, self.dut.clk, codec, self.rng, CLOCK_NS, backpressure).start()

    @staticmethod
    def start_streams(*streams):
        """Start the ``run()`` task of each driver or monitor."""
        for s in streams:
            cocotb.start_soon(s.run())

    async def wait_for(self, items: list, n: int, bound: float, what: str, inputs: int | None = None) -> int:
        """Until ``items`` (a sink's or monitor's) holds ``n``; the cycles it took.  Fails past
        the cycle limit (sim/cocotb_util.py) of a design whose roofline is ``bound`` cycles per
        input, for ``inputs`` inputs (default ``n``: an output each)."""
        limit, c0 = cycle_limit(bound, n if inputs is None else inputs), self.cycle
        while len(items) < n:
            await RisingEdge(self.dut.clk)
            if self.cycle - c0 > limit:
                raise AssertionError(over_limit(what, len(items), n, self.cycle - c0, limit, bound))
        return self.cycle - c0
