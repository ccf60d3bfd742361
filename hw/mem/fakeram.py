"""The platform's 1RW SRAM macros (ORFS Nangate45 ``fakeram45_<words>x<bits>``): one table,
a behavioural model, and the black-box instance synthesis sees.

The macros are LEF abstracts plus Liberty timing models (pdk/nangate45/lef, lib); there
is no netlist behind them.  What they do, from the Liberty file (``memory()``,
``memory_read``/``memory_write``, every input ``setup_rising``/``hold_rising`` on clk,
``rd_out`` a ``rising_edge`` arc from clk) and ORFS's behavioural Verilog of the same
macros:

* one port, everything sampled on the rising edge of ``clk``;
* ``ce_in`` high: an access of word ``addr_in``; with ``we_in`` high a write of
  ``wd_in`` into the bits where ``w_mask_in`` is 1;
* ``rd_out`` is the word's contents before the edge (read-before-write), valid after
  that edge (clk-to-q 0.16-0.44 ns by size): a read latency of ONE cycle;
* with ``ce_in`` low ORFS's model drives ``rd_out`` to X.  This model holds it instead
  (Amaranth has no X), so a user must take ``rd_out`` only the cycle after an access,
  as hw/kda/state.py does.

Ports (``FakeRamSpec.ports``, the one list the model, the instance and the test against
the kit's Liberty and LEF use): clk, ce_in, we_in, addr_in[log2 words], wd_in[bits],
w_mask_in[bits], rd_out[bits].  VDD/VSS are LEF power pins only.

``FakeRam`` elaborates to the behavioural model (an Amaranth memory: the Amaranth
simulator, and the Verilog model module that RTL and gate-level simulations compile)
or, on a platform with ``sram_macros`` set (``MACRO_TARGET``, what hw/tops.py converts
the tops with), to an ``Instance`` of the macro itself: a cell named exactly like the
macro with exactly its pins, which synthesis keeps as a black box with the Liberty's
area and timing (flow/synth.py).  ``model_verilog`` is that model as a Verilog module of
the macro's name, appended to the tops' Verilog so that one file simulates.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from amaranth import Cat, ClockDomain, ClockSignal, Instance, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

# the kit's macros and their Liberty cell areas (um2); words and bits are in the name.
# sim/tests/block/test_fakeram.py checks every entry against pdk/nangate45/lib and lef
FAKERAM45_AREA = {
    "fakeram45_64x7": 387.296, "fakeram45_64x15": 659.148, "fakeram45_64x21": 949.354,
    "fakeram45_64x32": 1240.624, "fakeram45_32x64": 1754.536, "fakeram45_64x96": 4198.810,
    "fakeram45_256x34": 6476.036, "fakeram45_256x95": 13701.660, "fakeram45_256x96": 13701.660,
    "fakeram45_512x64": 17301.438, "fakeram45_1024x32": 16406.082, "fakeram45_2048x39": 45478.818,
}
_NAME = re.compile(r"^fakeram45_(\d+)x(\d+)$")


@dataclass(frozen=True)
class FakeRamSpec:
    name: str
    words: int
    bits: int
    area_um2: float

    @classmethod
    def of(cls, name: str) -> "FakeRamSpec":
        m = _NAME.match(name)
        if not m or name not in FAKERAM45_AREA:
            raise KeyError(f"{name}: not a fakeram45 macro of the kit ({', '.join(FAKERAM45_AREA)})")
        return cls(name, int(m.group(1)), int(m.group(2)), FAKERAM45_AREA[name])

    @property
    def addr_bits(self) -> int:
        return max(1, (self.words - 1).bit_length())

    def ports(self) -> tuple[tuple[str, str, int], ...]:
        """(pin, direction, width) in the Liberty's order of declaration."""
        return (("clk", "input", 1), ("rd_out", "output", self.bits), ("we_in", "input", 1),
                ("ce_in", "input", 1), ("addr_in", "input", self.addr_bits), ("wd_in", "input", self.bits),
                ("w_mask_in", "input", self.bits))


FAKERAM45 = {name: FakeRamSpec.of(name) for name in FAKERAM45_AREA}


@dataclass(frozen=True)
class MacroArray:
    """``rows`` x ``cols`` macros of one kind holding ``words`` words of ``bits`` bits:
    row r holds words r*spec.words .., column c bits c*spec.bits .."""
    spec: FakeRamSpec
    rows: int
    cols: int

    @property
    def count(self) -> int:
        return self.rows * self.cols

    @property
    def area_um2(self) -> float:
        return self.count * self.spec.area_um2


def choose_macros(words: int, bits: int) -> MacroArray:
    """The cheapest array of one macro kind that holds ``words`` x ``bits``: least macro
    area, then fewest macros (fewer instances to place, a narrower read multiplexer)."""
    def array(spec):
        return MacroArray(spec, math.ceil(words / spec.words), math.ceil(bits / spec.bits))
    return min((array(s) for s in FAKERAM45.values()), key=lambda a: (round(a.area_um2, 3), a.count))


