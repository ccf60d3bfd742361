"""cocotb bench of the layer chip (hw/chip/layer.py): token streams, weight memory, Wishbone CSRs.

The toplevel is sim/hdl/layer_sim.py LayerSimTop: the chip (RTL or gate-level
netlist) with its weight memory in the HDL; the bench sets the memory's stall
thresholds and seed and reads its counters.  Nothing here runs every clock
cycle: the token streams wake on valid/ready edges and draw stalls as gaps
(sim/cocotb/streams.py EdgeStreamSource/Sink), so a run costs the simulator's
time plus a few Python wake-ups per token.

Driven by run/driver.py: the case (.npz in LAYER_CASE: config, weight image,
tokens, stream ``first`` bits, CSR clears, the reset plan, the integer
model's outputs) comes in, the result (.npz in LAYER_RESULT: every output
token with its input index as the bench counts them and the chip's own tag
(``seq``, hw/chip/layer.py token_out_layout), the CSR counters, TOKEN_CYCLES per
token, the bench's own protocol findings) goes out; the driver maps the
outputs to inputs by the chip's tags and compares with the model.

What the bench checks by itself (protocol, not values):
* the ID and configuration read-back registers equal the config;
* with CTRL.RUN clear the chip takes no token, nor with RUN set before a good
  LOAD; each damaged image of the case (``bad_images``, LOADed from the
  memory's second slot) is refused with its LOAD_ERRORS bits and leaves the
  chip taking no token; the good image's LOAD passes (LOAD_CYCLES recorded);
* after a reset the chip takes no token until it is LOADed again;
* after the last input no extra output appears (none duplicated);
* TOKENS, MACS and WEIGHT_BYTES agree with what the bench saw: outputs taken,
  tokens x (MACS_PER_TOKEN + the padding lanes: hw/chip/layer.py
  engine_macs_per_token, from the memory map), bytes the weight memory served;
  MACS counts the engines' beats as they happen: while the first token is inside
  (before its output) it rises above zero and stays at most one token's MACs;
* the weight memory saw no request the port contract forbids (its error flags);
* the output stream keeps valid and payload while it waits for ready.
It also compares each output with the model as it arrives, so a failing run
stops at the first wrong token, and ends a run that makes no progress at a
cycle limit from the config's roofline (sim/cocotb_util.py ``cycle_limit``,
plus each LOAD's allowance), reported with the bench's problems.
"""
from __future__ import annotations

import json
import os
import random
from collections import deque

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, FallingEdge, First, Lock, ReadOnly, RisingEdge, Timer
from cocotb.utils import get_sim_time

from hw.chip.csr import (CHIP_ID, COUNTERS, CTRL_CLEAR, CTRL_LOAD, CTRL_LOGITS, CTRL_RUN, REGISTERS, STAGE_COUNTERS,
                         STATUS, config_words)
from hw.chip.layer import engine_macs_per_token, token_in_layout, token_out_layout
from moekda.config import config_from_dict
from sim.cocotb.clocking import CLOCK_NS
from sim.cocotb.streams import EdgeStreamSink, EdgeStreamSource, LayoutCodec
from sim.cocotb_util import cycle_limit, over_limit, roofline_cycles


class ChipIO:
    """What differs between the two chips for the bench: the layer chip takes and gives
    residual-stream vectors (``xs`` (T, d), outputs ``y``), the model chip (hw/chip/model.py)
    takes token ids (``xs`` (T,)) and gives the next id and its logit (outputs (token,
    logit)), and has a ``logits`` stream."""

    def __init__(self, cfg):
        from hw.image.memory_map import sequence_slots
        self.model = not cfg.model.is_layer_chip
        self.slots = sequence_slots(cfg)
        if self.model:
            from hw.chip.model import model_engine_macs_per_token, model_in_layout, model_out_layout
            self.in_layout, self.out_layout = model_in_layout(cfg), model_out_layout(cfg)
            self.engine_macs = model_engine_macs_per_token(cfg)
            self.engine_macs_at = lambda pos: model_engine_macs_per_token(cfg, pos)
        else:
            self.in_layout, self.out_layout = token_in_layout(cfg), token_out_layout(cfg)
            self.engine_macs = engine_macs_per_token(cfg)
            self.engine_macs_at = lambda pos: self.engine_macs
        from hw.mla.cache import mla_layers
        # the MLA layers' latent cache, a second memory in the sim top (sim/hdl/layer_sim.py)
        self.mems = ("mem", "cmem") if mla_layers(cfg) else ("mem",)

    def item(self, x, first, slot=0) -> dict:
        if self.model:
            return {"token": int(x), "first": int(first), **({"slot": int(slot)} if self.slots > 1 else {})}
        return {"x": [int(v) for v in x], "first": int(first)}

    def value(self, item) -> list[int]:
        if self.model:
            return [int(item["token"]), int(item["logit"])]
        return [int(v) for v in item["y"]]
