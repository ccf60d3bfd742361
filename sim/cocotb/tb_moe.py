"""cocotb bench of the MoE unit (hw/moe/unit.py): tokens in, tokens out, bit-exact.

Reads the case written by sim/cocotb/tb_moe_case.py (path in MOE_CASE), sets
the model's per-model values on the ``params`` port, fills the weight memory
(sim/cocotb/weight_memory.py: latency, random stalls), drives tokens with
random gaps, takes outputs with random back-pressure, and compares every
output with the integer model.  If ``reset_after`` > 0 a
first pass is cut by a reset in the middle of a token, then the whole
sequence runs from the start (state after reset must not matter).  Writes
the counters to MOE_RESULT (json) for the pytest side.  Each pass waits at
most sim/cocotb_util.py ``cycle_limit`` cycles for its outputs, the roofline
being the unit's analytic weight bytes per token over the port width (the
engine takes one beat per cycle); MOEKDA_RESP_STALL overrides the case's
response stall (1.0: the memory never answers, how
sim/tests/chip/test_bench_limits.py makes the unit hang).

A model's case (meta ``layers``, issue 14) gives each token a layer: the
source offers a token only when the unit is empty (every earlier output taken),
with ``layer`` and that layer's values on ``params`` / ``dense_params`` (as the
chip reloads its bank between layers), holds them while the token is inside,
drives random bits every cycle on the port the layer has no values for, and a
random ``layer`` whenever no token is offered (the unit samples it on
acceptance only).  On the layer chip ``layer`` is left undriven (Icarus: z), so
an output that depended on it would carry X and fail.

Every signal is driven after the falling edge and handshakes are sampled in
the ReadOnly phase of that step (see weight_memory.py).
"""
from __future__ import annotations

import json
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly

from sim.cocotb.clocking import CLOCK_NS
from sim.cocotb_util import cycle_limit, over_limit, tb_param
from weight_memory import WeightMemory


def pack(vec) -> int:
    return sum((int(v) & 0xFF) << (8 * i) for i, v in enumerate(vec))


def unpack(word: int, n: int, bits: int) -> list[int]:
    mask, sign = (1 << bits) - 1, 1 << (bits - 1)
    return [(((word >> (bits * i)) & mask) ^ sign) - sign for i in range(n)]


class LayerPorts:
    """A model's per-token ports: ``layer``, ``params`` and (with a dense layer) ``dense_params``."""

    def __init__(self, dut, meta, rng):
        self.dut, self.rng = dut, rng
        self.layers = meta["layers"]
        self.values = [{k: (None if v is None else int(v, 16)) for k, v in p.items()} for p in meta["layer_ports"]]
        self.ports = [n for n in ("params", "dense_params") if hasattr(dut, n)]
        self.bits = meta["port_bits"]
        self.layer_bits = len(dut.layer.value)
        self.cur = None          # the layer of the token offered or inside

    def drive(self, offered: bool):
        """Every cycle: the current layer's values held, random bits where it has none, and
        a random layer index while no token is offered."""
        for name in self.ports:
            v = None if self.cur is None else self.values[self.cur][name]
            getattr(self.dut, name).value = self.rng.getrandbits(self.bits[name]) if v is None else v
        self.dut.layer.value = self.cur if offered else self.rng.getrandbits(self.layer_bits)


class TokenSource:
    def __init__(self, dut, tokens, stall, rng, layer_ports=None, outputs_taken=None):
        self.dut, self.tokens, self.stall, self.rng = dut, tokens, stall, rng
        self.layer_ports, self.outputs_taken = layer_ports, outputs_taken
        self.sent = 0

    async def run(self):
        dut = self.dut
        lp = self.layer_ports
        offered = False
        while self.sent < len(self.tokens):
            await FallingEdge(dut.clk)
            # a model's token waits until the unit is empty: its layer's parameters replace the
            # previous token's only then (the unit reads them while a token is inside)
            empty = lp is None or self.outputs_taken() == self.sent
            if not offered and empty and self.rng.random() >= self.stall:
                dut.tokens__payload.value = pack(self.tokens[self.sent])
                offered = True
                if lp is not None:
                    lp.cur = lp.layers[self.sent]
            if lp is not None:
                lp.drive(offered)
            dut.tokens__valid.value = int(offered)
            await ReadOnly()
            if offered and int(dut.tokens__ready.value):
                self.sent += 1
                offered = False
        await FallingEdge(dut.clk)
        dut.tokens__valid.value = 0


