"""Where the pipeline registers go: a delay budget per clock period.

Pipelined datapaths in hw/ are written as a chain of operations, each with
an estimated delay.  ``Pipe`` adds up the delays since the last register and
inserts a register stage (for every value still live) just before an
operation that would overflow the budget.  The budget is the clock period
minus the flip-flop overhead, so the depth of every pipeline FOLLOWS FROM
THE CLOCK in the config; nothing in the RTL names a stage count.

The delays are Nangate45 typical-corner numbers measured with Yosys
(``abc -constr``, driver BUF_X1, load 3.898) and OpenSTA on the small
registered probe circuits of hw/arith/delay_probes.py; docs/matvec.md has the
command that repeats the measurement.  They are estimates for
planning: the real check is the synthesis timing report of the whole engine.
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Signal, Value


@dataclass(frozen=True)
class GateDelays:
    """Planning delays in ns, one per kind of operation the datapaths use."""
    reg_overhead: float     # DFF_X1 clock-to-Q + setup, plus margin for clock and wire load
    csa_level: float        # one level of 3:2 carry-save compressors (XOR3 + majority)
    booth_select: float     # radix-4 Booth digit decode and partial-product select/invert
    adder_base: float       # carry-propagate adder of n bits: base + per_bit * n (ABC maps even a
    adder_per_bit: float    # Kogge-Stone network to near-ripple chains: linear is what we measured)
    mux_level: float        # one level of a barrel shifter (MUX2 with fan-out)
    saturate: float         # overflow test of the high bits and the clamp mux

    def adder(self, bits: int) -> float:
        return self.adder_base + self.adder_per_bit * bits


# Logic delays on Nangate45 typical, from the probes of hw/arith/delay_probes.py
# through `moekda synth` (reg-to-reg period 1/Fmax minus the 0.152 ns of a
# flop-to-flop wire):  3:2 level 0.10 (one level), 0.113/level (four);
# Booth select 8x8 into 20-bit words 0.26; barrel shift of 49 bits by 6
# 0.47 (0.078/level); int8 saturation of 49 bits 0.37; adders of
# 8/16/32/64 bits 0.37/0.61/0.99/1.50.
# ABC maps every adder, even the Kogge-Stone network written out in
# carry_save.prefix_add, to near-ripple chains of AOI21/OAI21, and inside the
# whole engine they came out slower than alone (a 36-bit chunk took 1.19 ns
# in the first tiny engine), so the adder model is linear and pessimistic.
# The overhead is the 0.152 ns wire path plus 0.05 ns for ABC spending slack
# on area (it maps to the clock period, not to period minus flop overhead).
NANGATE45 = GateDelays(
    reg_overhead=0.20,
    csa_level=0.12,
    booth_select=0.26,
    adder_base=0.15,
    adder_per_bit=0.035,
    mux_level=0.08,
    saturate=0.37,
)


@dataclass(frozen=True)
class PipelinePlan:
    """The logic delay allowed between two registers, and the delay table."""
    budget_ns: float
    delays: GateDelays

    def adder_chunk_bits(self) -> int:
        """Widest carry-propagate adder that fits one stage (at least 2 bits)."""
        d = self.delays
        return max(2, int((self.budget_ns - d.adder_base) / d.adder_per_bit))


def plan_pipeline(clock_period_ns: float, delays: GateDelays = NANGATE45) -> PipelinePlan:
    """Budget per stage = period - flip-flop overhead; at least one operation must fit."""
    budget = clock_period_ns - delays.reg_overhead
    widest = max(delays.csa_level, delays.booth_select, delays.adder(2), delays.mux_level, delays.saturate)
    if budget < widest:
        raise ValueError(f"hw.clock_period_ns = {clock_period_ns}: too short for this library; "
                         f"at least {widest + delays.reg_overhead:.2f} ns is needed")
    return PipelinePlan(budget_ns=budget, delays=delays)


class Pipe:
    """Inserts pipeline registers into a chain of operations by delay budget.

    ``live`` is a dict of the values an operation needs and everything that
    must travel alongside it; ``spend(cost, live)`` returns it unchanged when
    ``cost`` still fits in the current stage, otherwise registered.  Keys in
    ``resettable`` (valid bits) get a synchronous reset; data registers are
    reset-less, which saves a gate per bit: after reset their content is
    don't-care because no valid bit points at it.

    The one rule: after ``live = pipe.spend(...)``, read operands only from
    the returned ``live``.  A value computed before the call may now be a
    cycle older than its neighbours.
    """

    def __init__(self, m, plan: PipelinePlan, name: str, resettable=("valid",)):
        self.m = m
        self.plan = plan
        self.name = name
        self.resettable = set(resettable)
        self.used = 0.0
        self.stages = 0
        self.levels = 0   # compressor levels built so far, for signal names

    def spend(self, cost: float, live: dict) -> dict:
        if self.used > 0 and self.used + cost > self.plan.budget_ns:
            live = self.register(live)
        self.used += cost
        return live

    def register(self, live: dict) -> dict:
        """A register stage for every live value; returns the registered values."""
        self.stages += 1
        out = {}
        for key, value in live.items():
            if isinstance(value, list):
                out[key] = [self._reg(f"{key}{i}", v, key) for i, v in enumerate(value)]
            else:
                out[key] = self._reg(key, value, key)
        self.used = 0.0
        return out

    def _reg(self, name: str, value, key: str):
        value = Value.cast(value)
        reg = Signal(value.shape(), name=f"{self.name}_s{self.stages}_{name}",
                     reset_less=key not in self.resettable)
        self.m.d.sync += reg.eq(value)
        return reg