STALL = {"source": 0.3, "sink": 0.4, "req": 0.2, "resp": 0.2}   # per-cycle stall probabilities
MEM_ERRORS = ("request address not aligned to the port", "request for zero beats", "read beyond the image")


class Wishbone:
    """Classic-cycle initiator on the chip's ``bus__*`` pins."""

    def __init__(self, dut):
        self.dut = dut
        self.lock = Lock()      # the output sink reads TOKEN_CYCLES while the stream writes CLEAR
        for s in ("cyc", "stb", "we", "adr", "dat_w", "sel"):
            getattr(dut, f"bus__{s}").value = 0

    async def _access(self, adr: int, we: int, value: int = 0) -> int:
        async with self.lock:
            return await self._cycle(adr, we, value)

    async def _cycle(self, adr: int, we: int, value: int) -> int:
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
    xs, first, clears, want = np.array(z["xs"]), z["first"], z["clears"], z["want"]
    reset_at, abandon, stall = int(z["reset_at"]), int(z["abandon"]), bool(z["stall"])
    # tokens after whose output TOKEN_CYCLES is read (a bus read each: only those asked for)
    record_token_cycles = z["token_cycles"] if "token_cycles" in z.files else np.zeros(len(xs), bool)
    T = len(xs)
    feedback_from = int(z["feedback_from"]) if "feedback_from" in z.files else 0
    if feedback_from and reset_at >= 0:
        raise ValueError("feedback_from: a generating run has no reset")
    rng = random.Random(int(z["seed"]))
    problems: list[str] = []
    io = ChipIO(cfg)
    in_codec, out_codec = LayoutCodec(io.in_layout), LayoutCodec(io.out_layout)
    # the model chip's logits stream: read (CTRL.LOGITS set) when the case has the model's logits
    want_logits = z["want_logits"] if "want_logits" in z.files else None
    RUN = CTRL_RUN | (CTRL_LOGITS if want_logits is not None else 0)

    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
    # reset before anything samples the outputs: at gate level the flip-flops start as X
    dut.rst.value = 1
    for s in ("i__valid", "o__ready", *(f"{mem}_{c}" for mem in io.mems for c in ("wr_en", "wr_clk", "slot"))):
        getattr(dut, s).value = 0
    pb = cfg.hw.weight_port_bytes
    image = bytes(z["image"])
    bad_images = [(bytes(b), int(e)) for b, e in zip(z["bad_images"], z["bad_errors"])] \
        if "bad_images" in z.files else []

    async def write_image(slot: int, data: bytes):
        """The memory's slot ``slot`` := data, one port word per edge of the memory's own write
        clock, 2 ps each: well inside one chip clock cycle, so the chip runs no cycle meanwhile."""
        words = len(data) // pb
        dut.mem_wr_en.value = 1
        for w in range(words):
            dut.mem_wr_addr.value = slot * words + w
            dut.mem_wr_data.value = int.from_bytes(data[w * pb:(w + 1) * pb], "little")
            await Timer(1, unit="ps")
            dut.mem_wr_clk.value = 1
            await Timer(1, unit="ps")
            dut.mem_wr_clk.value = 0
        dut.mem_wr_en.value = 0

    # the good image goes into slot 0 while the chip is held in reset
    await write_image(0, image)
    # the memories' stalls (HDL, per cycle; the cache memory's writes too); each random
    # generator is seeded once
    for mem in io.mems:
        getattr(dut, f"{mem}_req_stall").value = round(256 * STALL["req"]) if stall else 0
        getattr(dut, f"{mem}_resp_stall").value = round(256 * STALL["resp"]) if stall else 0
        getattr(dut, f"{mem}_seed").value = rng.randrange(1, 1 << 32)
        getattr(dut, f"{mem}_seed_load").value = 1
    await ClockCycles(dut.clk, 2)
    for mem in io.mems:
        getattr(dut, f"{mem}_seed_load").value = 0
    bus = Wishbone(dut)

    S = io.slots
    # each token's sequence slot (several: the chip keeps one token of each inside); an output
    # belongs to the oldest token of its slot without one
    slot_of = np.array(z["slots"]) if "slots" in z.files else np.zeros(T, np.int64)
    prev_in_slot = np.full(T, -1)
    last = {}
    for t in range(T):
        prev_in_slot[t] = last.get(int(slot_of[t]), -1)
        last[int(slot_of[t])] = t

    def token(t):
        return io.item(xs[t], first[t], slot_of[t])

    idx: list[int] = []         # input index of each output taken, as the bench counts them
    tags: list[int] = []        # the chip's tag of each output (its position in its sequence)
    outputs: list[list[int]] = []
    out_cycles: list[int] = []  # clock cycle at which each output was collected
    token_cycles: list[tuple[int, int]] = []  # (token, TOKEN_CYCLES read after its output)
    seg = {"base": 0, "sent_base": 0}   # the current segment (since the last reset)
    by_index: dict[int, list[int]] = {}
    slot_outs: list[int] = []  # the slot of each output (several slots)

    def slot_queues(base):
        """Per slot, the tokens from ``base`` on waiting for their output, oldest first."""
        return {s: deque(t for t in range(base, T) if slot_of[t] == s) for s in range(S)}
    queue = slot_queues(0)
    failed = Event()
    failure: list[str] = []

    def on_output(item):
        y = io.value(item)
        tags.append(int(item["seq"]))
        s_out = int(item["slot"]) if S > 1 else 0
        if S > 1:
            slot_outs.append(s_out)
        t = queue[s_out].popleft() if queue.get(s_out) else T
        by_index[t] = y
        idx.append(t)
        outputs.append(y)
        out_cycles.append(int(get_sim_time(unit="ns")) // CLOCK_NS)
        if len(idx) % 256 == 0:
            dut._log.info(f"{len(idx)} output tokens")
        if t >= T:
            failure.append(f"output {len(idx)} has no input (index {t})")
        elif y != [int(v) for v in np.atleast_1d(want[t])]:
            failure.append(f"token {t}: first wrong output")
        if failure:
            failed.set()
        elif record_token_cycles[t]:
            cocotb.start_soon(read_token_cycles(t))

    async def read_token_cycles(t):
        token_cycles.append((t, await bus.read("TOKEN_CYCLES")))

    src = EdgeStreamSource(dut, "i", dut.clk, in_codec, rng, CLOCK_NS, stall=STALL["source"] if stall else 0.0)
    sink = EdgeStreamSink(dut, "o", dut.clk, out_codec, rng, CLOCK_NS,
                          backpressure=STALL["sink"] if stall else 0.0, on_item=on_output)
    src.start()
    sink.start()
    trace_file = os.environ.get("LAYER_TRACE")
    if trace_file:
        # a debugging aid, off by default (it wakes every cycle): each weight request the chip
        # issues, as "cycle addr beats", and each cycle the port carries a beat, to a text file
        async def trace_port():
            with open(trace_file, "w") as f:
                while True:
                    await RisingEdge(dut.clk)
                    cyc = int(get_sim_time(unit="ns")) // CLOCK_NS
                    if int(dut.chip__wport__req__valid.value) and int(dut.chip__wport__req__ready.value):
                        word = int(dut.chip__wport__req__payload.value)
                        f.write(f"R {cyc} {word & 0xFFFF_FFFF:#x} {word >> 32}\n")
                    if int(dut.chip__wport__resp__valid.value) and int(dut.chip__wport__resp__ready.value):
                        f.write(f"B {cyc}\n")
        cocotb.start_soon(trace_port())
    logits: list[tuple[int, int]] = []
    if io.model:
        from hw.chip.head import logit_layout
        lsink = EdgeStreamSink(dut, "logits", dut.clk, LayoutCodec(logit_layout(cfg)), rng, CLOCK_NS,
                               backpressure=STALL["sink"] if stall and want_logits is not None else 0.0,
                               on_item=lambda it: logits.append((int(it["index"]), int(it["value"]))))
        lsink.start()

    async def reset():
        dut.rst.value = 1
        await ClockCycles(dut.clk, 3)
        await FallingEdge(dut.clk)
        dut.rst.value = 0

    def check_memory(when: str):
        for mem, name in zip(io.mems, ("weight memory", "cache memory")):
            err = int(getattr(dut, f"{mem}_error").value)
            for bit, what in enumerate(MEM_ERRORS):
                if err >> bit & 1:
                    problems.append(f"{name} {when}: {what}")

    async def stream(lo, hi):
        """Send tokens lo..hi-1, writing CTRL.CLEAR (after the previous token was taken: the
        caller has waited for token lo-1) before every token marked in ``clears``, ``lo``
        included; returns when all were taken."""
        t = lo
        while t < hi:
            if clears[t] and t > 0:
                await bus.write("CTRL", RUN | CTRL_CLEAR)
            end = next((c for c in range(t + 1, hi) if clears[c]), hi)
            src.send([token(k) for k in range(t, end)])
            await src.wait_sent(end - seg["sent_base"])
            t = end

    async def load(slot: int, run: int) -> tuple[int, int, int]:
        """LOAD the image in ``slot``; returns (STATUS, LOAD_ERRORS, LOAD_CYCLES) after it."""
        dut.mem_slot.value = slot
        await bus.write("CTRL", run | CTRL_LOAD)
        for _ in range(4 * len(image) // pb + 1000):     # bounded: a LOAD that never ends fails
            status = await bus.read("STATUS")
            if not status & STATUS["LOADING"]:
                break
        else:
            raise AssertionError("LOAD did not finish")
        return status, await bus.read("LOAD_ERRORS"), await bus.read("LOAD_CYCLES")

    async def load_good(run: int):
        status, errors, cycles = await load(0, run)
        if errors or not status & STATUS["LOADED"]:
            problems.append(f"LOAD of the good image: STATUS {status:#x}, LOAD_ERRORS {errors:#x}")
        load_cycles.append(cycles)

    load_cycles: list[int] = []

    async def body():
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
        await ClockCycles(dut.clk, 20)
        if src.sent:
            problems.append("the chip took a token with CTRL.RUN clear")
        await bus.write("CTRL", RUN)
        await ClockCycles(dut.clk, 20)
        if src.sent:
            problems.append("the chip took a token before a LOAD")
        for bad, want_errors in bad_images:
            await FallingEdge(dut.clk)     # the writes fit between two chip clock edges
            await write_image(1, bad)
            status, errors, _ = await load(1, RUN)
            await ClockCycles(dut.clk, 20)
            if errors != want_errors or status & STATUS["LOADED"] or not status & STATUS["LOAD_ERROR"]:
                problems.append(f"LOAD of a damaged image: STATUS {status:#x}, LOAD_ERRORS {errors:#x} "
                                f"(expected {want_errors:#x})")
            if src.sent:
                problems.append("the chip took a token after a refused LOAD")
        await load_good(RUN)
        await src.wait_sent(1)
        # MACS is counted from the engines' beats, not per token delivered: once the first
        # token's projections are under way (after its RMSNorm) it is above zero while TOKENS
        # is still zero; polled every 50 cycles until then
        for _ in range(cycle_limit(roofline_cycles(cfg), 1) // 50):
            await ClockCycles(dut.clk, 50)
            macs, tokens_out = await bus.read("MACS"), await bus.read("TOKENS")
            if tokens_out or macs:
                break
        if tokens_out or not 0 < macs <= io.engine_macs:
            problems.append(f"MACS = {macs} with TOKENS = {tokens_out}: no MAC counted while the first "
                            f"token was inside (one token is {io.engine_macs})")
        seg_end = T if reset_at < 0 else reset_at
        if feedback_from > 0:
            # generation (model chip): from token ``feedback_from`` on, the input is the chip's
            # own output for the token before it in its slot, sent once that output is out
            await stream(1, feedback_from)
            for t in range(feedback_from, T):
                while prev_in_slot[t] not in by_index:
                    await sink.wait_items(len(sink.items) + 1)
                xs[t] = by_index[prev_in_slot[t]][0]
                src.send([token(t)])
                await src.wait_sent(t + 1)
        else:
            await stream(1, seg_end)
        await sink.wait_items(seg_end)
        if reset_at >= 0:
            # tokens reset_at.. are sent and the chip is reset with them inside
            resumed = reset_at + abandon
            await stream(reset_at, resumed)
            await ClockCycles(dut.clk, rng.randrange(10, 300))
            check_memory("before the reset")
            src.flush()
            await reset()          # the memory in the sim top is reset with the chip: nothing in flight
            sink.restart()
            if io.model:
                lsink.restart()
            await ClockCycles(dut.clk, 2)
            # outputs that made it out before the reset are recorded; start over at ``resumed``
            sink.items.clear()
            seg.update(base=resumed, sent_base=resumed)
            queue.clear()
            queue.update(slot_queues(resumed))
            src.sent.clear()
            await bus.write("CTRL", RUN)
            # the first token after the reset must start a new sequence by itself
            first[resumed] = False
            src.send([token(resumed)])
            await ClockCycles(dut.clk, 20)
            if src.sent:
                problems.append("the chip took a token after a reset before a LOAD")
            await load_good(RUN)
            await src.wait_sent(1)
            await stream(resumed + 1, T)
            await sink.wait_items(T - resumed)
        # nothing more may come out
        await ClockCycles(dut.clk, 200)
        if len(sink.items) != T - seg["base"]:
            problems.append(f"{len(sink.items) - (T - seg['base'])} extra output tokens after the last input")

    # a bound so a hung chip ends the run, from the config: the tokens' limit from the roofline
    # (the abandoned tokens of a reset run twice), each LOAD (the good ones and the refused ones)
    # four times the image's beats, and the bench's own fixed waits (CSR reads, the settling
    # gaps above: under 1000 cycles)
    tokens = T + (abandon if reset_at >= 0 else 0)
    loads = 2 + len(bad_images)
    bound = roofline_cycles(cfg)
    limit_cycles = cycle_limit(bound, tokens) + loads * 4 * len(image) // pb + 1000
    start_ns = get_sim_time(unit="ns")
    task = cocotb.start_soon(body())
    await First(task, failed.wait(), Timer(limit_cycles * CLOCK_NS, unit="ns"))
    used = int(get_sim_time(unit="ns") - start_ns) // CLOCK_NS
    if not task.done():
        task.cancel()
        if not failure:
            failure.append(over_limit("model chip" if io.model else "layer chip", len(idx), T, used, limit_cycles, bound,
                                      f" + {loads} LOADs x 4 x the image's beats + 1000 for the bench's waits"))
            problems.append(failure[-1])    # for the driver's report: the run ended here
    dut._log.info(f"cycles used {used} of limit {limit_cycles}")
    counters = {}
    if not failure:
        await ClockCycles(dut.clk, 20)      # a TOKEN_CYCLES read still in flight
        status = await bus.read("STATUS")
        if status & 1:
            problems.append(f"STATUS.BUSY set after the last token (STATUS {status:#x})")
        counters = {name: await bus.read(name) for name in (*COUNTERS, "MACS_PER_TOKEN", *(STAGE_COUNTERS if io.model else ()))}
        seg_tokens = T - seg["base"]
        if counters["TOKENS"] != seg_tokens:
            problems.append(f"TOKENS = {counters['TOKENS']}, {seg_tokens} outputs taken since reset")
        engine_macs = io.engine_macs
        # per token at its sequence position (an MLA layer's scores grow with it)
        seg_macs = sum(io.engine_macs_at(tg) for i, tg in zip(idx, tags) if i >= seg["base"]) \
            if io.model else seg_tokens * engine_macs
        if counters["MACS"] != seg_macs & 0xFFFF_FFFF:
            problems.append(f"MACS = {counters['MACS']} != {seg_macs}, the engines' beats of the {seg_tokens} tokens "
                            f"(MACS_PER_TOKEN {counters['MACS_PER_TOKEN']} + "
                            f"{engine_macs - counters['MACS_PER_TOKEN']} padding lanes at position 0)")
        served = int(dut.mem_bytes.value)
        if counters["WEIGHT_BYTES"] != served & 0xFFFF_FFFF:
            problems.append(f"WEIGHT_BYTES = {counters['WEIGHT_BYTES']}, the memory served {served}")
        if served != int(dut.mem_beats.value) * cfg.hw.weight_port_bytes:
            problems.append(f"the memory's byte and beat counters disagree")
        counters["MEMORY_BYTES"] = served
        counters["MEMORY_REQUESTS"] = int(dut.mem_requests.value)
        check_memory("at the end")
    problems += sink.problems
    if not token_cycles:
        token_cycles = [(T - 1, counters.get("TOKEN_CYCLES", 0))]
    np.savez(os.environ["LAYER_RESULT"], idx=np.array(idx, np.int64), tags=np.array(tags, np.int64),
             got=np.array(outputs, np.int64).reshape(len(idx), *want.shape[1:]),
             logits=np.array(logits, np.int64).reshape(len(logits), 2),
             counter_names=np.array(list(counters), dtype=str),
             counter_values=np.array(list(counters.values()), np.int64),
             token_cycles=np.array([c for _, c in token_cycles], np.int64),
             token_cycles_idx=np.array([t for t, _ in token_cycles], np.int64),
             out_cycles=np.array(out_cycles, np.int64),
             load_cycles=np.array(load_cycles, np.int64),
             bench_problems=np.array(problems, dtype=str),
             **({"slots": np.array(slot_outs, np.int64)} if S > 1 else {}))
    assert not failure and not problems, (failure or problems)[0]