def macro_row(m: Module, arr: MacroArray, name: str, *, ce, we, addr, wd, mask) -> Value:
    """One row of ``arr``: its ``arr.cols`` macros side by side (submodules ``<name>_c<c>``),
    all on the same ``ce``, ``we`` and ``addr``, column c on bits c*spec.bits.. of ``wd`` and
    of ``mask`` (a value as wide as the row, or an int written to every macro's mask, e.g.
    -1: whole words).  Returns the row's read data (every column's ``rd_out``, column 0
    lowest); the owner picks among the rows."""
    spec = arr.spec
    outs = []
    for c in range(arr.cols):
        ram = FakeRam(spec)
        m.submodules[f"{name}_c{c}"] = ram
        lo = c * spec.bits
        m.d.comb += [ram.ce_in.eq(ce), ram.we_in.eq(we), ram.addr_in.eq(addr),
                     ram.wd_in.eq(wd[lo:lo + spec.bits]),
                     ram.w_mask_in.eq(mask if isinstance(mask, int) else mask[lo:lo + spec.bits])]
        outs.append(ram.rd_out)
    return Cat(*outs)


class _MacroTarget:
    """The platform hw/tops.py elaborates the tops for: SRAM macros become instances.
    It has none of the get_memory/get_fifo hooks of an Amaranth platform, so everything
    else elaborates as it does in the simulator."""
    sram_macros = True


MACRO_TARGET = _MacroTarget()


class FakeRam(wiring.Component):
    def __init__(self, spec: FakeRamSpec):
        self.spec = spec
        super().__init__({name: (In(w) if d == "input" else Out(w))
                          for name, d, w in spec.ports() if name != "clk"})

    def elaborate(self, platform):
        s = self.spec
        if getattr(platform, "sram_macros", False):
            pins = {("i_" if d == "input" else "o_") + name: getattr(self, name)
                    for name, d, _w in s.ports() if name != "clk"}
            return Instance(s.name, i_clk=ClockSignal("sync"), **pins)
        m = Module()
        _behaviour(m, s, {name: getattr(self, name) for name, _d, _w in s.ports() if name != "clk"})
        return m


def _behaviour(m: Module, s: FakeRamSpec, pin: dict) -> None:
    """The macro's behaviour on the pins ``pin`` (all but clk), in ``m``'s sync domain."""
    # no init: an SRAM powers up with unknown contents; the state memory never reads a
    # word before writing it (hw/kda/state.py's cleared flag)
    m.submodules.store = store = Memory(shape=s.bits, depth=s.words, init=[])
    wr = store.write_port(granularity=1)          # one enable per bit: w_mask_in
    rd = store.read_port(transparent_for=())      # read-before-write, as the macro
    m.d.comb += [wr.addr.eq(pin["addr_in"]), wr.data.eq(pin["wd_in"]),
                 wr.en.eq(Mux(pin["ce_in"] & pin["we_in"], pin["w_mask_in"], 0)),
                 rd.addr.eq(pin["addr_in"]), rd.en.eq(pin["ce_in"]), pin["rd_out"].eq(rd.data)]


def model_verilog(spec: FakeRamSpec) -> str:
    """The behavioural model as a Verilog module named like the macro, pins as the macro's."""
    from amaranth.back import verilog
    m = Module()
    # a reset-less clock domain: the macro has a clk pin and no reset
    m.domains.sync = cd = ClockDomain("sync", reset_less=True)
    pin = {name: Signal(w, name=name) for name, _d, w in spec.ports() if name != "clk"}
    _behaviour(m, spec, pin)
    text = verilog.convert(m, name=spec.name, ports=[cd.clk, *pin.values()], emit_src=False)
    # the model is never the top of a design that includes it
    return text.replace("(* top =  1  *)\n", "")


_INSTANCE = re.compile(r"^\s*(fakeram45_\d+x\d+)\s+\S+\s*\(", re.M)


def instantiated_macros(verilog_text: str) -> list[str]:
    """Names of the fakeram45 macros a Verilog text instantiates, sorted."""
    return sorted({m.group(1) for m in _INSTANCE.finditer(verilog_text) if m.group(1) in FAKERAM45})


def convert_with_macros(elaboratable, name: str, ports) -> str:
    """Verilog of a design whose SRAM macros are instances of the macro cells, followed by
    each instantiated macro's behavioural model: one file that simulates, and that
    synthesis reads with the models replaced by the macros' black boxes (flow/synth.py)."""
    from amaranth.back import verilog
    text = verilog.convert(elaboratable, name=name, ports=ports, platform=MACRO_TARGET, emit_src=False)
    for macro in instantiated_macros(text):
        text += "\n" + model_verilog(FAKERAM45[macro])
    return text
