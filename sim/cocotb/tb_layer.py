"""cocotb bench of the layer chip (hw/layer.py): token streams, weight memory, Wishbone CSRs.

Driven by sim/driver.py: the case (.npz in LAYER_CASE: config, weight image,
tokens, stream ``first`` bits, CSR clears, the reset plan, the integer
model's outputs) comes in, the result (.npz in LAYER_RESULT: every output
token with its input index, the CSR counters, TOKEN_CYCLES per token, the
bench's own protocol findings) goes out; the driver compares with the model.

What the bench checks by itself (protocol, not values):
* the ID and configuration read-back registers equal the config;
* with CTRL.RUN clear the chip takes no token;
* after the last input no extra output appears (none duplicated);
* TOKENS, MACS and WEIGHT_BYTES agree with what the bench saw: outputs taken,
  tokens x MACS_PER_TOKEN, bytes the weight memory served.
It also compares each output with the model as it arrives, so a failing run
stops at the first wrong token.
"""
from __future__ import annotations

import json
import os
import random

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly, RisingEdge
from cocotb.utils import get_sim_time

from hw.csr import CHIP_ID, COUNTERS, CTRL_CLEAR, CTRL_RUN, REGISTERS, config_words
from hw.layer import token_in_layout, token_out_layout
from moekda.config import config_from_dict
from sim.cocotb.streams import LayoutCodec, StreamDriver, StreamMonitor
from sim.cocotb.weight_memory import WeightMemory


CLOCK_NS = 10


class Wishbone:
    """Classic-cycle initiator on the chip's ``bus__*`` pins."""

    def __init__(self, dut):
        self.dut = dut
        for s in ("cyc", "stb", "we", "adr", "dat_w", "sel"):
            getattr(dut, f"bus__{s}").value = 0

    async def _access(self, adr: int, we: int, value: int = 0) -> int:
        d = self.dut
        await FallingEdge(d.clk)
        d.bus__cyc.value, d.bus__stb.value, d.bus__we.value = 1, 1, we
        d.bus__adr.value, d.bus__dat_w.value, d.bus__sel.value = adr, value, 0xF
        for _ in range(16):
            await RisingEdge(d.clk)
            await ReadOnly()
            if int(d.bus__ack.value):
                data = int(d.bus__dat_r.value)
                await FallingEdge(d.clk)
                d.bus__cyc.value, d.bus__stb.value, d.bus__we.value = 0, 0, 0
                return data
        raise AssertionError(f"Wishbone: no ack for register {adr:#x}")

    async def read(self, name: str) -> int:
        return await self._access(REGISTERS[name], 0)

    async def write(self, name: str, value: int) -> None:
        await self._access(REGISTERS[name], 1, value)


