"""Yosys synthesis to Nangate45: the script, and the statistics it leaves.

The script follows ORFS's synth.tcl in spirit (not its code):

    read_verilog; hierarchy -check -top
    synth -top -noabc                   generic synthesis, hierarchy kept, no generic ABC
    opt_clean -purge                    (synth has optimised already: only unused wires go)
    clockgate -liberty -min_net_size    enable flip-flops behind integrated clock gates
    dfflibmap -liberty -dont_use        flip-flops onto library cells; opt_clean
    abc -liberty -constr -D -script     timing-driven mapping; -constr gives ABC a driver
                                        (BUF_X1) and a load so it buffers and sizes,
                                        -D the target, -script the lean script below
    setundef -zero; opt_clean -purge    constants, then no aliases left ...
    hilomap; insbuf                     ... tie cells, buffers instead of `assign`s
    stat -liberty (text + json); write_verilog -noattr

SRAM macros (the kit's fakeram45_*, hw/mem/fakeram.py): the RTL instantiates each macro
by its cell name and carries its behavioural model as a module of that name (so the file
simulates); right after read_verilog, ``read_liberty -lib -overwrite`` of the macro's own
Liberty file replaces that module by a black box with the Liberty's pins.  Nothing of the
model is synthesised; the instance stays one cell, with the Liberty's area in ``stat``
(given every macro's file next to the cell library's) and its setup and clock-to-output
arcs in OpenSTA (flow/sta.py reads the same files).  Beside the netlist,
``<top>.macros.v`` holds the behavioural models of the macros it instantiates, what a
gate-level simulation compiles with the netlist and the cells' models.

Hierarchy is kept by default: Amaranth gives every submodule its own module,
named after its instance path (``top.engine.lane0``), so the statistics give
area per block and STA names paths by block.  ``flatten=True`` lets ABC
optimise across block boundaries; the per-block split then needs a
hierarchical run (``stat`` of a flat design has one module), so a flat run
adds a second, hierarchical Yosys pass whose only output is the per-block
split (reports/synth_stat_blocks.*); totals, cells and timing come from the
flat netlist.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from flow.liberty import read_cells
from flow.paths import BuildPaths
from flow.yosys_driver import run_yosys
from pdk.kit import PLATFORM, Kit, Macro


ABC_SCRIPTS = ("lean", "yosys")


@dataclass(frozen=True)
class SynthOptions:
    top: str
    period_ns: float
    flatten: bool = False
    timeout_s: float = 3600.0
    # synth's own generic `abc` before technology mapping: off, as in ORFS (synth -run :fine,
    # then map).  Yosys splits that pass by clock-enable domain, one ABC process each:
    # thousands of processes on a design with many enables, for no better result
    generic_abc: bool = False
    # the ABC mapping script: "lean" (ours, below) or "yosys" (Yosys's default -constr
    # script, which adds SAT sweeping: &fraig -x and scorr)
    abc_script: str = "lean"
    # clock gating: flip-flops per integrated clock gate at least (0: none); None: the
    # platform's (pdk/kit.py clock_gate_min_flops)
    clock_gate_min_flops: int | None = None

    def __post_init__(self):
        if self.abc_script not in ABC_SCRIPTS:
            raise ValueError(f"abc_script {self.abc_script!r}: one of {', '.join(ABC_SCRIPTS)}")
        if self.clock_gate_min_flops is not None and self.clock_gate_min_flops < 0:
            raise ValueError(f"clock_gate_min_flops {self.clock_gate_min_flops}: 0 (off) or more")

    @property
    def clock_gating(self) -> int:
        """Flip-flops per clock gate at least, 0 for none: the option or the platform's."""
        return PLATFORM.clock_gate_min_flops if self.clock_gate_min_flops is None else self.clock_gate_min_flops


