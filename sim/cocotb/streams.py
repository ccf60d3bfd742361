"""Reusable cocotb pieces for amaranth.lib.stream ports (valid/ready/payload).

* ``LayoutCodec``: packs a dict into the flat payload bits of an amaranth
  ``data.Layout`` and back (signed fields and arrays included), so a bench
  never hard-codes a bit offset; the layout object is the one the RTL uses.
* ``StreamDriver``: sends items, idling a random number of cycles between
  them (``stall``), and holds valid and payload until ready, as the stream
  rules require.
* ``StreamMonitor``: takes items, dropping ready at random (``backpressure``).

Both sample the handshake in the ReadOnly phase of a cycle and change their
outputs just after the rising edge, so they behave the same on Icarus and
Verilator.  They run Python every clock cycle: fine for block benches.

``EdgeStreamSource`` / ``EdgeStreamSink`` do the same jobs for long runs
without per-cycle Python: they sleep on the other side's valid/ready edges
and draw a random stall as a whole gap of cycles (one Timer), so Python runs
a handful of times per item however long the design works on it.  Ports are found by the Amaranth flattened names
``<name>__valid``, ``<name>__ready``, ``<name>__payload``.
"""
from __future__ import annotations

import dataclasses
import random
from collections import deque

from amaranth.lib import data
import cocotb
from cocotb.triggers import Event, FallingEdge, ReadOnly, RisingEdge, Timer


class LayoutCodec:
    def __init__(self, layout: data.Layout):
        self.layout = data.Layout.cast(layout)

    def pack(self, value) -> int:
        """``value``: a dict, or a dataclass (e.g. a model's Beat) with the field names."""
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        return self._pack(self.layout, value)

    def unpack(self, bits: int) -> dict:
        return self._unpack(self.layout, bits)

    def _pack(self, layout, value) -> int:
        if isinstance(layout, data.ArrayLayout):
            size = _shape_width(layout.elem_shape)
            if len(value) != layout.length:
                raise ValueError(f"array of {layout.length} expected, got {len(value)}")
            bits = 0
            for i, v in enumerate(value):
                bits |= self._pack_elem(layout.elem_shape, v, size) << (i * size)
            return bits
        bits = 0
        for name, fld in layout:
            bits |= self._pack_elem(fld.shape, value[name], fld.width) << fld.offset
        return bits

    def _pack_elem(self, shape, v, width) -> int:
        if isinstance(shape, data.Layout):
            return self._pack(shape, v)
        lo, hi = _range(shape)
        if not lo <= int(v) <= hi:
            raise ValueError(f"value {v} out of range [{lo}, {hi}] for {shape!r}")
        return int(v) & ((1 << width) - 1)

    def _unpack(self, layout, bits: int):
        if isinstance(layout, data.ArrayLayout):
            size = _shape_width(layout.elem_shape)
            return [self._unpack_elem(layout.elem_shape, (bits >> (i * size)) & ((1 << size) - 1), size)
                    for i in range(layout.length)]
        return {name: self._unpack_elem(fld.shape, (bits >> fld.offset) & ((1 << fld.width) - 1), fld.width)
                for name, fld in layout}

    def _unpack_elem(self, shape, bits: int, width: int):
        if isinstance(shape, data.Layout):
            return self._unpack(shape, bits)
        if _is_signed(shape) and bits >> (width - 1):
            return bits - (1 << width)
        return bits


def _shape_width(shape) -> int:
    if isinstance(shape, data.Layout):
        return shape.size
    from amaranth.hdl import Shape
    return Shape.cast(shape).width


def _is_signed(shape) -> bool:
    from amaranth.hdl import Shape
    return Shape.cast(shape).signed


def _range(shape) -> tuple[int, int]:
    from amaranth.hdl import Shape
    s = Shape.cast(shape)
    return (-(1 << (s.width - 1)), (1 << (s.width - 1)) - 1) if s.signed else (0, (1 << s.width) - 1)


class StreamDriver:
    """Drives ``<prefix>__valid``/``__payload`` of a stream input of the DUT."""

    def __init__(self, dut, prefix: str, clk, codec: LayoutCodec, rng: random.Random, stall: float = 0.0):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.clk, self.codec, self.rng, self.stall = clk, codec, rng, stall
        self.queue: deque = deque()
        self.current = None
        self.sent: list = []      # items the DUT took, in order
        self.cycles = 0
        self.valid.value = 0

    def send(self, items):
        self.queue.extend(items)

    def flush(self):
        """Forget everything not yet taken (what a producer does on reset)."""
        self.queue.clear()
        self.current = None

    @property
    def idle(self) -> bool:
        return self.current is None and not self.queue

    async def run(self):
        while True:
            if self.current is None and self.queue and self.rng.random() >= self.stall:
                self.current = self.queue.popleft()
            if self.current is not None:
                self.payload.value = self.codec.pack(self.current)
                self.valid.value = 1
            else:
                self.valid.value = 0
            await ReadOnly()
            if self.current is not None and int(self.ready.value) == 1:
                self.sent.append(self.current)
                self.current = None
            await RisingEdge(self.clk)
            self.cycles += 1


