"""The layer bench's HDL weight memory (sim/hdl/weight_memory.py) against the port
contract (hw/stream/weight_port.py) and the Python memory model's timing
(sim/cocotb/weight_memory.py), in Amaranth's simulator.

* stall-free: a random list of requests issued back to back gets exactly the
  image's bytes, beat after beat, in request order; the first beat of a request
  made to an idle memory comes ``latency`` cycles after its acceptance (the
  Python model's rule) and the beats of queued requests follow without a gap;
* with stalls on all four handshake signals: the same data, valid and payload
  held while a beat waits for ready, no more than ``max_outstanding`` requests
  accepted ahead of their responses, and the counters equal what was served;
* a forbidden request raises the matching error flag.
"""
from __future__ import annotations

import random
import re

import pytest

from sim.hdl.weight_memory import HdlWeightMemory
from sim.pysim import simulate

PB, LATENCY = 4, 3


def _image(n: int, seed: int) -> bytes:
    return bytes(random.Random(seed).randrange(256) for _ in range(n))


def _beat(image: bytes, addr: int) -> int:
    return int.from_bytes(image[addr:addr + PB], "little")


def _requests(image: bytes, n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    words = len(image) // PB
    out = []
    for _ in range(n):
        beats = rng.randrange(1, 7)
        out.append((rng.randrange(0, words - beats + 1) * PB, beats))
    return out


def _run(image, reqs, *, req_gap=0.0, ready_p=1.0, req_stall=0, resp_stall=0, depth=4, seed=1, cycles=3000):
    dut = HdlWeightMemory(image, PB, LATENCY, max_outstanding=depth)
    rng = random.Random(seed)
    log = {"accepted": [], "beats": [], "problems": [], "counters": None}

    async def bench(ctx):
        ctx.set(dut.req_stall, req_stall)
        ctx.set(dut.resp_stall, resp_stall)
        ctx.set(dut.seed, 0x1234_5678 + seed)
        ctx.set(dut.seed_load, 1)
        await ctx.tick()
        ctx.set(dut.seed_load, 0)
        sent, waiting = 0, None
        ends = [sum(n for _, n in reqs[:k + 1]) for k in range(len(reqs))]   # beats when request k is done
        for cycle in range(cycles):
            has = sent < len(reqs)
            if has and (ctx.get(dut.req.valid) or rng.random() >= req_gap):
                a, n = reqs[sent]
                ctx.set(dut.req.valid, 1)
                ctx.set(dut.req.payload.addr, a)
                ctx.set(dut.req.payload.beats, n)
            else:
                ctx.set(dut.req.valid, 0)
            ctx.set(dut.resp.ready, rng.random() < ready_p)
            if ctx.get(dut.req.valid) and ctx.get(dut.req.ready):
                log["accepted"].append(cycle)
                sent += 1
            if ctx.get(dut.resp.valid):
                data = ctx.get(dut.resp.payload.data)
                if waiting is not None and waiting != data:
                    log["problems"].append(f"cycle {cycle}: payload changed while waiting")
                if ctx.get(dut.resp.ready):
                    log["beats"].append((cycle, data))
                    waiting = None
                else:
                    waiting = data
            elif waiting is not None:
                log["problems"].append(f"cycle {cycle}: valid dropped before the transfer")
            outstanding = sent - sum(1 for e in ends if e <= len(log["beats"]))
            if outstanding > depth:
                log["problems"].append(f"cycle {cycle}: {outstanding} requests accepted ahead")
            await ctx.tick()
            if sent == len(reqs) and len(log["beats"]) == sum(n for _, n in reqs):
                break
        log["counters"] = (ctx.get(dut.requests), ctx.get(dut.beats), ctx.get(dut.bytes), ctx.get(dut.error))

    simulate(dut, bench)
    return log


def _want(image, reqs):
    return [_beat(image, a + b * PB) for a, n in reqs for b in range(n)]


def test_stall_free_serves_the_image_with_the_models_timing():
    image = _image(1024, 1)
    reqs = _requests(image, 40, 2)
    log = _run(image, reqs, depth=4)
    assert [d for _, d in log["beats"]] == _want(image, reqs)
    assert not log["problems"]
    # first beat: `latency` cycles after the first acceptance; then no gap while requests are queued
    cycles = [c for c, _ in log["beats"]]
    assert cycles[0] == log["accepted"][0] + LATENCY
    assert cycles == list(range(cycles[0], cycles[0] + len(cycles)))
    n_beats = len(cycles)
    assert log["counters"] == (len(reqs), n_beats, n_beats * PB, 0)


def test_an_idle_memory_answers_each_lone_request_after_latency():
    image = _image(256, 3)
    reqs = [(8, 2), (64, 1), (4, 3)]
    log = _run(image, reqs, req_gap=0.97, seed=5)
    assert [d for _, d in log["beats"]] == _want(image, reqs)
    first = 0
    for k, (_, n) in enumerate(reqs):
        c, _ = log["beats"][first]
        assert c >= log["accepted"][k] + LATENCY
        first += n


@pytest.mark.parametrize("seed,depth", [(7, 4), (8, 1), (9, 8)])
def test_stalls_everywhere_keep_data_order_and_the_stream_rule(seed, depth):
    image = _image(2048, seed)
    reqs = _requests(image, 30, seed)
    log = _run(image, reqs, req_gap=0.3, ready_p=0.6, req_stall=64, resp_stall=80, depth=depth, seed=seed,
               cycles=6000)
    assert not log["problems"], log["problems"][:3]
    assert [d for _, d in log["beats"]] == _want(image, reqs)
    n_beats = len(log["beats"])
    assert log["counters"] == (len(reqs), n_beats, n_beats * PB, 0)
    # the stalls were real: responses took longer than back to back
    assert log["beats"][-1][0] - log["beats"][0][0] > n_beats * 1.2


@pytest.mark.parametrize("req,flag", [((2, 1), 0b001), ((0, 0), 0b010), ((1020, 2), 0b100)])
def test_forbidden_requests_raise_their_error_flag(req, flag):
    image = _image(1024, 4)
    log = _run(image, [req], cycles=20)
    assert log["counters"][3] == flag


def test_zero_init_blocks_become_loops_and_others_stay():
    """sim/hdl/layer_sim.py zero_init_loops: Yosys's one-line-per-word initial block of an
    all-zero memory becomes a loop over every word (the same contents, a fraction of the
    simulator's C++); a block with a non-zero word, a gap or two memories is left alone."""
    from sim.hdl.layer_sim import zero_init_loops

    def block(*lines):
        return "  reg [31:0] mem [2:0];\n  initial begin\n" + "".join(f"    {x}\n" for x in lines) + "  end\n"
    zeros = block("mem[0] = 32'd0;", "mem[1] = 32'd0;", "mem[2] = 32'h00000000;")
    out = zero_init_loops(zeros)
    assert "initial begin" not in out and "mem[0]" not in out
    assert "zero_init_mem < 3;" in out and "mem[zero_init_mem] = 0;" in out
    for kept in (block("mem[0] = 32'd0;", "mem[1] = 32'd7;", "mem[2] = 32'd0;"),
                 block("mem[0] = 32'd0;", "mem[2] = 32'd0;"),
                 block("mem[0] = 32'd0;", "other[1] = 32'd0;")):
        assert zero_init_loops(kept) == kept


def test_the_sim_tops_weight_memory_is_one_loop():
    from moekda.config import load_config
    from sim.hdl.layer_sim import sim_top_verilog
    text = sim_top_verilog(load_config("tiny"))
    assert "zero_init_mem" in text and not re.search(r"^    mem\[\d+\] = ", text, re.M)
