"""cocotb bench of the embedding lookup (hw/chip/embed.py) against the integer model.

Run through sim/tests/block/test_embed.py (sim/cocotb_util.run_cocotb, top ``embed``).  The table
is the quick quantised model's (model/cases.py) with its last row set to the int8
corners (-128, 127, -1, 0, 1, ...), in the model's image (model/image.py) as the weight
memory (sim/cocotb/weight_memory.py: latency, random stalls).  Expected values come only
from model/int_model.py ``int_embed``; ``first`` must come out with its token.  Every
request must be the token's row: ``embedding.addr + token * row_bytes``, beats_per_row beats.
Parameters (environment, cocotb_util.tb_param): MOEKDA_CONFIG, MOEKDA_SEED, MOEKDA_TOKENS.
"""
from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge

from hw.chip.embed import token_id_layout
from hw.chip.layer import token_in_layout
from hw.image.memory_map import memory_map
from sim.cocotb.bench import BlockBench
from sim.cocotb.streams import LayoutCodec
from sim.cocotb.weight_memory import WeightMemory
from sim.cocotb_util import tb_param
CORNERS = (-128, 127, -1, 0, 1)


def embed_case(config: str, seed: int, n: int):
    """(cfg, model, image, tokens, firsts): the last row holds the int8 corners; the tokens
    start with 0, V-1 (that row) and V-1 again, then random ids; ``first`` on token 0 and at
    random."""
    from model.image import qmodel_image
    from model.cases import model_config, quick_model
    cfg = model_config(config)
    _, qm = quick_model(cfg, seed)
    V, d = cfg.model.vocab, cfg.model.d_model
    qm.head.emb[V - 1] = np.resize(np.array(CORNERS), d)
    rng = np.random.default_rng(seed)
    tokens = np.concatenate([[0, V - 1, V - 1], rng.integers(0, V, max(0, n - 3))])[:n]
    firsts = np.concatenate([[1], rng.integers(0, 2, n - 1)])
    return cfg, qm, qmodel_image(cfg, qm), tokens.astype(int), firsts.astype(int)


class Bench(BlockBench):
    def __init__(self, dut, seed: int, n: int, stall: float):
        from model.int_model import int_embed
        super().__init__(dut, seed)
        self.cfg, self.qm, self.image, self.tokens, self.firsts = embed_case(tb_param("config"), seed, n)
        self.want = [([int(v) for v in int_embed(self.qm.head, self.cfg, t)], int(f))
                     for t, f in zip(self.tokens, self.firsts)]
        self.region = memory_map(self.cfg)["embedding"]
        self.pb = self.cfg.hw.weight_port_bytes
        self.driver = self.stream_driver("i", LayoutCodec(token_id_layout(self.cfg)), stall)
        self.out_codec = LayoutCodec(token_in_layout(self.cfg))
        self.mem = self.sink = None

    def setup(self):
        self.start_streams(self.driver)

    def streams(self, mem_stall: float, backpressure: float, seed: int):
        self.mem = WeightMemory(self.dut, self.image, self.pb, self.cfg.hw.weight_port_latency,
                                req_stall=mem_stall, resp_stall=mem_stall, seed=seed).start()
        self.sink = self.stream_sink("o", self.out_codec, backpressure)

    def send(self):
        self.driver.send([{"token": int(t), "first": int(f)} for t, f in zip(self.tokens, self.firsts)])

    async def wait_out(self, n: int, what: str) -> int:
        bound = self.region.row_beats + self.cfg.hw.weight_port_latency   # a row and the latency
        return await self.wait_for(self.sink.items, n, bound, f"embedding {what}")

    def check(self, what: str, done: int | None = None):
        got = [(it["x"], it["first"]) for it in self.sink.items]
        want = self.want[:done]
        for t, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"{what}: token {t} (id {self.tokens[t]}): (x, first) {g}, model {w}"
        assert len(got) == len(want), f"{what}: {len(got)} outputs for {len(want)} tokens"
        assert not self.sink.problems, self.sink.problems[0]
        reqs = [(self.region.row_addr(int(t)), self.region.row_beats) for t in self.tokens]
        log = self.mem.counters.log
        assert log == reqs[:len(log)] and len(log) >= len(want), f"{what}: requests {log[:4]}, rows {reqs[:4]}"


@cocotb.test()
async def embed_bit_exact_with_stalls(dut):
    """Stalls on every port, back-pressure on ``o``; a first pass is cut by a reset while a row
    is being read, then every token runs again from the start."""
    seed = tb_param("seed", 1, int)
    tb = Bench(dut, seed, tb_param("tokens", 24, int), stall=0.3)
    assert (np.array(tb.want[1][0]) == np.resize(np.array(CORNERS), tb.cfg.model.d_model)).all()
    await tb.start()
    tb.streams(0.3, 0.3, seed + 1)
    tb.send()
    await tb.wait_out(3, "first pass")
    beats0 = tb.mem.counters.beats
    while tb.mem.counters.beats == beats0:        # a row on its way
        await RisingEdge(dut.clk)
    tb.mem.stop()
    tb.driver.flush()
    tb.sink._task.cancel()
    done = len(tb.sink.items)
    tb.check("before the reset", done=done)
    await tb.reset(tb.rng.randrange(1, 4))
    assert len(tb.sink.items) == done
    tb.streams(0.3, 0.3, seed + 2)
    tb.send()
    await tb.wait_out(len(tb.tokens), "main pass")
    await ClockCycles(dut.clk, 60)                # anything more would be extra
    tb.check("main pass")


@cocotb.test()
async def embed_no_stalls(dut):
    """Back to back without stalls: one row per token, the cycles per token measured."""
    seed = tb_param("seed", 1, int) + 5
    tb = Bench(dut, seed, 8, stall=0.0)
    await tb.start()
    tb.streams(0.0, 0.0, seed)
    tb.send()
    cycles = await tb.wait_out(len(tb.tokens), "no stalls")
    await ClockCycles(dut.clk, 30)
    tb.check("no stalls")
    per = cycles / len(tb.tokens)
    nb, lat = tb.region.row_beats, tb.cfg.hw.weight_port_latency
    # hw/chip/embed.py: the row's beats, the memory latency, the request and the output hand-over
    # (the next token's address is computed while a row streams)
    assert per <= nb + lat + 4, f"{per:.1f} cycles per token for {nb} beats and latency {lat}"
    dut._log.info(f"no stalls: {per:.1f} cycles per token ({nb} beats, latency {lat})")
