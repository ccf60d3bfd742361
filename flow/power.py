"""`moekda power`: energy per token from simulated switching activity.

The flow's other power figures assume one activity on every input (OpenSTA propagates it
through the logic).  Here the chip's gate-level netlist runs real tokens instead
(run/driver.py, Verilator, the kit's cell models; the same plan runs bit-exact against
the integer model first), writing every net's toggle count and time at 1 (SAIF), and
OpenROAD's timer takes them as the activity of each net's driving cell pin, by name, on:

* after `make pnr`: the routed netlist (``pnr/layer.v``, names as in the database) on the
  routed database with the extracted SPEF: post-route energy;
* before it (``--synth``): the synthesised netlist, no wires: pre-layout energy.

**The window.**  A steady state: ``warmup`` tokens out first (the pipeline full), then
``tokens`` more.  Verilator's SAIF counts from time 0 whenever it is opened and ignores
$dumpoff, so the window is a difference: two activity runs of one plan (the same inputs
and stalls: one simulation's prefixes) stop at the warmup-th and at the
(warmup + tokens)-th token out, each gives its energy from time 0 (average power times
its length), and the window's energy is the second minus the first.  Switching and
internal energy are sums over toggles and the leakage a sum over time, so the difference
is exact; the per-block figures are the same difference over each block's cells
(flow/categories.py, the area report's categories).

**Annotation.**  Verilator inlines the cell models, so its SAIF has a scope per netlist
module and the nets in it, not the cells' pins that OpenSTA's ``read_saif`` looks up (it
annotates nothing here).  So the SAIF is read here, and each net's toggles are put on the
output pin of the cell that drives it (``sta::set_power_pin_activity`` on
``<instance path>/<pin>``, from the netlist and the Liberty's pin directions); OpenSTA carries
a driver's activity to the pins it drives.  Nets the simulator dropped, and pins
OpenROAD does not find, are counted in the metrics.

**Time.**  The bench clocks the chip at its own period (sim/cocotb/tb_layer.py
CLOCK_NS), not the config's; a zero-delay gate-level run does the same work at any
period, so the toggle rate is each net's toggles over the run's cycles at the config's
period (OpenSTA's power is energy per transition times transitions per second).

Metrics (with the stage as prefix, ``finish__`` or ``synth__``; docs/flow.md "Energy from
simulated activity"):
``power__activity__total`` W (the window's average), ``..__internal``, ``__switching``,
``__leakage``, ``power__activity__window__ns`` (at the config's clock),
``power__activity__tokens``, ``power__activity__warmup_tokens``,
``power__activity__energy_per_token__j`` and ``..__j__category:<key>``; the report
reports/power_activity_<stage>.rpt.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from moekda.errors import UserError

SCRIPT = Path(__file__).resolve().parent / "openroad" / "power.tcl"
DEFAULT_ACTIVITY = 0.1     # what the flow's activity-only figure uses (flow/sta.py)
PARTS = ("internal", "switching", "leakage", "total")


@dataclass(frozen=True)
class Window:
    """The measured tokens: from ``begin_ps`` to ``end_ps`` of the chip's clock (scaled),
    ``tokens`` tokens out after ``warmup`` tokens."""
    begin_ps: int
    end_ps: int
    tokens: int
    warmup: int = 0

    @property
    def ns(self) -> float:
        return (self.end_ps - self.begin_ps) / 1000.0


@dataclass(frozen=True)
class NetActivity:
    toggles: int
    high_ps: int       # time at 1


def read_saif(saif: Path, instance: str) -> tuple[int, dict[tuple[str, str], NetActivity]]:
    """(DURATION in the SAIF's time unit, {(module path below ``instance``, net): activity}):
    the nets of the scope named ``instance`` (u_layer) and of every scope below it, with
    Verilator's escapes (``a\\[3\\]``) taken out of the names."""
    duration = None
    nets: dict[tuple[str, str], NetActivity] = {}
    stack: list[tuple[str, int]] = []         # (instance, the depth its "(" opened)
    depth = 0
    with saif.open(errors="replace") as f:
        for line in f:
            text = line.strip()
            if text.startswith("(INSTANCE"):
                depth += 1
                stack.append((text.split()[1], depth))
                continue
            if text.startswith("(DURATION"):
                duration = int(text.split()[1].rstrip(")"))
            elif text.startswith("(") and "(TC " in text:
                names = [n for n, _ in stack]
                if instance in names:
                    name = text[1:text.index(" ")].replace("\\", "")
                    t1 = int(text.split("(T1 ")[1].split(")")[0])
                    tc = int(text.split("(TC ")[1].split(")")[0])
                    nets[("/".join(names[names.index(instance) + 1:]), name)] = NetActivity(tc, t1)
            depth += (text.count("(") - text.count("\\(")) - (text.count(")") - text.count("\\)"))
            while stack and depth < stack[-1][1]:
                stack.pop()
    if duration is None:
        raise UserError(f"{saif}: no DURATION")
    if not nets:
        raise UserError(f"{saif}: no scope {instance} in it")
    return duration, nets


_MODULE = re.compile(r"^module\s+\\?(\S+)\s*\((.*?)^endmodule", re.S | re.M)
_CELL = re.compile(r"^\s*(\S+)\s+(\\?\S+)\s*\((.*?)\);", re.S | re.M)
_CONN = re.compile(r"\.(\w+)\(\s*(\\?[^()]*?)\s*\)")


def driver_pins(netlist_text: str, outputs: dict[str, frozenset[str]]) -> list[tuple[str, str, str]]:
    """(module path, pin path, net) for every output pin of a library cell in a hierarchical
    Yosys netlist (a module named ``top.a.b`` is the instance a/b, as Amaranth names them);
    ``outputs``: each library cell's output pins (flow/liberty.py)."""
    out = []
    for mm in _MODULE.finditer(netlist_text):
        path = "/".join(mm.group(1).split(".")[1:])
        for cell in _CELL.finditer(mm.group(2)):
            kind, inst = cell.group(1), cell.group(2).lstrip("\\")
            pins = outputs.get(kind)
            if not pins:
                continue
            for pin, net in _CONN.findall(cell.group(3)):
                if pin in pins and net and not net.startswith("{"):
                    out.append((path, f"{path}/{inst}/{pin}" if path else f"{inst}/{pin}",
                                net.lstrip("\\").replace(" ", "")))
    return out


def pin_activities(saif: Path, instance: str, netlist_text: str, outputs: dict[str, frozenset[str]],
                   period_s: float, saif_period: float, dst: Path) -> tuple[int, int]:
    """Write ``dst``: one line per driving pin, ``<pin path> TAB <toggles per second> TAB
    <duty>``, the net's toggles over the run's cycles (``saif_period``: a clock cycle in the
    SAIF's time unit) at ``period_s`` a cycle.  Returns (pins written, driving pins whose net
    the SAIF does not have)."""
    duration, nets = read_saif(saif, instance)
    seconds = duration / saif_period * period_s
    written = missing = 0
    with dst.open("w") as f:
        for module, pin, net in driver_pins(netlist_text, outputs):
            act = nets.get((module, net))
            if act is None:
                missing += 1
                continue
            f.write(f"{pin}\t{act.toggles / seconds:.6g}\t{min(1.0, act.high_ps / duration):.6g}\n")
            written += 1
    return written, missing


def _tcl(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[list " + " ".join(_tcl(v) for v in value) + "]"
    text = str(value)
    return "{" + text + "}" if text else "{}"


def openroad_power(openroad: str, settings: dict[str, object], workdir: Path, log: Path) -> dict[str, float]:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir.resolve() / "power_config.tcl"
    cfg.write_text("# generated by flow/power.py\n" + "".join(f"set ::pwr({k}) {_tcl(v)}\n"
                                                               for k, v in settings.items()))
    env = dict(os.environ, MOEKDA_POWER_CONFIG=str(cfg))
    with log.open("w") as out:
        proc = subprocess.run([openroad, "-exit", "-no_init", str(SCRIPT)], stdout=out,
                              stderr=subprocess.STDOUT, env=env, cwd=workdir)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise UserError(f"power: openroad failed (exit {proc.returncode}); see {log}: " + " | ".join(tail))
    from flow.pnr import read_metrics_file
    metrics = read_metrics_file(Path(settings["METRICS"]))
    return metrics


def read_blocks(path: Path) -> dict[str, float]:
    """Category key -> power (W) from power.tcl's per-parent table (``parent<TAB>kind<TAB>W``,
    kind ``macro`` for SRAM macros, which are their own category wherever they sit)."""
    from flow.categories import MACROS, TOP, category_of
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        parent, kind, watts = line.split("\t")
        key = MACROS if kind == "macro" else category_of(parent or TOP)
        out[key] = out.get(key, 0.0) + float(watts)
    return out


def window_energy(stage: str, first: dict[str, float], last: dict[str, float], blocks_first: dict[str, float],
                  blocks_last: dict[str, float], window: Window, t_first_ns: float, t_last_ns: float) -> dict:
    """The window's metrics from two runs' average powers (W) over [0, t_first] and [0,
    t_last] (ns at the chip's clock): energy = P_last t_last - P_first t_first."""
    p = f"{stage}__power__activity"
    ns = t_last_ns - t_first_ns
    out: dict[str, object] = {f"{p}__window__ns": ns, f"{p}__tokens": window.tokens,
                              f"{p}__warmup_tokens": window.warmup}
    for part in PARTS:
        joules = (last[part] * t_last_ns - first[part] * t_first_ns) * 1e-9
        out[f"{p}__{part}" if part != "total" else f"{p}__total"] = joules / (ns * 1e-9)
        if part == "total":
            out[f"{p}__energy_per_token__j"] = joules / window.tokens
    for key in sorted(set(blocks_first) | set(blocks_last)):
        joules = (blocks_last.get(key, 0.0) * t_last_ns - blocks_first.get(key, 0.0) * t_first_ns) * 1e-9
        out[f"{p}__energy_per_token__j__category:{key}"] = joules / window.tokens
    return out


def power_from_saif(build, kit, openroad: str, routed: bool, first, last, period_ns: float,
                    bench_period_ns: float) -> dict[str, object]:
    """The window between two activity runs (run/driver.py ActivityStop ``first`` and
    ``last``, at the bench's clock of ``bench_period_ns``) on the design clocked at
    ``period_ns``; the metrics, also merged into metrics.json."""
    from flow.liberty import read_cells
    from flow.pnr import PnrPaths, merge_metrics
    from flow.synth import macros_used
    pnr = PnrPaths(build)
    stage = "finish" if routed else "synth"
    work = Path(last.saif).parent.resolve()
    text = netlist_text(build, routed)
    outputs = {name: cell.outputs for name, cell in read_cells(kit.liberty).items()}
    tables, blocks, coverage = [], [], {}
    for name, run in (("first", first), ("last", last)):
        table = work / f"activity_{name}.tsv"
        written, missing = pin_activities(Path(run.saif), f"u_{build.top}", text, outputs, period_ns * 1e-9,
                                          bench_period_ns * 1000.0, table)
        coverage[name] = (written, missing)
        tables += [name, table]
        blocks.append(work / f"blocks_{name}.tsv")
    macros = macros_used([text], kit)
    settings = {
        "LIB_FILES": [kit.liberty, *(m.liberty for m in macros)],
        # a netlist with SRAM macros links only with their LEF masters too (ORD-2013)
        "TECH_LEF": kit.tech_lef, "CELL_LEF": kit.cell_lef, "MACRO_LEFS": [m.lef for m in macros],
        "DESIGN_KIND": "odb" if routed else "verilog",
        "DESIGN": pnr.final_odb if routed else build.netlist,
        "TOP": build.top,
        "SDC_FILE": pnr.final_sdc if routed else build.sdc,
        "SPEF": pnr.final_spef if routed else "",
        "DEFAULT_ACTIVITY": DEFAULT_ACTIVITY,
        "ACTIVITIES": tables,
        "BLOCKS_first": blocks[0], "BLOCKS_last": blocks[1],
        "REPORT": build.reports / f"power_activity_{stage}.rpt",
        "METRICS": work / "power.metrics",
    }
    power = openroad_power(openroad, settings, work, build.log(f"power_{stage}"))
    runs = {name: {part: power[f"power__activity__{name}__{part}"] for part in PARTS} for name in ("first", "last")}
    scale = period_ns / bench_period_ns
    t_first, t_last = first.time_ps * scale / 1000.0, last.time_ps * scale / 1000.0
    window = Window(round(first.time_ps * scale), round(last.time_ps * scale), last.tokens - first.tokens,
                    first.tokens)
    metrics = window_energy(stage, runs["first"], runs["last"], read_blocks(blocks[0]), read_blocks(blocks[1]),
                            window, t_first, t_last)
    metrics[f"{stage}__power__default__total"] = power["power__default__total"]
    p = f"{stage}__power__activity"
    metrics[f"{p}__annotated_pins"] = int(power.get("power__activity__last__annotated_pins", 0))
    metrics[f"{p}__pins_not_found"] = int(power.get("power__activity__last__pins_not_found", 0))
    metrics[f"{p}__nets_not_simulated"] = coverage["last"][1]
    merge_metrics(build.metrics, metrics)
    return metrics


def netlist_text(build, routed: bool) -> str:
    from flow.pnr import PnrPaths
    path = PnrPaths(build).final_netlist if routed else build.netlist
    return path.read_text() if path.is_file() else ""


def design_files(build, routed: bool) -> tuple[Path, str]:
    """(the netlist to simulate, the metric stage) after checking every file the step reads."""
    from flow.pnr import PnrPaths
    pnr = PnrPaths(build)
    if routed:
        needed = (pnr.final_netlist, pnr.final_odb, pnr.final_spef, pnr.final_sdc)
        hint = "run `make pnr` first (or --synth for the pre-layout figure)"
    else:
        needed = (build.netlist, build.sdc)
        hint = "run `make synth` first"
    missing = [p for p in needed if not p.is_file()]
    if missing:
        raise UserError(f"power: no {missing[0]}; {hint}")
    return needed[0], "finish" if routed else "synth"