class TokenSink:
    def __init__(self, dut, d, bits, stall, rng):
        self.dut, self.d, self.bits, self.stall, self.rng = dut, d, bits, stall, rng
        self.got: list[list[int]] = []
        self.cycle_of: list[int] = []

    async def run(self, n, cycle_ref, limit, bound):
        dut = self.dut
        waited = 0
        while len(self.got) < n:
            await FallingEdge(dut.clk)
            waited += 1
            if waited > limit:
                raise AssertionError(over_limit("MoE unit", len(self.got), n, waited, limit, bound))
            take = self.rng.random() >= self.stall
            dut.out__ready.value = int(take)
            await ReadOnly()
            if take and int(dut.out__valid.value):
                if not dut.out__payload.value.is_resolvable:
                    raise AssertionError(f"output token has X/Z bits: {dut.out__payload.value}")
                self.got.append(unpack(int(dut.out__payload.value), self.d, self.bits))
                self.cycle_of.append(cycle_ref())
        await FallingEdge(dut.clk)
        dut.out__ready.value = 0


async def reset(dut, cycles=4):
    await FallingEdge(dut.clk)
    dut.rst.value = 1
    dut.tokens__valid.value = 0
    dut.out__ready.value = 0
    await ClockCycles(dut.clk, cycles)
    await FallingEdge(dut.clk)
    dut.rst.value = 0


@cocotb.test()
async def moe_tokens_bit_exact(dut):
    case = np.load(os.environ["MOE_CASE"])
    meta = json.loads(str(case["meta"]))
    tokens, expected = case["tokens"], case["expected"]
    d, pb = meta["d"], meta["port_bytes"]
    rng = random.Random(meta["seed"])
    # the model's values on the parameter port (hw/image/param_map.py region_value), static
    # for the whole run like the chip's parameter bank; a model's: per token (LayerPorts)
    layered = meta.get("layers") is not None
    if not layered:
        dut.params.value = int(meta["params"], 16)
    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
    cycle = [0]

    async def count():
        while True:
            await FallingEdge(dut.clk)
            cycle[0] += 1
    cocotb.start_soon(count())

    resp_stall = tb_param("resp_stall", meta["resp_stall"], float)
    bound = meta["bytes_per_token"] / pb

    def new_source(toks, sink):
        lp = LayerPorts(dut, meta, rng) if layered else None
        return TokenSource(dut, toks, meta["in_stall"], rng, lp, lambda: len(sink.got))

    def new_memory(seed):
        return WeightMemory(dut, case["image"].tobytes(), pb, meta["latency"], prefix="wport",
                            req_stall=meta["req_stall"], resp_stall=resp_stall, seed=seed).start()

    await reset(dut)
    if meta["reset_after"]:
        # first pass: some tokens, then a reset while a token is in flight
        mem = new_memory(meta["seed"] + 1)
        sink = TokenSink(dut, d, meta["out_bits"], meta["out_stall"], rng)
        src = new_source(tokens[:meta["reset_after"] + 1], sink)
        src_task = cocotb.start_soon(src.run())
        await sink.run(meta["reset_after"], lambda: cycle[0], cycle_limit(bound, meta["reset_after"]), bound)
        await ClockCycles(dut.clk, rng.randrange(5, 60))
        src_task.cancel()
        mem.stop()
        await reset(dut)
        for i, (got, want) in enumerate(zip(sink.got, expected)):
            assert got == [int(v) for v in want], f"first pass token {i}: got {got}, model {[int(v) for v in want]}"

    mem = new_memory(meta["seed"] + 2)
    c0 = cycle[0]
    sink = TokenSink(dut, d, meta["out_bits"], meta["out_stall"], rng)
    src = new_source(tokens, sink)
    cocotb.start_soon(src.run())
    limit = cycle_limit(bound, len(tokens))
    await sink.run(len(tokens), lambda: cycle[0], limit, bound)
    cycles = cycle[0] - c0
    dut._log.info(f"{len(tokens)} tokens: cycles used {cycles} of limit {limit}")
    for i, (got, want) in enumerate(zip(sink.got, expected)):
        where = f" of layer {meta['layers'][i]}" if layered else ""
        assert got == [int(v) for v in want], \
            f"token {i}{where}: got {got}, model {[int(v) for v in want]} (input {[int(v) for v in tokens[i]]})"

    await ReadOnly()
    hits = [int(getattr(dut, f"hits__{e}").value) for e in range(meta["E"])] if hasattr(dut, "hits__0") else None
    result = {
        "tokens": len(tokens),
        "tokens_done": int(dut.tokens_done.value),
        "weight_bytes": int(dut.weight_bytes.value),
        "memory_bytes": mem.counters.bytes,
        "requests": mem.counters.requests,
        "request_log": mem.counters.log,
        "hits": hits,
        "cycles": cycles,
        "dut_cycles": int(dut.cycles.value),
        "out_cycles": sink.cycle_of,
    }
    with open(os.environ["MOE_RESULT"], "w") as fh:
        json.dump(result, fh)
