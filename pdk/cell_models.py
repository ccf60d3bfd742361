"""The kit's cell models (pdk/nangate45/sim/stdcells.v) as plain Verilog: every sequential
UDP (``primitive \\seq_<CELL>``) written as the always block it tabulates, specify blocks
dropped.  Yosys (flow/equiv.py) reads that form, and both gate-level simulators
(run/driver.py: Verilator reads no UDPs, and Icarus runs the same models).

For simulation (``power_up="random"``) every flip-flop and latch starts from a value of
``$random``, as silicon does, instead of X.  Why: a netlist's logic is only Boolean-equal
to the RTL, not X-equal.  ABC folds a register's reset into its hold path in whatever shape
is smallest, and in four-valued logic such a shape can keep an X through the reset: the
gated tiny netlist's stage-A index bit 3 came out as D = !(!(q | a) | (b & q)), which is 0
for either q once the reset makes a = 0 and b = 1, and X for q = X; the chip then hung after
its LOAD in Icarus (docs/flow.md, "Clock gating").  With a random power-up value the
simulation is the physical question (does the chip work from whatever its registers hold
at power-up, after its reset?), and the bench still compares every output bit.

Read the result with ``TETRAMAX`` defined: the models then leave out the X-buffer UDPs of
their timing checks.
"""
from __future__ import annotations

import re
from pathlib import Path

# the sequential UDPs of the kit's models, by the primitive's name: what it does
_SEQ_BODIES = {
    # flip-flops: the scan variants (SDFF*) have their scan mux in the cell's gates
    "DFF": "always @(posedge {clk}) IQ <= nextstate;",
    "DFFR": "always @(posedge {clk} or negedge RN) if (!RN) IQ <= 1'b0; else IQ <= nextstate;",
    "DFFS": "always @(posedge {clk} or negedge SN) if (!SN) IQ <= 1'b1; else IQ <= nextstate;",
    "DFFRS": "always @(posedge {clk} or negedge RN or negedge SN) if (!RN) IQ <= 1'b0; "
             "else if (!SN) IQ <= 1'b1; else IQ <= nextstate;",
    # latches: transparent while the enable is at its active level
    "DLH": "always @* if (G) IQ = nextstate;",
    "TLAT": "always @* if (G) IQ = nextstate;",
    "DLL": "always @* if (!GN) IQ = nextstate;",
    "CLKGATE": "always @* if (!CK) IQ = nextstate;",
    "CLKGATETST": "always @* if (!CK) IQ = nextstate;",
}


POWER_UP = ("x", "random")


def yosys_cell_models(text: str, power_up: str = "x") -> str:
    """The kit's cell models as Verilog Yosys reads: no specify blocks (timing checks,
    conditional paths), every sequential UDP (``primitive \\seq_<CELL>``) replaced by a module
    with the equivalent always block, and the UDPs' unnamed instances given names.
    ``power_up``: "x" (no initial value: what formal equivalence reads) or "random" (each
    flip-flop and latch starts from ``$random``: the simulators' form)."""
    if power_up not in POWER_UP:
        raise ValueError(f"power_up {power_up!r}: one of {', '.join(POWER_UP)}")
    initial = "  initial IQ = $random;\n" if power_up == "random" else ""
    text = re.sub(r"^\s*specify\b.*?^\s*endspecify\b", "", text, flags=re.S | re.M)

    def module_for(mm: re.Match) -> str:
        name, ports = mm.group(1), [p.strip() for p in mm.group(2).split(",")]
        kind = re.sub(r"_X\d+$", "", name[len("seq_"):])
        kind = kind[1:] if kind.startswith("SDFF") else kind     # scan flops: the same flip-flop
        if kind not in _SEQ_BODIES:
            raise ValueError(f"cell models: primitive {name} of an unknown kind {kind}")
        clk = next(p for p in ports if p in ("CK", "G", "GN"))
        inputs = [p for p in ports if p != "IQ"]
        return (f"module \\{name} ({', '.join(ports)});\n  output reg IQ;\n"
                + "".join(f"  input {p};\n" for p in inputs) + initial
                + "  " + _SEQ_BODIES[kind].format(clk=clk) + "\nendmodule\n")

    text = re.sub(r"^primitive\s+\\(\S+)\s*\(([^)]*)\);.*?^endprimitive\b", module_for, text,
                  flags=re.S | re.M)
    counter = iter(range(1 << 30))
    text = re.sub(r"^(\s*)(\\seq_\S+)(\s*)\(", lambda mm: f"{mm.group(1)}{mm.group(2)} useq{next(counter)} (",
                  text, flags=re.M)
    # `reg NOTIFIER;` drives a UDP input that the modules above ignore
    return text


def write_plain_cell_models(models: Path, out: Path, power_up: str = "random") -> Path:
    """``yosys_cell_models`` of the file ``models`` into ``out`` (rewritten only on change);
    by default the simulators' form, every register powering up at a random value."""
    text = yosys_cell_models(Path(models).read_text(), power_up)
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return out