def lean_abc_script(period_ps: int) -> str:
    """Yosys's -constr script without the SAT sweeping (&fraig -x, scorr), as in ORFS's
    speed script: on the KDA normaliser (9.3k gates) &fraig -x ran for minutes of CPU
    where this script takes 2 s.  Delay-driven mapping (&dch -f; &nf -D) then buffering
    and sizing against the driver and load of the -constr file."""
    d = f"-D {period_ps}"
    return "\n".join(["strash", "dc2", "strash", "&get -n", "&dch -f", f"&nf {d}", "&put",
                      "buffer", f"upsize {d}", f"dnsize {d}", "stime -p", ""])


def abc_constraints() -> str:
    """ABC's view of the environment: what drives a gate and what it drives."""
    return (f"set_driving_cell {PLATFORM.abc_driver_cell}\n"
            f"set_load {PLATFORM.abc_load_ff}\n")


def macros_used(texts: list[str], kit: Kit) -> tuple[Macro, ...]:
    """The kit's SRAM macros that Verilog ``texts`` (RTL or netlist) instantiate."""
    found = set()
    for text in texts:
        found |= set(re.findall(r"^\s*(fakeram45_\w+)\s+\S+\s*\(", text, re.M))
    return tuple(m for m in kit.macros if m.name in found)


def synth_script(rtl: list[Path], kit: Kit, paths: BuildPaths, opts: SynthOptions,
                 block_split: bool = False, macros: tuple[Macro, ...] = ()) -> str:
    """The Yosys script.  ``block_split``: the hierarchical pass that only measures
    area per block for a flat run (its statistics go to synth_stat_blocks.*, and
    it writes no netlist).  ``macros``: the SRAM macros the RTL instantiates."""
    lib = kit.liberty
    dont_use = " ".join(f"-dont_use {c}" for c in PLATFORM.dont_use_for(kit))
    hi_cell, hi_pin = PLATFORM.tie_hi
    lo_cell, lo_pin = PLATFORM.tie_lo
    buf_cell, buf_in, buf_out = PLATFORM.min_buf
    period_ps = round(opts.period_ns * 1000)
    flatten = opts.flatten and not block_split
    stat_txt, stat_json = ((paths.synth_stat_blocks, paths.synth_stat_blocks_json) if block_split
                           else (paths.synth_stat, paths.synth_stat_json))
    lines = [f"# generated by flow/synth.py for top {opts.top}"
             + (" (hierarchical pass for the per-block area split)" if block_split else "")]
    lines += [f"read_verilog -sv {p}" for p in rtl]
    # each macro's behavioural model (a module of the macro's name) becomes its black box
    lines += [f"read_liberty -lib -overwrite {m.liberty}" for m in macros]
    stat_libs = " ".join(f"-liberty {p}" for p in [lib, *(m.liberty for m in macros)])
    lines += [
        f"hierarchy -check -top {opts.top}",
        f"synth -top {opts.top}" + (" -flatten" if flatten else "") + ("" if opts.generic_abc else " -noabc"),
        # synth ends with its own opt; what is left is dropping unused wires.  A full
        # `opt` here and after dfflibmap cost 29 s + 32 s of a 457 s small run (wall,
        # loaded machine) for the same netlist: ABC restructures the logic anyway
        "opt_clean -purge",
        *clock_gate_lines(lib, dont_use, opts.clock_gating, paths.srst_map),
        f"dfflibmap -liberty {lib} {dont_use}",
        # not with clock gating: opt_clean takes out the buffers d_buffer_map put before each
        # D (a buffer is a connection to it), and ABC again sees one net where thousands of
        # D pins hang (model-small-sram: a NOR3_X1 on 2,304 of them, WNS -39 ns)
        *([] if opts.clock_gating else ["opt_clean"]),
        f"abc -liberty {lib} -constr {paths.abc_constr} -D {period_ps} {dont_use}"
        + (f" -script {paths.abc_script}" if opts.abc_script == "lean" else ""),
        "setundef -zero",
        "splitnets -ports",
        # purge before insbuf: public aliases of one net (an Amaranth port and the
        # signal behind it) would otherwise each get a buffer
        "opt_clean -purge",
        f"hilomap -singleton -hicell {hi_cell} {hi_pin} -locell {lo_cell} {lo_pin}",
        f"insbuf -buf {buf_cell} {buf_in} {buf_out}",
        "opt_clean -purge",
        "check",
        f"tee -o {stat_txt} stat {stat_libs} -top {opts.top}",
        f"tee -q -o {stat_json} stat -json {stat_libs} -top {opts.top}",
    ]
    if not block_split:
        lines.append(f"write_verilog -noattr -noexpr -nohex -nodec {paths.netlist}")
    return "\n".join(lines + [""])


