"""Formal equivalence of a synthesised block against its RTL, with Yosys's equiv passes.

    result = check_equivalence(rtl_v, netlist_v, top, workdir)   # EquivResult
    result.proven, result.unproven, result.log

The gold design is the RTL (Amaranth's Verilog, ``proc``, flattened, ports split into bits
as the flow's netlist has them); the gate design is the netlist of flow/synth.py with the
Nangate45 cells' behaviour from the kit's Verilog models (pdk/nangate45/sim/stdcells.v,
made readable for Yosys by ``yosys_cell_models``: specify blocks dropped, each
sequential UDP written as the always block it tabulates), flattened down to gates and
flip-flops.  Then:

    equiv_make gold gate equiv      pairs the signals of the same name (ports, and the
                                    registers whose names synthesis kept)
    equiv_simple -short             proves each pair from its input cone, cut at the pairs
    equiv_induct -seq N             induction over the unproven pairs, all pairs assumed
    equiv_status -assert            fails unless every pair is proven

``read_liberty -lib`` is not enough: it gives the cells as black boxes, whose outputs
Yosys cannot relate to anything.  A block is proven when every pair is: the netlist
computes exactly what the RTL does, from any state the two share, on every input.  What
the passes cannot prove (state that synthesis re-encoded or merged, so no register pair
matches; designs too deep for the SAT problems) stays unproven and is left to gate-level
simulation (sim/tests/test_gate_level.py); docs/flow.md lists which blocks are which.

``python -m flow.equiv BLOCK [-c CONFIG]`` synthesises one of ``BLOCKS`` and checks it.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from flow.yosys_driver import run_yosys

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


@dataclass
class EquivResult:
    top: str
    proven: int                 # $equiv cells proven
    unproven: int               # ... left unproven
    seconds: float
    log: Path
    passed: bool                # equiv_status -assert passed
    unproven_names: list = field(default_factory=list)

    @property
    def summary(self) -> str:
        total = self.proven + self.unproven
        return (f"{self.top}: {'PROVEN' if self.passed else 'NOT PROVEN'}, {self.proven} of {total} "
                f"equivalence pairs proven in {self.seconds:.0f} s")


def equiv_script(rtl: Path, netlist: Path, cells: Path, top: str, seq: int = 4) -> str:
    """The Yosys script (see the module docstring)."""
    return "\n".join([
        "# generated by flow/equiv.py: the netlist against its RTL",
        f"read_verilog -sv {rtl}",
        f"hierarchy -check -top {top}",
        "proc", "flatten", "memory_map", "opt_clean",    # (not -purge: it drops the named wires equiv_make pairs)
        "splitnets -ports",          # the netlist's ports are single bits, \\name[i] ...
        "splitnets",                 # ... and so are its flip-flops' nets (storage[6][0])
        # Amaranth's Verilog drives some wires only by an initial value (the always @* trigger
        # reg of its comb processes): zero, as the flow's setundef -zero did in the netlist
        "setundef -undriven -init -zero",
        # a flip-flop that never leaves its initial (= reset) value is a constant: synthesis's
        # opt_dff removed it from the netlist (a counter's bits below its step), so here too
        "opt -full", "opt_dff -sat",
        "setattr -unset init",       # the netlist's flip-flops have no initial value
        f"rename {top} gold", "design -stash gold",
        f"read_verilog -DTETRAMAX {cells}",        # TETRAMAX: no X-buffer UDPs of the timing checks
        f"read_verilog {netlist}",
        f"hierarchy -check -top {top}",
        "flatten", "proc", "opt_clean", "splitnets",
        f"rename {top} gate", "design -stash gate",
        "design -copy-from gold -as gold gold",
        "design -copy-from gate -as gate gate",
        "equiv_make -inames gold gate equiv",   # also $-named wires: both sides ran memory_map
        "hierarchy -top equiv",
        # -short: a cone stops at signals already paired (the RTL's named wires that synthesis
        # kept), so each SAT problem is one stage of logic, not the whole pipeline behind it
        "equiv_simple -short",
        f"equiv_induct -seq {seq}",
        "tee -o equiv_status.txt equiv_status",
        "equiv_status -assert",
        "",
    ])


_INSTANCE = re.compile(r"^(\s*)(\w+) (\S+) \((.*?)\);\n", re.S | re.M)
_PIN = re.compile(r"\.(\w+)\(([^()]*)\)")


def _net(name: str) -> str:
    """A net as it is written again: an escaped identifier (``\\x[3]``) ends with a space."""
    name = name.strip()
    return name + " " if name.startswith("\\") else name


def ungate_clocks(netlist: str, gate_pins: tuple[str, str, str] = ("CK", "E", "GCK")) -> str:
    """The netlist with its clock gating (flow/synth.py clock_gate_lines) written back as
    enables, for the equivalence check: Yosys's equiv passes pair registers on one clock and
    cannot follow a clock through a gate.  Each clock gate goes; each cell clocked by its
    output is clocked by the gate's clock and loads D when the gate's enable is high and its
    own Q otherwise.  That is what the gate does at every clock edge where the enable meets
    the gate's setup and hold, which STA checks (the gates' enable pins are endpoints).
    ``gate_pins``: the gates' clock, enable and gated-clock pins; a gate is any cell with
    all three."""
    ck_pin, en_pin, gck_pin = gate_pins
    out, n = [], 0
    for module in re.split(r"(?<=endmodule\n)", netlist):
        insts = [(m, dict(_PIN.findall(m.group(4)))) for m in _INSTANCE.finditer(module)]
        gates = {pins[gck_pin].strip(): (_net(pins[ck_pin]), _net(pins[en_pin]))
                 for _, pins in insts if {ck_pin, en_pin, gck_pin} <= set(pins)}
        if not gates:
            out.append(module)
            continue
        extra, pieces, last = [], [], 0
        for m, pins in insts:
            pieces.append(module[last:m.start()])
            last = m.end()
            if {ck_pin, en_pin, gck_pin} <= set(pins):
                continue                                   # the gate itself goes
            gated = gates.get(pins.get(ck_pin, "").strip())
            if gated is None:
                pieces.append(m.group(0))
                continue
            clock, enable = gated
            n += 1
            d, q = f"ungated_{n}_d", _net(pins.get("Q", ""))
            if not q:
                q = f"ungated_{n}_q"
                extra.append(f"  wire {q};\n")
            extra.append(f"  wire {d};\n  assign {d} = {enable} ? {_net(pins['D'])} : {q};\n")
            conns = dict(pins, **{ck_pin: clock, "D": d, "Q": q})
            body = ",\n".join(f"{m.group(1)}  .{p}({_net(v)})" for p, v in conns.items())
            pieces.append(f"{m.group(1)}{m.group(2)} {m.group(3)} (\n{body}\n{m.group(1)});\n")
        tail = module[last:]
        end = tail.rfind("endmodule")
        out.append("".join(pieces) + tail[:end] + "".join(extra) + tail[end:])
    return "".join(out)


def check_equivalence(rtl: Path, netlist: Path, top: str, workdir: Path, cell_models: Path | None = None,
                      seq: int = 4, timeout_s: float = 1800.0) -> EquivResult:
    """Run the equivalence check of ``netlist`` (flow/synth.py's, module ``top``) against ``rtl``."""
    from flow.errors import FlowError
    workdir.mkdir(parents=True, exist_ok=True)
    if cell_models is None:
        from pdk.kit import find_kit
        cell_models = find_kit(required=("verilog_models",)).verilog_models
    cells = workdir / "cells_yosys.v"
    text = yosys_cell_models(Path(cell_models).read_text())
    if not cells.is_file() or cells.read_text() != text:
        cells.write_text(text)
    # the gate side reads the netlist with its clock gates written back as enables
    gate = workdir / f"{top}.ungated.v"
    gate.write_text(ungate_clocks(Path(netlist).read_text()))
    script = workdir / f"{top}.equiv.ys"
    script.write_text(equiv_script(Path(rtl).resolve(), gate.resolve(), cells.resolve(), top, seq))
    log = workdir / f"{top}.equiv.log"
    (workdir / "equiv_status.txt").unlink(missing_ok=True)
    t0 = time.monotonic()
    passed = True
    try:
        run_yosys(script, log, timeout_s)
    except FlowError:
        passed = False
    seconds = time.monotonic() - t0
    status = (workdir / "equiv_status.txt").read_text() if (workdir / "equiv_status.txt").is_file() else ""
    proven, unproven, names = _parse_status(status or log.read_text(errors="replace"))
    if not status:
        passed = False      # the script stopped before the status (an error in the netlist or RTL)
    return EquivResult(top, proven, unproven, seconds, log, passed and unproven == 0 and proven > 0, names)


def _parse_status(text: str) -> tuple[int, int, list[str]]:
    total = re.search(r"Found (\d+) \$equiv cells", text)
    unproven = re.search(r"Of those cells (\d+) are proven and (\d+) are unproven", text)
    names = re.findall(r"Unproven \$equiv \S+: (\S+) (\S+)", text)
    if unproven:
        return int(unproven.group(1)), int(unproven.group(2)), [a for a, _ in names]
    if total and "all proven" in text.lower():
        return int(total.group(1)), 0, []
    if total:
        return 0, int(total.group(1)), [a for a, _ in names]
    # no status (stopped by the time limit): what equiv_simple had proven by then
    start = re.search(r"Found (\d+) unproven \$equiv cells", text)
    if start:
        done = len(re.findall(r"success!", text))
        return done, int(start.group(1)) - done, []
    return 0, 0, []


# ---- blocks: RTL, then the flow's synthesis, then the check ---------------------------------

def _residual(cfg):
    from hw.chip.residual import ResidualAdd
    from moekda.formats import formats_for
    return ResidualAdd.for_config(cfg, formats_for(cfg).act_bits, cfg.model.d_model)


def _rsqrt(cfg):
    from hw.arith.rsqrt import Rsqrt
    from moekda.formats import derived_widths, formats_for
    return Rsqrt(formats_for(cfg), derived_widths(cfg)["ss_rmsnorm"], clock_period_ns=cfg.hw.clock_period_ns)


def _matvec(cfg):
    from hw.arith.matvec import MatVecEngine
    return MatVecEngine(cfg)


def _arbiter(cfg):
    from hw.chip.weight_arbiter import WeightArbiter
    return WeightArbiter(cfg.hw.weight_port_bytes, 3)


def _csr(cfg):
    from hw.chip.csr import LayerCsr
    from hw.chip.layer import macs_per_token
    from hw.image.format import image_layout
    return LayerCsr(cfg, macs_per_token(cfg), image_layout(cfg).length)


def _topk(cfg):
    from hw.moe.topk import TopK
    from moekda.formats import derived_widths
    return TopK(cfg.model.n_experts, cfg.model.top_k, derived_widths(cfg)["router_choice"], tag_bits=8)


BLOCKS = {"arbiter": _arbiter, "csr": _csr, "topk": _topk, "residual": _residual, "rsqrt": _rsqrt,
          "matvec": _matvec}


def block_rtl(name: str, cfg, out: Path) -> Path:
    """The block's Verilog (module ``name``) as the flow's RTL step writes a top."""
    from amaranth.back import verilog
    from hw.tops import _flat_ports
    from amaranth.hdl import Value
    block = BLOCKS[name](cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = verilog.convert(block, name=name, ports=[Value.cast(v) for v in _flat_ports(block)], emit_src=False)
    if not out.is_file() or out.read_text() != text:
        out.write_text(text)
    return out


def synth_block(name: str, cfg, root: Path) -> tuple[Path, Path]:
    """(RTL, netlist) of block ``name`` synthesised by the flow's script (flow/synth.py) into
    ``root`` (a BuildPaths tree of its own)."""
    from flow.paths import BuildPaths
    from flow.synth import SynthOptions, run_synth
    from pdk.kit import find_kit
    paths = BuildPaths(root=root, top=name, block=False)
    rtl = block_rtl(name, cfg, paths.rtl)
    run_synth([rtl], find_kit(), paths, SynthOptions(top=name, period_ns=cfg.hw.clock_period_ns))
    return rtl, paths.netlist


def main(argv=None) -> int:
    import argparse
    from moekda.config import REPO_ROOT, load_config
    ap = argparse.ArgumentParser(prog="python -m flow.equiv", description=__doc__.splitlines()[0])
    ap.add_argument("block", choices=sorted(BLOCKS))
    ap.add_argument("-c", "--config", default="tiny")
    ap.add_argument("--seq", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for the check (then: not proven)")
    a = ap.parse_args(argv)
    cfg = load_config(a.config)
    root = REPO_ROOT / "build" / cfg.name / "equiv" / a.block
    rtl, netlist = synth_block(a.block, cfg, root)
    res = check_equivalence(rtl, netlist, a.block, root / "check", seq=a.seq, timeout_s=a.timeout)
    print(res.summary, f"(log {res.log})")
    return 0 if res.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