@cocotb.test()
async def layer_run(dut):
    z = np.load(os.environ["LAYER_CASE"])
    # the config travels as data: a model from `moekda vectors` has no config file
    cfg = config_from_dict(json.loads(str(z["config"])), source=os.environ["LAYER_CASE"])
    xs, first, clears, want = z["xs"], z["first"], z["clears"], z["want"]
    reset_at, abandon, stall = int(z["reset_at"]), int(z["abandon"]), bool(z["stall"])
    T = len(xs)
    rng = random.Random(int(z["seed"]))
    problems: list[str] = []
    in_codec, out_codec = LayoutCodec(token_in_layout(cfg)), LayoutCodec(token_out_layout(cfg))

    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
    # reset before anything samples the outputs: at gate level the flip-flops start as X
    dut.rst.value = 1
    for s in ("i__valid", "o__ready", "wport__req__ready", "wport__resp__valid"):
        getattr(dut, s).value = 0
    await ClockCycles(dut.clk, 2)
    bus = Wishbone(dut)
    src = StreamDriver(dut, "i", dut.clk, in_codec, rng, stall=0.3 if stall else 0.0)
    sink = StreamMonitor(dut, "o", dut.clk, out_codec, rng, backpressure=0.4 if stall else 0.0)
    cocotb.start_soon(src.run())
    cocotb.start_soon(sink.run())
    image = z["image"].tobytes()

    def memory():
        return WeightMemory(dut, image, cfg.hw.weight_port_bytes, cfg.hw.weight_port_latency,
                            req_stall=0.2 if stall else 0.0, resp_stall=0.2 if stall else 0.0,
                            seed=rng.randrange(1 << 30)).start()

    async def reset():
        dut.rst.value = 1
        await ClockCycles(dut.clk, 3)
        await FallingEdge(dut.clk)
        dut.rst.value = 0

    def token(t):
        return {"x": [int(v) for v in xs[t]], "first": int(first[t])}

    idx: list[int] = []         # input index of each output taken
    outputs: list[list[int]] = []
    out_cycles: list[int] = []  # clock cycle at which each output was collected
    seg = {"base": 0, "taken": 0, "sent_base": 0}   # the current segment (since the last reset)

    class Mismatch(Exception):
        pass

    def collect():
        while seg["taken"] < len(sink.items):
            t = seg["base"] + seg["taken"]
            y = sink.items[seg["taken"]]
            seg["taken"] += 1
            idx.append(t)
            outputs.append(y)
            out_cycles.append(int(get_sim_time(unit="ns")) // CLOCK_NS)
            if len(idx) % 64 == 0:
                dut._log.info(f"{len(idx)} output tokens")
            if t >= T:
                raise Mismatch(f"output {len(idx)} has no input (index {t})")
            if y != [int(v) for v in want[t]]:
                raise Mismatch(f"token {t}: first wrong output")

    async def cycles(n):
        for _ in range(n):
            await RisingEdge(dut.clk)
            collect()

    async def wait_outputs(n, limit=2_000_000):
        for _ in range(limit):
            collect()
            if seg["taken"] >= n:
                return
            await RisingEdge(dut.clk)
        raise AssertionError(f"timeout: {seg['taken']} of {n} outputs after {limit} cycles")

    async def stream(lo, hi):
        """Send tokens lo..hi-1, writing CTRL.CLEAR (after the previous token was taken)
        before every token marked in ``clears``; returns when all were taken."""
        t = lo
        while t < hi:
            end = next((c for c in range(t + 1, hi) if clears[c]), hi)
            src.send([token(k) for k in range(t, end)])
            while seg["sent_base"] + len(src.sent) < end:
                await cycles(1)
            if end < hi:
                await bus.write("CTRL", CTRL_RUN | CTRL_CLEAR)
            t = end

    async def body():
        nonlocal mem
        await reset()
        # registers after reset: identity, configuration, RUN clear
        if await bus.read("ID") != CHIP_ID:
            problems.append("ID register")
        for name, value in config_words(cfg).items():
            got = await bus.read(name)
            if got != value:
                problems.append(f"CSR {name} = {got}, config says {value}")
        if await bus.read("CTRL") & CTRL_RUN:
            problems.append("RUN set after reset")
        src.send([token(0)])
        await cycles(20)
        if src.sent:
            problems.append("the chip took a token with CTRL.RUN clear")
        await bus.write("CTRL", CTRL_RUN)
        while not src.sent:
            await cycles(1)
        seg_end = T if reset_at < 0 else reset_at
        await stream(1, seg_end)
        await wait_outputs(seg_end)
        if reset_at >= 0:
            # tokens reset_at.. are sent and the chip is reset with them inside
            resumed = reset_at + abandon
            await stream(reset_at, resumed)
            await cycles(rng.randrange(10, 300))
            src.flush()
            mem.stop()
            await reset()
            mem = memory()
            await cycles(2)
            # outputs that made it out before the reset are recorded; start over at ``resumed``
            sink.items.clear()
            seg.update(base=resumed, taken=0, sent_base=resumed)
            src.sent.clear()
            await bus.write("CTRL", CTRL_RUN)
            # the first token after the reset must start a new sequence by itself
            first[resumed] = False
            await stream(resumed, T)
            await wait_outputs(T - resumed)
        # nothing more may come out
        await cycles(200)
        if len(sink.items) != T - seg["base"]:
            problems.append(f"{len(sink.items) - (T - seg['base'])} extra output tokens after the last input")

    mem = memory()
    failure = None
    try:
        await body()
    except Mismatch as e:
        failure = str(e)
    counters = {}
    if failure is None:
        status = await bus.read("STATUS")
        if status & 1:
            problems.append(f"STATUS.BUSY set after the last token (STATUS {status:#x})")
        counters = {name: await bus.read(name) for name in (*COUNTERS, "MACS_PER_TOKEN")}
        seg_tokens = T - seg["base"]
        if counters["TOKENS"] != seg_tokens:
            problems.append(f"TOKENS = {counters['TOKENS']}, {seg_tokens} outputs taken since reset")
        if counters["MACS"] != (seg_tokens * counters["MACS_PER_TOKEN"]) & 0xFFFF_FFFF:
            problems.append(f"MACS = {counters['MACS']} != TOKENS x MACS_PER_TOKEN")
        if counters["WEIGHT_BYTES"] != mem.counters.bytes & 0xFFFF_FFFF:
            problems.append(f"WEIGHT_BYTES = {counters['WEIGHT_BYTES']}, the memory served {mem.counters.bytes}")
        counters["MEMORY_BYTES"] = mem.counters.bytes
    np.savez(os.environ["LAYER_RESULT"], idx=np.array(idx, np.int64),
             got=np.array(outputs, np.int64).reshape(len(idx), want.shape[1]),
             counter_names=np.array(list(counters), dtype=str),
             counter_values=np.array(list(counters.values()), np.int64),
             token_cycles=np.array([counters.get("TOKEN_CYCLES", 0)], np.int64),
             out_cycles=np.array(out_cycles, np.int64),
             bench_problems=np.array(problems, dtype=str))
    assert failure is None and not problems, failure or "; ".join(problems)