def srst_enable_map() -> str:
    """A techmap (Verilog) that turns each flip-flop with a synchronous reset and an enable
    (Yosys's ``$_SDFFE_*``: reset over enable, ``$_SDFFCE_*``: enable over reset) into an
    enable flip-flop: D = reset ? value : D, and for reset over enable EN = EN | reset.
    Exact, cycle for cycle.  Why: Yosys's clockgate gates only ``$_DFFE_*``, and almost
    every register Amaranth writes has a synchronous reset; Nangate45 has no synchronous
    reset flip-flop, so the reset was logic in front of D anyway.  Written in Yosys's
    fine-grained gates, so ``opt_merge`` can make the one EN | reset of a register's bits
    one net (clockgate groups flip-flops by that net) and ABC maps them as they are."""
    def pol(name, p):    # the active-high form of an input of polarity p
        return ("", name) if p == "P" else (f"  wire {name.lower()}n; \\$_NOT_ i{name} (.A({name}), .Y({name.lower()}n));\n",
                                            f"{name.lower()}n")
    out = []
    for kind in ("SDFFE", "SDFFCE"):
        for clk in "PN":
            for rst in "PN":
                for val in "01":
                    for en in "PN":
                        rdecl, r = pol("R", rst)
                        edecl, e = pol("E", en)
                        body = rdecl + edecl + f"  wire d; \\$_MUX_ m (.A(D), .B(1'b{val}), .S({r}), .Y(d));\n"
                        if kind == "SDFFE":
                            body += f"  wire g; \\$_OR_ o (.A({e}), .B({r}), .Y(g));\n"
                            e = "g"
                        out.append(f"module \\$_{kind}_{clk}{rst}{val}{en}_ (input C, R, E, D, output Q);\n{body}"
                                   f"  \\$_DFFE_{clk}P_ _TECHMAP_REPLACE_ (.C(C), .E({e}), .D(d), .Q(Q));\n"
                                   "endmodule\n")
    return "".join(out)


def d_buffer_map() -> str:
    """A techmap (Verilog) that puts a buffer of its own in front of each flip-flop's D.
    Why: ABC maps the logic between the flip-flops and sees each net that leaves it once,
    however many flip-flops it drives.  Before clock gating each flip-flop had its own enable
    multiplexer, so a value loaded into many registers (the short convolution's input into
    every context's history) fanned out inside ABC's logic, where ABC buffers it; after
    gating the registers share one D net that ABC never saw fan out: model-small-sram had a
    NOR3_X1 driving thousands of D pins (36.7 ns).  With a buffer per flip-flop each D is an
    output of its own, ABC sees the real fanout and buffers or duplicates the driver; a
    buffer on a D driven by one gate or another flip-flop's Q maps to a wire."""
    return ("module \\$_DFF_P_ (input C, D, output Q);\n"
            "  wire d; \\$_BUF_ b (.A(D), .Y(d));\n"
            "  \\$__DFF_P_D_BUFFERED r (.C(C), .D(d), .Q(Q));\nendmodule\n")