class StreamMonitor:
    """Takes items from ``<prefix>__valid``/``__payload`` of a stream output, with back-pressure."""

    def __init__(self, dut, prefix: str, clk, codec: LayoutCodec, rng: random.Random,
                 backpressure: float = 0.0):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.clk, self.codec, self.rng, self.backpressure = clk, codec, rng, backpressure
        self.items: list = []
        self.ready.value = 0

    async def run(self):
        while True:
            ready = self.rng.random() >= self.backpressure
            self.ready.value = int(ready)
            await ReadOnly()
            if ready and int(self.valid.value) == 1:
                self.items.append(self.codec.unpack(int(self.payload.value)))
            await RisingEdge(self.clk)


def stall_gap(rng: random.Random, p: float) -> int:
    """Idle cycles before the next offer when each cycle stalls with probability ``p``
    (geometric): what a per-cycle coin would give, drawn at once."""
    gap = 0
    while p > 0 and rng.random() < p:
        gap += 1
    return gap


class EdgeStreamSource:
    """Sends items on ``<prefix>__valid/__ready/__payload`` of a DUT input stream.

    Before each item it waits ``stall_gap(stall)`` cycles (valid low), then
    holds valid and the payload until a transfer; between items it sleeps on
    the ready edge, not on the clock.  Outputs change half a cycle after a
    rising edge (design inputs are stable around the edge, on any simulator)."""

    def __init__(self, dut, prefix: str, clk, codec: LayoutCodec, rng: random.Random,
                 clock_ns: int, stall: float = 0.0):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.clk, self.codec, self.rng, self.clock_ns, self.stall = clk, codec, rng, clock_ns, stall
        self.queue: deque = deque()
        self.sent: list = []          # items the DUT took, in order
        self._more, self._progress = Event(), Event()
        self._task = None
        self.valid.value = 0

    def start(self):
        self._task = cocotb.start_soon(self._run())
        return self

    def send(self, items):
        self.queue.extend(items)
        self._more.set()

    def flush(self):
        """Forget everything not yet taken and drop valid (what a producer does on reset)."""
        if self._task is not None:
            self._task.cancel()
        self.queue.clear()
        self.valid.value = 0
        self.start()

    async def wait_sent(self, n: int):
        """Until ``n`` items were taken in total."""
        while len(self.sent) < n:
            self._progress.clear()
            await self._progress.wait()

    async def _run(self):
        while True:
            if not self.queue:
                self._more.clear()
                await self._more.wait()
            item = self.queue.popleft()
            await FallingEdge(self.clk)
            gap = stall_gap(self.rng, self.stall)
            if gap:
                await Timer(gap * self.clock_ns, unit="ns")
            self.payload.value = self.codec.pack(item)
            self.valid.value = 1
            while True:
                await ReadOnly()
                if int(self.ready.value):
                    break
                await RisingEdge(self.ready)
                await FallingEdge(self.clk)
            await RisingEdge(self.clk)          # the transfer
            self.sent.append(item)
            self.valid.value = 0
            self._progress.set()


class EdgeStreamSink:
    """Takes items from ``<prefix>__valid/__ready/__payload`` of a DUT output stream.

    With ``backpressure`` p, ready stays low for ``stall_gap(p)`` cycles after an
    item is offered, then high for its transfer; with p = 0 ready is always high.
    ``on_item(item)`` is called for each item as it is taken.  A payload or valid
    that changes while an item waits for ready breaks the stream rule: it goes
    to ``problems``."""

    def __init__(self, dut, prefix: str, clk, codec: LayoutCodec, rng: random.Random,
                 clock_ns: int, backpressure: float = 0.0, on_item=None):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.clk, self.codec, self.rng, self.clock_ns = clk, codec, rng, clock_ns
        self.backpressure, self.on_item = backpressure, on_item
        self.items: list = []
        self.problems: list[str] = []
        self._progress = Event()
        self._task = None
        self.ready.value = int(backpressure == 0)

    def start(self):
        self._task = cocotb.start_soon(self._run())
        return self

    def restart(self):
        """Drop a transfer in progress (the design was reset) and start over."""
        if self._task is not None:
            self._task.cancel()
        self.ready.value = int(self.backpressure == 0)
        self.start()

    async def wait_items(self, n: int):
        while len(self.items) < n:
            self._progress.clear()
            await self._progress.wait()

    async def _run(self):
        while True:
            await ReadOnly()
            if not int(self.valid.value):
                # an edge may be a zero-delay glitch (gate level): the settled value decides
                await RisingEdge(self.valid)
                continue
            await FallingEdge(self.clk)
            offered = int(self.payload.value)
            gap = stall_gap(self.rng, self.backpressure)
            if gap:
                await Timer(gap * self.clock_ns, unit="ns")
            self.ready.value = 1
            await ReadOnly()
            if not int(self.valid.value) or int(self.payload.value) != offered:
                self.problems.append(f"{self.valid._name}: valid or payload changed while waiting for ready")
                if not int(self.valid.value):
                    await RisingEdge(self.clk)
                    continue        # no transfer
            bits = int(self.payload.value)
            await RisingEdge(self.clk)          # the transfer
            if self.backpressure:
                self.ready.value = 0
            item = self.codec.unpack(bits)
            self.items.append(item)
            self._progress.set()
            if self.on_item is not None:
                self.on_item(item)
