"""The weight-memory port: how a block reads weights it does not hold on chip.

Every block (MoE, KDA) has one port of this signature; the layer top later
arbitrates them onto one memory.  It is two ``amaranth.lib.stream`` streams:

``req``  (block -> memory), payload ``{addr: unsigned(32), beats: unsigned(16)}``
    ``addr`` is a byte address aligned to ``port_bytes``; ``beats`` (>= 1) is
    how many response beats the block wants, i.e. it reads the bytes
    ``addr .. addr + beats*port_bytes - 1``.

``resp`` (memory -> block), payload ``{data: unsigned(8*port_bytes)}``
    Byte lane ``i`` (bits ``8i .. 8i+7``) of a beat is ``mem[a + i]`` where
    ``a`` is the beat's address: little-endian lanes, so an int8 row laid out
    in memory arrives with element ``j`` in lane ``j``.

Beats come back in request order; several requests may be outstanding (the
memory queues them), and a block must keep ``resp.ready`` high when it can
take data so the port stays busy.  Both streams follow the usual
valid/ready rule: a transfer happens on a cycle where both are high, and
``valid`` never waits for ``ready``.

In generated Verilog the payloads are flat vectors: ``req`` payload bits
``[31:0]`` are ``addr`` and ``[47:32]`` are ``beats``; ``resp`` payload is the
data word.  ``sim/cocotb/weight_memory.py`` is the memory model used by the
tests.
"""
from __future__ import annotations

from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

ADDR_BITS = 32
BEATS_BITS = 16
MAX_BEATS = (1 << BEATS_BITS) - 1

WeightRequest = data.StructLayout({"addr": unsigned(ADDR_BITS), "beats": unsigned(BEATS_BITS)})


def response_layout(port_bytes: int) -> data.StructLayout:
    return data.StructLayout({"data": unsigned(8 * port_bytes)})


class WeightPortSignature(wiring.Signature):
    """The block side of a weight port (``Out`` member of the block): it
    drives ``req`` and receives ``resp``."""

    def __init__(self, port_bytes: int):
        if port_bytes < 1 or port_bytes & (port_bytes - 1):
            raise ValueError(f"port_bytes = {port_bytes}: must be a power of two")
        self.port_bytes = port_bytes
        super().__init__({
            "req": Out(stream.Signature(WeightRequest)),
            "resp": In(stream.Signature(response_layout(port_bytes))),
        })

    def __eq__(self, other):
        return isinstance(other, WeightPortSignature) and other.port_bytes == self.port_bytes

    def __hash__(self):
        return hash(("WeightPortSignature", self.port_bytes))

    def __repr__(self):
        return f"WeightPortSignature({self.port_bytes})"


# ---- helpers shared by the memory map, the blocks and the testbench ---------

def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def padded_row_bytes(cols: int, port_bytes: int) -> int:
    """Bytes one int8 row occupies in memory: rows start on a beat boundary."""
    return ceil_div(cols, port_bytes) * port_bytes


def beats_per_row(cols: int, port_bytes: int) -> int:
    """Response beats that carry one padded int8 row of ``cols`` elements."""
    return ceil_div(cols, port_bytes)


def beats_for_rows(rows: int, cols: int, port_bytes: int) -> int:
    return rows * beats_per_row(cols, port_bytes)


def split_request(addr: int, beats: int, port_bytes: int, max_beats: int = MAX_BEATS):
    """Cut one long read into ``(addr, beats)`` requests the 16-bit ``beats``
    field can express."""
    if addr % port_bytes:
        raise ValueError(f"address {addr:#x} is not aligned to the {port_bytes}-byte port")
    out = []
    while beats > 0:
        n = min(beats, max_beats)
        out.append((addr, n))
        addr += n * port_bytes
        beats -= n
    return out