def clock_gate_lines(lib: Path, dont_use: str, min_flops: int, srst_map: Path) -> list[str]:
    """Clock gating before the flip-flops are mapped: every set of at least ``min_flops``
    enable flip-flops on one clock and one enable loses its enable multiplexers and is clocked
    through one integrated clock gate of the Liberty (the smallest one not in ``dont_use``:
    CLKGATE_X4 on Nangate45).  Such a register then draws no clock power while its enable is
    low.  Registers with a synchronous reset are made enable flip-flops first (``srst_map``,
    written from ``srst_enable_map``).  OpenSTA checks the gate's enable against its clock
    (the cell's setup/hold arcs) like any other endpoint."""
    if not min_flops:
        return []
    return [f"techmap -map {srst_map}", "opt_merge", "opt_clean",
            f"clockgate -liberty {lib} {dont_use} -min_net_size {min_flops}",
            # a buffer per flip-flop's D (d_buffer_map, beside srst_map), then the flip-flop
            # type back for dfflibmap
            f"techmap -map {srst_map.with_name('d_buffer_map.v')}", "chtype -map $__DFF_P_D_BUFFERED $_DFF_P_"]


def _write_abc_constraints(paths: BuildPaths) -> None:
    """Written only when it changes: the flat run and its block-split pass share it."""
    text = abc_constraints()
    if not paths.abc_constr.is_file() or paths.abc_constr.read_text() != text:
        paths.abc_constr.write_text(text)


def _write_abc_script(paths: BuildPaths, opts: SynthOptions) -> None:
    text = lean_abc_script(round(opts.period_ns * 1000))
    if not paths.abc_script.is_file() or paths.abc_script.read_text() != text:
        paths.abc_script.write_text(text)
    # the clock-gating step's techmaps, beside the ABC files (same rule: written on change)
    for path, text in ((paths.srst_map, srst_enable_map()),
                       (paths.srst_map.with_name("d_buffer_map.v"), d_buffer_map())):
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)


def _rtl_macros(rtl: list[Path], kit: Kit) -> tuple[Macro, ...]:
    return macros_used([Path(p).read_text() for p in rtl], kit)


def run_synth(rtl: list[Path], kit: Kit, paths: BuildPaths, opts: SynthOptions,
              on_pass: Callable[[str], None] | None = None) -> float:
    """Write the scripts, run Yosys; returns wall seconds. Raises FlowError."""
    paths.make_dirs()
    _write_abc_constraints(paths)
    _write_abc_script(paths, opts)
    macros = _rtl_macros(rtl, kit)
    paths.synth_script.write_text(synth_script(rtl, kit, paths, opts, macros=macros))
    seconds = run_yosys(paths.synth_script, paths.log("synth"), opts.timeout_s, on_pass)
    write_macro_models(paths, macros)
    return seconds


def macro_models_path(paths: BuildPaths) -> Path:
    return paths.synth_dir / f"{paths.top}.macros.v"


def write_macro_models(paths: BuildPaths, macros: tuple[Macro, ...]) -> None:
    """The behavioural models of ``macros`` for gate-level simulation (none: no file)."""
    out = macro_models_path(paths)
    if not macros:
        out.unlink(missing_ok=True)
        return
    from hw.mem.fakeram import FAKERAM45, model_verilog
    out.write_text("\n".join(model_verilog(FAKERAM45[m.name]) for m in macros))


def run_block_split(rtl: list[Path], kit: Kit, paths: BuildPaths, opts: SynthOptions,
                    on_pass: Callable[[str], None] | None = None) -> float:
    """For a flat run: the same synthesis with hierarchy kept, for area per block only."""
    _write_abc_constraints(paths)
    _write_abc_script(paths, opts)
    paths.synth_blocks_script.write_text(synth_script(rtl, kit, paths, opts, block_split=True,
                                                      macros=_rtl_macros(rtl, kit)))
    return run_yosys(paths.synth_blocks_script, paths.log("synth_blocks"), opts.timeout_s, on_pass)


# ---------------------------------------------------------------- statistics

