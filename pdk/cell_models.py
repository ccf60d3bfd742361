"""The kit's cell models (pdk/nangate45/sim/stdcells.v) as plain Verilog: every sequential
UDP (``primitive \\seq_<CELL>``) written as the always block it tabulates, specify blocks
dropped.  Two readers need that form: Yosys (flow/equiv.py) and Verilator (sim/driver.py's
gate-level build); neither reads UDPs.

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


def yosys_cell_models(text: str) -> str:
    """The kit's cell models as Verilog Yosys reads: no specify blocks (timing checks,
    conditional paths), every sequential UDP (``primitive \\seq_<CELL>``) replaced by a module
    with the equivalent always block, and the UDPs' unnamed instances given names."""
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
                + "".join(f"  input {p};\n" for p in inputs)
                + "  " + _SEQ_BODIES[kind].format(clk=clk) + "\nendmodule\n")

    text = re.sub(r"^primitive\s+\\(\S+)\s*\(([^)]*)\);.*?^endprimitive\b", module_for, text,
                  flags=re.S | re.M)
    counter = iter(range(1 << 30))
    text = re.sub(r"^(\s*)(\\seq_\S+)(\s*)\(", lambda mm: f"{mm.group(1)}{mm.group(2)} useq{next(counter)} (",
                  text, flags=re.M)
    # `reg NOTIFIER;` drives a UDP input that the modules above ignore
    return text


def write_plain_cell_models(models: Path, out: Path) -> Path:
    """``yosys_cell_models`` of the file ``models`` into ``out`` (rewritten only on change)."""
    text = yosys_cell_models(Path(models).read_text())
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return out
