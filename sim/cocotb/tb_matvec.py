"""cocotb bench of the matrix-vector engine against model/matvec.py.

Run through sim/tests/block/test_matvec.py (sim/cocotb_util.run_cocotb).  The
expected results come only from the numpy integer model; the bench never
looks inside the RTL.  Parameters (environment, see cocotb_util.tb_param):
MOEKDA_CONFIG, MOEKDA_SEED, MOEKDA_ROWS (rows per random test).
"""
from __future__ import annotations

import cocotb
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge

from hw.arith.matvec import MatVecFormats
from moekda.config import load_config
from sim.cocotb.bench import BlockBench
from sim.cocotb.streams import LayoutCodec
from sim.cocotb_util import tb_param
from model.matvec import Beat, matrix_beats, row_beats, run_beats

MAX_IDLE_CYCLES = 2000   # a result must appear within this many cycles of the previous one


class Bench(BlockBench):
    def __init__(self, dut, seed_offset: int = 0, stall: float = 0.0, backpressure: float = 0.0):
        super().__init__(dut, tb_param("seed", 1, int) * 1000 + seed_offset)
        self.cfg = load_config(tb_param("config", "tiny"))
        self.fmt = MatVecFormats.from_config(self.cfg)
        self.lanes = self.fmt.lanes
        self.driver = self.stream_driver("i", LayoutCodec(self.fmt.beat_layout()), stall)
        self.monitor = self.stream_monitor("o", LayoutCodec(self.fmt.result_layout()), backpressure)

    async def start(self):
        await super().start()
        # the streams start after the reset: the monitor draws its back-pressure from the
        # bench's random source every cycle, and the tests draw their rows from it next
        self.start_streams(self.driver, self.monitor)

    def expected(self, beats):
        return [{"y": r.y, "acc": r.acc} for r in run_beats(beats, self.fmt.acc_bits, self.fmt.out_bits)]

    async def wait_results(self, count: int):
        seen, idle = len(self.monitor.items), 0
        while len(self.monitor.items) < count:
            await RisingEdge(self.dut.clk)
            idle = 0 if len(self.monitor.items) != seen else idle + 1
            seen = len(self.monitor.items)
            assert idle < MAX_IDLE_CYCLES, f"stuck: {seen} of {count} results after {idle} idle cycles"
        await ClockCycles(self.dut.clk, 30)   # anything extra would be a duplicate
        assert len(self.monitor.items) == count, f"{len(self.monitor.items)} results, expected {count}"

    def check(self, got, want, what: str):
        for n, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"{what}: result {n}: RTL {g} != model {w}"
        assert len(got) == len(want), f"{what}: {len(got)} results, model has {len(want)}"

    # ---- stimulus -------------------------------------------------------
    def int8(self) -> int:
        # extremes are where the Booth sign handling can go wrong: weight them
        r = self.rng.random()
        if r < 0.1:
            return -128
        if r < 0.2:
            return 127
        return self.rng.randint(-128, 127)

    def scale_for(self, acc_magnitude: int) -> tuple[int, int]:
        """Random (M, s) that puts |acc| * M / 2**s near the int8 range, sometimes past it."""
        m = self.rng.randrange(1 << self.fmt.mult_bits)
        bits = max(1, (acc_magnitude * max(m, 1)).bit_length())
        s = max(0, min((1 << self.fmt.shift_bits) - 1, bits - 7 + self.rng.randint(-3, 3)))
        return m, s

    def random_rows(self, rows: int, max_len: int) -> list[Beat]:
        beats = []
        for _ in range(rows):
            length = self.rng.randint(1, max_len)
            w = [self.int8() for _ in range(length)]
            x = [self.int8() for _ in range(length)]
            m, s = self.scale_for(abs(sum(a * b for a, b in zip(w, x))) + 1)
            beats += row_beats(w, x, self.lanes, m, s)
        return beats

    def random_beat(self, first: bool, last: bool) -> Beat:
        return Beat(w=tuple(self.int8() for _ in range(self.lanes)), x=tuple(self.int8() for _ in range(self.lanes)),
                    first=first, last=last, mult=self.rng.randrange(1 << self.fmt.mult_bits),
                    shift=self.rng.randrange(1 << self.fmt.shift_bits))


@cocotb.test()
async def random_rows_with_stalls(dut):
    """Random lengths and values; random input stalls and output back-pressure."""
    tb = Bench(dut, 1, stall=0.3, backpressure=0.4)
    await tb.start()
    beats = tb.random_rows(tb_param("rows", 40, int), 4 * tb.lanes + 3)
    want = tb.expected(beats)
    tb.driver.send(beats)
    await tb.wait_results(len(want))
    tb.check(tb.monitor.items, want, "random rows")


