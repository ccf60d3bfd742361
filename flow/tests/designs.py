"""A small two-block Amaranth design for the flow's own tests: it has what a
real top has (a clock, a reset, submodules, registers, a multiplier) and
synthesises in seconds.  Not part of the accelerator."""
from __future__ import annotations

from pathlib import Path

from amaranth import Elaboratable, Module, Signal, signed
from amaranth.back import verilog


class Mac(Elaboratable):
    """acc += a * b, operands registered first."""

    def __init__(self, width: int = 8, acc_width: int = 24):
        self.a = Signal(signed(width))
        self.b = Signal(signed(width))
        self.acc = Signal(signed(acc_width))

    def elaborate(self, platform):
        m = Module()
        ra, rb = Signal.like(self.a), Signal.like(self.b)
        m.d.sync += [ra.eq(self.a), rb.eq(self.b), self.acc.eq(self.acc + ra * rb)]
        return m


class TwoMacs(Elaboratable):
    """Two MAC blocks and a little glue at the top.  The blocks see different
    operands (a*b and b*~a) so that a flat synthesis cannot merge them."""

    def __init__(self, width: int = 8):
        self.a = Signal(signed(width))
        self.b = Signal(signed(width))
        self.y = Signal(signed(24))

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac_a = mac_a = Mac()
        m.submodules.mac_b = mac_b = Mac()
        m.d.comb += [mac_a.a.eq(self.a), mac_a.b.eq(self.b), mac_b.a.eq(self.b), mac_b.b.eq(~self.a)]
        m.d.sync += self.y.eq(mac_a.acc ^ mac_b.acc)
        return m


def write_two_macs(path: Path, top: str = "two_macs") -> Path:
    d = TwoMacs()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(verilog.convert(d, name=top, ports=[d.a, d.b, d.y]))
    return path
