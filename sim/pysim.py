"""The Amaranth simulator set-up every block test shares: the DUT, its clock, the
testbenches and processes, run to the end (or for a number of clock cycles).

The period is simulation time only: a block test counts cycles, never nanoseconds.
"""
from __future__ import annotations

from amaranth.sim import Simulator

from sim.cocotb.clocking import CLOCK_NS

PERIOD_S = CLOCK_NS * 1e-9          # the cocotb benches' period (any would do)


def simulate(dut, *testbenches, processes=(), background=(), period_s: float = PERIOD_S,
             cycles: int | None = None) -> Simulator:
    """Simulate ``dut`` with its clock; ``testbenches`` run to their end, ``background`` ones
    (a memory model, a responder) stop with them, ``processes`` watch every cycle.
    ``cycles``: run exactly that many clock periods instead (for benches that never end)."""
    sim = Simulator(dut)
    sim.add_clock(period_s)
    for tb in testbenches:
        sim.add_testbench(tb)
    for tb in background:
        sim.add_testbench(tb, background=True)
    for p in processes:
        sim.add_process(p)
    if cycles is None:
        sim.run()
    else:
        sim.run_until(period_s * cycles)
    return sim