@dataclass
class ModuleStat:
    name: str               # Yosys module name without the leading backslash
    cells: dict[str, int]   # library cell -> count (cells of this module only)
    children: dict[str, int] = field(default_factory=dict)  # submodule -> instances


@dataclass
class SynthStats:
    top: str
    modules: dict[str, ModuleStat]
    cell_area: dict[str, float]   # library cell -> um2
    sequential: frozenset[str]    # library cells that hold state
    macros: frozenset[str] = frozenset()   # SRAM macro cells (their own Liberty files)

    def own_area(self, module: str) -> float:
        return sum(n * self.cell_area[c] for c, n in self.modules[module].cells.items())

    def flat_cells(self, module: str | None = None) -> dict[str, int]:
        """Library cell counts of a module with everything instantiated below it."""
        module = module or self.top
        mod = self.modules[module]
        out = dict(mod.cells)
        for child, k in mod.children.items():
            for c, n in self.flat_cells(child).items():
                out[c] = out.get(c, 0) + k * n
        return out

    def area(self, module: str | None = None) -> float:
        return sum(n * self.cell_area[c] for c, n in self.flat_cells(module).items())

    def count(self, module: str | None = None) -> int:
        return sum(self.flat_cells(module).values())

    def macro_cells(self, module: str | None = None) -> dict[str, int]:
        """SRAM macro -> instances, in a module with everything below it."""
        return {c: n for c, n in self.flat_cells(module).items() if c in self.macros}

    def macro_area(self, module: str | None = None) -> float:
        return sum(n * self.cell_area[c] for c, n in self.macro_cells(module).items())

    def sequential_area(self, module: str | None = None) -> float:
        return sum(n * self.cell_area[c] for c, n in self.flat_cells(module).items()
                   if c in self.sequential)

    def instances(self) -> list[tuple[str, str]]:
        """(instance path, module) for every module instance below the top, depth first."""
        out = []

        def walk(module: str, prefix: str):
            for child, k in self.modules[module].children.items():
                inst = _instance_name(self.top, child, prefix)
                for i in range(k):
                    path = inst if k == 1 else f"{inst}#{i}"
                    out.append((path, child))
                    walk(child, path + "/")
        walk(self.top, "")
        return out


def _instance_name(top: str, module: str, prefix: str) -> str:
    """Amaranth names a submodule's module after its instance path: top.a.b -> a/b."""
    parts = module.split(".")
    if parts[0] == top and len(parts) > 1:
        return "/".join(parts[1:])
    return prefix + module


def read_stats(stat_json: Path, liberty: Path, top: str) -> SynthStats:
    """``liberty``: the cell library.  A cell that is neither one of its cells nor a module
    is an SRAM macro when its own Liberty file sits beside it (``<cell>.lib``, the kit's
    layout: pdk/kit.py orfs_kit), which gives its area."""
    data = json.loads(Path(stat_json).read_text())
    lib = dict(read_cells(Path(liberty)))
    macros = set()
    modules = {}
    for raw_name, m in data["modules"].items():
        name = raw_name.lstrip("\\")
        cells, children = {}, {}
        for typ, n in m.get("num_cells_by_type", {}).items():
            typ = typ.lstrip("\\")
            macro_lib = Path(liberty).parent / f"{typ}.lib"
            if typ not in lib and typ.startswith("fakeram") and macro_lib.is_file():
                lib.update(read_cells(macro_lib))
                macros.add(typ)
            (cells if typ in lib else children)[typ] = int(n)
        modules[name] = ModuleStat(name, cells, children)
    unknown = {c for m in modules.values() for c in m.children if c not in modules}
    if unknown:
        # a cell that is neither a library cell nor a module: unmapped logic
        raise ValueError(f"unmapped cells in the netlist: {', '.join(sorted(unknown))}")
    return SynthStats(top=top, modules=modules,
                      cell_area={c: v.area for c, v in lib.items()},
                      sequential=frozenset(c for c, v in lib.items() if v.sequential),
                      macros=frozenset(macros))
