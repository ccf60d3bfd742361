"""The clock, cycle count and reset every block bench starts with (sim/cocotb/tb_*.py)."""
from __future__ import annotations

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge

# The benches' clock period: simulation time only.  A bench measures cycles, never
# nanoseconds; the chip's real clock is the config's hw.clock_period_ns (synthesis, STA).
CLOCK_NS = 10


class CycleCount:
    """Starts the clock and counts its cycles (``value``, read at the falling edge)."""

    def __init__(self, clk, period_ns: int):
        Clock(clk, period_ns, unit="ns").start()
        self.clk, self.value = clk, 0
        cocotb.start_soon(self._run())

    async def _run(self):
        while True:
            await FallingEdge(self.clk)
            self.value += 1


async def reset_pulse(dut, cycles: int = 3):
    """``rst`` high for ``cycles`` clock cycles, changed at falling edges (away from the
    edge the design samples)."""
    await FallingEdge(dut.clk)
    dut.rst.value = 1
    await ClockCycles(dut.clk, cycles)
    await FallingEdge(dut.clk)
    dut.rst.value = 0