@cocotb.test()
async def independent_first_and_last(dut):
    """first and last on any beat: running sums emitted mid-row, restarts anywhere."""
    tb = Bench(dut, 2, stall=0.2, backpressure=0.5)
    await tb.start()
    beats = [tb.random_beat(tb.rng.random() < 0.3, tb.rng.random() < 0.4) for _ in range(8 * tb_param("rows", 40, int) // 4)]
    want = tb.expected(beats)
    tb.driver.send(beats)
    await tb.wait_results(len(want))
    tb.check(tb.monitor.items, want, "framing")


@cocotb.test()
async def saturation_and_rounding_corners(dut):
    """All +127/-128 operands, clipping both ways, s = 0, large s, M = 0 and max, exact halves."""
    tb = Bench(dut, 3, stall=0.2, backpressure=0.3)
    await tb.start()
    f, lanes = tb.fmt, tb.lanes
    m_max, s_max = (1 << f.mult_bits) - 1, (1 << f.shift_bits) - 1
    long = 4 * lanes
    rows = []
    for wv, xv in ((127, 127), (-128, -128), (-128, 127), (127, -128)):
        for m, s in ((m_max, 0), (1, 0), (m_max, s_max), (m_max, f.product_bits),
                     (m_max, f.product_bits - 1), (0, 5), (1, 20), (m_max, 30)):
            for length in (1, lanes, long):
                rows.append(([wv] * length, [xv] * length, m, s))
    # exact halves: acc * M = k * 2**s + 2**(s-1) rounds up, for either sign of acc
    for acc in (-7, -5, -3, -1, 1, 3, 5, 7):
        rows.append(([acc], [1], 1, 1))
        rows.append(([acc], [1], 3, 2))
    # results exactly on the int8 limits and one past them: 127, 128, -128, -129
    rows += [([127], [1], 1, 0), ([64], [2], 1, 0), ([-128], [1], 1, 0), ([-43], [3], 1, 0)]
    beats = []
    for w, x, m, s in rows:
        beats += row_beats(w, x, lanes, m, s)
    want = tb.expected(beats)
    assert any(r["y"] == 127 for r in want) and any(r["y"] == -128 for r in want)   # the corners are hit
    tb.driver.send(beats)
    await tb.wait_results(len(want))
    tb.check(tb.monitor.items, want, "corners")


@cocotb.test()
async def reset_in_the_middle(dut):
    """Reset while beats and results are in flight: afterwards the engine is clean."""
    tb = Bench(dut, 4, stall=0.2, backpressure=0.5)
    await tb.start()
    first_part = tb.random_rows(20, 3 * tb.lanes)
    tb.driver.send(first_part)
    await ClockCycles(dut.clk, 15 + tb.rng.randrange(20))
    # producer and consumer go quiet with the engine, as in a system reset
    dut.rst.value = 1
    tb.driver.flush()
    tb.monitor.backpressure = 1.0
    await ClockCycles(dut.clk, 1 + tb.rng.randrange(3))
    before = list(tb.monitor.items)
    dut.rst.value = 0
    await ReadOnly()
    assert int(dut.o__valid.value) == 0, "a result survived reset"
    assert int(dut.i__ready.value) == 0, "ready must stay low the first cycle after reset"
    await RisingEdge(dut.clk)
    await ReadOnly()
    assert int(dut.i__ready.value) == 1, "ready must rise the second cycle after reset"
    await RisingEdge(dut.clk)
    # what came out before reset is a correct prefix of the first part
    prefix_want = tb.expected(tb.driver.sent)
    tb.check(before, prefix_want[:len(before)], "before reset")
    assert len(tb.driver.sent) < len(first_part), "reset came too late to test anything"
    # a fresh stream after reset: exactly its own results, nothing left over
    tb.monitor.items.clear()
    tb.monitor.backpressure = 0.4
    second = tb.random_rows(15, 3 * tb.lanes)
    want = tb.expected(second)
    tb.driver.send(second)
    await tb.wait_results(len(want))
    tb.check(tb.monitor.items, want, "after reset")


@cocotb.test()
async def full_throughput(dut):
    """No stalls, one-beat rows: one beat and one result per cycle, ready never drops."""
    tb = Bench(dut, 5)
    await tb.start()
    rows = 3 * tb_param("rows", 40, int) // 2
    beats = tb.random_rows(rows, tb.lanes)
    want = tb.expected(beats)
    await RisingEdge(dut.clk)
    tb.driver.send(beats)
    start = tb.driver.cycles
    while not tb.driver.idle:
        await RisingEdge(dut.clk)
    took = tb.driver.cycles - start
    assert took <= len(beats) + 1, f"{len(beats)} beats took {took} cycles: the credit window is too small"
    await tb.wait_results(len(want))
    tb.check(tb.monitor.items, want, "throughput")
