"""Testbench weight memory: the other end of a block's weight port (hw/stream/weight_port.py).

Runs Python every clock cycle: the block benches (KDA, MoE) use it.  The layer
bench uses its HDL twin sim/hdl/weight_memory.py (same timing rule, checked
against it in sim/tests/block/test_layer_weight_memory.py), which needs no Python per
cycle.

It answers read requests from a byte image (hw.image.memory_map.build_image) with
a fixed latency, inserts random stalls on both streams, honours
``resp.ready``, keeps several requests in flight, and counts what it serves,
so tests can check the bytes a block fetches per token against the analytic
count.

Timing model, per clock cycle:
* a request accepted at rising edge ``c`` gets its first beat offered for the
  rising edge ``c + latency``; further beats of the same (and later)
  requests follow one per cycle unless stalled;
* ``req.ready`` drops at random (``req_stall``) and when ``max_outstanding``
  requests are queued; ``resp.valid`` is held back at random (``resp_stall``)
  before a beat is offered, and once offered a beat stays until taken.

Every signal is driven just after the falling edge and the handshakes are
sampled in the ReadOnly phase of that time step, i.e. with the values the
design sees at the next rising edge; this is correct for Icarus and
Verilator alike and for designs whose ready depends combinationally on valid.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly


@dataclass
class PortCounters:
    requests: int = 0
    beats: int = 0
    bytes: int = 0
    log: list = field(default_factory=list)  # (addr, beats) of every request, in order

    def snapshot(self) -> tuple[int, int, int]:
        return self.requests, self.beats, self.bytes


class WeightMemory:
    def __init__(self, dut, image: bytes, port_bytes: int, latency: int, prefix: str = "wport",
                 req_stall: float = 0.0, resp_stall: float = 0.0, max_outstanding: int = 8, seed: int = 0,
                 clk=None):
        if latency < 1:
            raise ValueError("latency must be at least one cycle")
        self.clk = clk if clk is not None else dut.clk
        self.req_valid = getattr(dut, f"{prefix}__req__valid")
        self.req_ready = getattr(dut, f"{prefix}__req__ready")
        self.req_payload = getattr(dut, f"{prefix}__req__payload")
        self.resp_valid = getattr(dut, f"{prefix}__resp__valid")
        self.resp_ready = getattr(dut, f"{prefix}__resp__ready")
        self.resp_payload = getattr(dut, f"{prefix}__resp__payload")
        self.image = bytes(image)
        self.port_bytes = port_bytes
        self.latency = latency
        self.req_stall = req_stall
        self.resp_stall = resp_stall
        self.max_outstanding = max_outstanding
        self.rng = random.Random(seed)
        self.counters = PortCounters()
        self._pending: deque = deque()   # [addr, beats_left, first_cycle]
        self._task = None

    def start(self):
        self.req_ready.value = 0
        self.resp_valid.value = 0
        self.resp_payload.value = 0
        self._task = cocotb.start_soon(self._run())
        return self

    def stop(self):
        """Forget everything in flight (the design was reset) and stop answering."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._pending.clear()
        self.req_ready.value = 0
        self.resp_valid.value = 0

    def idle(self) -> bool:
        return not self._pending

    def _beat(self, addr: int) -> int:
        chunk = self.image[addr:addr + self.port_bytes]
        return int.from_bytes(chunk, "little")

    def _accept(self, payload: int, cycle: int):
        addr = payload & 0xFFFF_FFFF
        beats = (payload >> 32) & 0xFFFF
        if addr % self.port_bytes:
            raise AssertionError(f"weight port: address {addr:#x} not aligned to {self.port_bytes} bytes")
        if beats == 0:
            raise AssertionError(f"weight port: request at {addr:#x} for zero beats")
        end = addr + beats * self.port_bytes
        if end > len(self.image):
            raise AssertionError(f"weight port: read {addr:#x}..{end:#x} beyond the {len(self.image)}-byte image")
        self._pending.append([addr, beats, cycle + self.latency])
        self.counters.requests += 1
        self.counters.log.append((addr, beats))

    async def _run(self):
        cycle = 0
        offered = False
        while True:
            await FallingEdge(self.clk)
            cycle += 1
            if not offered and self._pending and self._pending[0][2] <= cycle \
                    and self.rng.random() >= self.resp_stall:
                self.resp_payload.value = self._beat(self._pending[0][0])
                offered = True
            self.resp_valid.value = int(offered)
            take = len(self._pending) < self.max_outstanding and self.rng.random() >= self.req_stall
            self.req_ready.value = int(take)
            await ReadOnly()
            if take and int(self.req_valid.value):
                self._accept(int(self.req_payload.value), cycle)
            if offered and int(self.resp_ready.value):
                head = self._pending[0]
                head[0] += self.port_bytes
                head[1] -= 1
                if head[1] == 0:
                    self._pending.popleft()
                self.counters.beats += 1
                self.counters.bytes += self.port_bytes
                offered = False
