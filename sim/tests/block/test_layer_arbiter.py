"""The weight arbiter (hw/chip/weight_arbiter.py) with all ports busy at once.

In the layer chip the KDA and MoE units take turns, so the end-to-end tests
never make the arbiter choose between two requests or interleave two ports'
responses.  Here several requesters issue random reads at the same time with
random stalls everywhere (requests, memory acceptance, response valid, each
port's response ready), in Amaranth's simulator, and every port must get
exactly the beats of its own requests, in order; the request the memory sees
must not change while it is offered (the stream rule).

The model chip's arbiter (``priority``, ``chunk``): the same, plus every piece the memory
sees is at most ``chunk`` beats, at most ``ahead`` pieces are in flight, and no piece of a
lower port goes down while port 0 has had beats waiting since before the previous piece
(fixed priority, one registered grant of delay).
"""
from __future__ import annotations

import random
from collections import deque

import pytest

from hw.chip.weight_arbiter import WeightArbiter
from sim.pysim import simulate

PB = 4


def _beat_data(addr: int) -> int:
    return (addr // PB * 2654435761) & 0xFFFF_FFFF     # a distinct word per address


def _run(n_ports: int, depth: int, seed: int, n_requests: int = 24, chunk: int = 0, ahead: int = 2,
         max_beats: int = 5):
    rng = random.Random(seed)
    dut = WeightArbiter(PB, n_ports, depth=depth, priority=bool(chunk), chunk=chunk, ahead=ahead)
    reqs = [[(rng.randrange(0, 4096 // PB) * PB + 8192 * p, rng.randrange(1, max_beats + 1))
             for _ in range(n_requests)] for p in range(n_ports)]
    unsent = [0] * n_ports           # beats a port's taken requests still have to send down
    since = [None] * n_ports         # cycle from which a port has had beats waiting
    prev_go = -1
    want = [[_beat_data(a + b * PB) for a, n in rs for b in range(n)] for rs in reqs]
    got = [[] for _ in range(n_ports)]
    errors = []

    async def bench(ctx):
        sent = [0] * n_ports
        mem_q = deque()                 # [addr, beats_left, ready_cycle]
        offered_req = None
        offered_resp = None
        for cycle in range(4000):
            for p in range(n_ports):
                up = dut.up[p]
                has = sent[p] < len(reqs[p])
                # a requester's valid stays up once raised (the stream rule)
                if has and (ctx.get(up.req.valid) or rng.random() < 0.15):
                    a, n = reqs[p][sent[p]]
                    ctx.set(up.req.valid, 1)
                    ctx.set(up.req.payload.addr, a)
                    ctx.set(up.req.payload.beats, n)
                else:
                    ctx.set(up.req.valid, 0)
                ctx.set(up.resp.ready, rng.random() < 0.6)
            ctx.set(dut.down.req.ready, len(mem_q) < 6 and rng.random() < 0.7)
            if offered_resp is None and mem_q and mem_q[0][2] <= cycle and rng.random() < 0.8:
                offered_resp = _beat_data(mem_q[0][0])
            ctx.set(dut.down.resp.valid, offered_resp is not None)
            ctx.set(dut.down.resp.payload.data, offered_resp or 0)

            # sample the handshakes (combinational paths settled)
            for p in range(n_ports):
                up = dut.up[p]
                if ctx.get(up.req.valid) and ctx.get(up.req.ready):
                    if unsent[p] == 0:
                        since[p] = cycle
                    unsent[p] += reqs[p][sent[p]][1]
                    sent[p] += 1
                if ctx.get(up.resp.valid) and ctx.get(up.resp.ready):
                    got[p].append(ctx.get(up.resp.payload.data))
            dv, dr = ctx.get(dut.down.req.valid), ctx.get(dut.down.req.ready)
            payload = (ctx.get(dut.down.req.payload.addr), ctx.get(dut.down.req.payload.beats))
            if offered_req is not None and (not dv or payload != offered_req):
                errors.append(f"cycle {cycle}: request {offered_req} withdrawn or changed to {payload}")
            offered_req = payload if dv and not dr else None
            if dv and dr:
                mem_q.append([payload[0], payload[1], cycle + 2])
                port = payload[0] // 8192
                if chunk:
                    if payload[1] > chunk:
                        errors.append(f"cycle {cycle}: a piece of {payload[1]} beats (chunk {chunk})")
                    if len(mem_q) > ahead:
                        errors.append(f"cycle {cycle}: {len(mem_q)} pieces in flight (ahead {ahead})")
                    if port > 0 and unsent[0] and since[0] < prev_go:
                        errors.append(f"cycle {cycle}: port {port} served while port 0 waited since {since[0]}")
                unsent[port] -= payload[1]
                prev_go = cycle
            if offered_resp is not None and ctx.get(dut.down.resp.ready):
                head = mem_q[0]
                head[0] += PB
                head[1] -= 1
                if head[1] == 0:
                    mem_q.popleft()
                offered_resp = None
            await ctx.tick()
            if all(len(g) == len(w) for g, w in zip(got, want)) and not mem_q:
                break

    simulate(dut, bench)
    assert not errors, errors[:3]
    for p in range(n_ports):
        assert got[p] == want[p], f"port {p}: {len(got[p])} beats received, {len(want[p])} wanted, or wrong data"


@pytest.mark.parametrize("n_ports,depth,seed", [(2, 8, 1), (2, 8, 4), (2, 1, 2), (3, 4, 3)])
def test_arbiter_routes_every_beat_to_its_port(n_ports, depth, seed):
    _run(n_ports, depth, seed)


@pytest.mark.parametrize("n_ports,chunk,ahead,seed", [(5, 4, 2, 1), (3, 3, 1, 2), (5, 8, 2, 3), (2, 1, 2, 4)])
def test_chunked_priority_arbiter(n_ports, chunk, ahead, seed):
    """The model chip's mode: long requests cut into pieces, fixed priority by port."""
    _run(n_ports, 8, seed, n_requests=16, chunk=chunk, ahead=ahead, max_beats=20)
