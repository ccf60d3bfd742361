"""`moekda pnr`: OpenROAD place and route of the synthesised netlist on Nangate45.

The stage scripts live in flow/openroad/, one per ORFS stage, and hold no
numbers: every value they read comes from ``build/<config>/pnr/config.tcl``,
which this module writes from the config (floorplan knobs), pdk/kit.py (kit
files, site, layers, power grid, cells) and the build paths.  Each stage runs
as its own ``openroad -exit -no_init`` process, reads the previous stage's
ODB and writes its own, with its log in ``build/<config>/logs/pnr_<stage>.log``.

After the last stage the post-route metrics (ORFS names: finish__timing__setup__ws,
finish__design__instance__area, route__drc_errors, finish__power__total, ...)
are merged into reports/metrics.json, and flow/gds.py merges the DEF with the
kit's cell GDS and draws a picture of the layout.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from flow.paths import BuildPaths
from moekda.errors import UserError
from moekda.config import Config
from pdk.kit import PLATFORM, Kit, Platform

SCRIPT_DIR = Path(__file__).resolve().parent / "openroad"
CONFIG_ENV = "MOEKDA_PNR_CONFIG"   # names config.tcl for common.tcl

OPENROAD_HELP = (
    "OpenROAD is not installed: `make pnr` needs the `openroad` binary on PATH, or OPENROAD=/path/to/openroad. "
    "Get it as a prebuilt release package (https://github.com/Precision-Innovations/OpenROAD/releases, "
    "Debian/Ubuntu .deb) or run inside the OpenROAD-flow-scripts container image "
    "(docker pull openroad/orfs, then `make pnr` there). "
    "Synthesis area, timing and power reports are still available: `make synth` and `make report`.")


@dataclass(frozen=True)
class Stage:
    name: str       # the moekda name: flow/openroad/<name>.tcl, logs/pnr_<name>.log
    step: str       # ORFS's step number, the prefix of the ODB it writes
    title: str      # for progress lines

    @property
    def script(self) -> Path:
        return SCRIPT_DIR / f"{self.name}.tcl"


# In run order; each script loads the ODB of the one before (load_design <previous>).
STAGES: tuple[Stage, ...] = (
    Stage("floorplan", "2_1", "floorplan, rows and tracks"),
    Stage("tapcell", "2_2", "well taps"),
    Stage("pdn", "2_3", "power grid"),
    Stage("pins", "3_2", "pin placement"),
    Stage("global_place", "3_3", "global placement"),
    Stage("resize", "3_4", "repair_design"),
    Stage("detail_place", "3_5", "detailed placement"),
    Stage("cts", "4_1", "clock tree synthesis and repair_timing"),
    Stage("global_route", "5_1", "global routing"),
    Stage("detail_route", "5_2", "detailed routing"),
    Stage("fill", "5_3", "fill cells"),
    Stage("final", "6", "parasitics, post-route STA, power, outputs"),
)


def stage_named(name: str) -> Stage:
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise KeyError(f"{name}: no such pnr stage ({', '.join(s.name for s in STAGES)})")


# The run's settings that trade quality of result for wall time, by mode, with ORFS's
# variable names.  "signoff" is the flow as it is measured and recorded; "fast"
# (`moekda pnr --fast`) is for exploring a floorplan or a config: global placement
# without timing (no repair_design per timing iteration: tiny's global placement is
# most of an hour of them), no repair on the global route's parasitics, and the
# detailed router stopped after DETAILED_ROUTE_END_ITERATION passes (OpenROAD's own
# default is 64) with whatever violations are left.  Its files are kept apart
# (pnr-fast/), so both can sit side by side.
# an instance of one of the library's integrated clock gates in a Verilog netlist
CLOCK_GATE_INSTANCE = re.compile(r"^\s*CLKGATE\w*\s+\S+\s*\(", re.M)

PNR_MODES: dict[str, dict[str, int]] = {
    "signoff": {"GPL_TIMING_DRIVEN": 1, "GPL_ROUTABILITY_DRIVEN": 1, "SKIP_INCREMENTAL_REPAIR": 0,
                "DETAILED_ROUTE_END_ITERATION": 64},
    "fast": {"GPL_TIMING_DRIVEN": 0, "GPL_ROUTABILITY_DRIVEN": 1, "SKIP_INCREMENTAL_REPAIR": 1,
             "DETAILED_ROUTE_END_ITERATION": 20},
}


@dataclass(frozen=True)
class PnrPaths:
    """Every file of a place-and-route run, under build/<config>/pnr/ (a fast run's
    under pnr-fast/, its logs pnr-fast_<stage>.log, its metrics its own)."""
    build: BuildPaths
    mode: str = "signoff"

    def __post_init__(self):
        if self.mode not in PNR_MODES:
            raise ValueError(f"pnr mode {self.mode!r}: one of {', '.join(PNR_MODES)}")

    @property
    def dir_name(self) -> str: return "pnr" if self.mode == "signoff" else f"pnr-{self.mode}"

    @property
    def root(self) -> Path:
        base = self.build.root / self.dir_name
        # a block run (a top other than the chip's) gets its own directory, as its reports do
        return base / self.build.top if self.build.block else base
    @property
    def reports(self) -> Path: return self.root / "reports"
    @property
    def config_tcl(self) -> Path: return self.root / "config.tcl"
    def odb(self, stage: Stage) -> Path: return self.root / f"{stage.step}_{stage.name}.odb"
    @property
    def stages_json(self) -> Path: return self.root / "stages.json"
    def log(self, stage: Stage) -> Path: return self.build.log(f"{self.dir_name}_{stage.name}")
    @property
    def metrics(self) -> Path:
        """Where the run's metrics go: the build's metrics.json (beside synthesis's, what
        bench and the report read) for sign-off, the run's own file otherwise."""
        return self.build.metrics if self.mode == "signoff" else self.root / "metrics.json"
    @property
    def summary(self) -> Path: return self.build.reports / f"{self.dir_name}.md"
    def pictures(self, stage: Stage | None = None) -> tuple[Path, Path]:
        """The blocks and density pictures (flow/layout_plot.py) of the routed layout, or of a stage."""
        stem = self.build.top + (f"-{stage.name}" if stage else "")
        return self.root / f"{stem}-blocks.png", self.root / f"{stem}-density.png"
    @property
    def final_odb(self) -> Path: return self.root / f"{self.build.top}.odb"
    @property
    def final_def(self) -> Path: return self.root / f"{self.build.top}.def"
    @property
    def final_netlist(self) -> Path: return self.root / f"{self.build.top}.v"
    @property
    def final_spef(self) -> Path: return self.root / f"{self.build.top}.spef"
    @property
    def final_sdc(self) -> Path: return self.root / f"{self.build.top}.sdc"
    @property
    def gds(self) -> Path: return self.root / f"{self.build.top}.gds"
    @property
    def png(self) -> Path: return self.root / f"{self.build.top}.png"
    @property
    def drc_report(self) -> Path: return self.reports / "5_route_drc.rpt"

    def make_dirs(self) -> "PnrPaths":
        for d in (self.root, self.reports, self.build.logs):
            d.mkdir(parents=True, exist_ok=True)
        return self


# ---- the settings the stage scripts read -------------------------------------------

def pnr_settings(cfg: Config, kit: Kit, paths: PnrPaths, netlist: Path, sdc: Path,
                 platform: Platform = PLATFORM, design_area_um2: float | None = None) -> dict[str, object]:
    """Every ::cfg(...) value of the stage scripts; the only place their numbers come from.
    ``design_area_um2`` (the netlist's cell area, macros included): sizes the macro placement."""
    pnr = cfg.pnr
    macros = macro_settings(cfg, kit, paths, netlist, platform, design_area_um2)
    # OpenROAD's sink clustering stops CTS with "CTS-0080 Sink not found" (26Q3-1551) on a
    # clock with SRAM macros or clock gates (model-tiny-sram: 16 macros and 825 gates in the
    # tree CTS builds for non-register sinks; the matrix-vector block with its 13 gates),
    # whatever -macro_clustering_size says; the plain H-tree down to 15 sinks a leaf builds
    # (docs/pnr.md, "Clock tree with macros and clock gates")
    text = netlist.read_text() if netlist.is_file() else ""
    clustering = not macros["MACRO_LEFS"] and not CLOCK_GATE_INSTANCE.search(text)
    settings: dict[str, object] = {
        "DESIGN_NAME": paths.build.top,
        **PNR_MODES[paths.mode],
        "TECH_LEF": kit.tech_lef,
        "CELL_LEF": kit.cell_lef,
        "LIB_FILES": (kit.liberty, *macros.pop("MACRO_LIBS")),
        **macros,
        "NETLIST": netlist,
        "CTS_SINK_CLUSTERING": int(clustering),
        "SDC_FILE": sdc,
        "REPORTS_DIR": paths.reports,
        # floorplan (initialize_floorplan takes percent, the config a fraction)
        "CORE_UTILIZATION": round(pnr.core_utilization * 100, 6),
        "CORE_ASPECT_RATIO": pnr.aspect_ratio,
        "CORE_MARGIN": pnr.core_margin_um,
        "PLACE_SITE": platform.site,
        "TRACKS": platform.tracks,
        # cells
        "TAPCELL": kit.tapcell,
        "TAPCELL_DISTANCE": pnr.tapcell_distance_um,
        "DONT_USE_CELLS": platform.dont_use_for(kit),
        "FILL_CELLS": platform.fill_cells,
        "TIE_HI": platform.tie_hi,
        "TIE_LO": platform.tie_lo,
        # antenna diodes on the nets without n-diffusion (flow/openroad/diodes.tcl)
        "ANTENNA_DIODE": platform.antenna_diode,
        "ANTENNA_DIODE_PORTS": int(pnr.antenna_diodes in ("ports", "ports+macros")),
        "ANTENNA_DIODE_MACROS": int(pnr.antenna_diodes == "ports+macros"),
        # power grid
        "POWER_NET": platform.power_net,
        "GROUND_NET": platform.ground_net,
        "PDN_RAIL": platform.pdn_rail,
        "PDN_STRAPS": platform.pdn_straps,
        "PDN_CONNECTS": platform.pdn_connects,
        "PDN_PIN_LAYER": platform.pdn_straps[-1][0],   # the top straps are the block's supply pins
        # pins, placement, parasitics, routing
        "PIN_LAYER_H": platform.pin_layer_h,
        "PIN_LAYER_V": platform.pin_layer_v,
        "PLACE_DENSITY": pnr.place_density,
        "SET_RC_TCL": kit.set_rc_tcl if kit.set_rc_tcl else "",
        "GRT_ADJUSTMENTS": platform.grt_layer_adjustments,
        "MIN_ROUTING_LAYER": platform.min_routing_layer,
        "MAX_ROUTING_LAYER": platform.max_routing_layer,
        "MIN_CLOCK_ROUTING_LAYER": platform.min_clock_routing_layer,
        "RCX_RULES": kit.rcx_rules if kit.rcx_rules else "",
        # outputs
        "FINAL_ODB": paths.final_odb,
        "FINAL_DEF": paths.final_def,
        "FINAL_NETLIST": paths.final_netlist,
        "FINAL_SPEF": paths.final_spef,
        "FINAL_SDC": paths.final_sdc,
    }
    for stage in STAGES:
        settings[f"ODB,{stage.name}"] = paths.odb(stage)
    return settings


def macro_settings(cfg: Config, kit: Kit, paths: PnrPaths, netlist: Path, platform: Platform,
                   design_area_um2: float | None) -> dict[str, object]:
    """The SRAM macros' settings (flow/macros.py): their LEFs and Liberty files, how they are
    placed (MACRO_PLACEMENT: "" none, "auto", or a Tcl file of place_macro lines), the halo,
    and the macro power grid.  A netlist without macros gets empty ones."""
    from flow.macros import column_placement, lef_size, netlist_macros, placement_tcl
    from flow.synth import macros_used
    text = netlist.read_text() if netlist.is_file() else ""
    used = macros_used([text], kit)
    out: dict[str, object] = {"MACRO_LEFS": tuple(m.lef for m in used), "MACRO_LIBS": tuple(m.liberty for m in used),
                              "MACRO_PLACEMENT": "", "MACRO_HALO": cfg.pnr.macro_halo_um,
                              "PDN_MACRO_HALO": platform.pdn_macro_halo_um,
                              "PDN_MACRO_STRAPS": platform.pdn_macro_straps,
                              "PDN_MACRO_CONNECTS": platform.pdn_macro_connects}
    if not used:
        return out
    how = cfg.pnr.macro_placement
    if how == "auto":
        out["MACRO_PLACEMENT"] = "auto"
    elif how != "column":
        from moekda.config import REPO_ROOT
        out["MACRO_PLACEMENT"] = REPO_ROOT / how
    else:
        if not design_area_um2:
            raise UserError("pnr: the macro placement needs the netlist's cell area (synthesis metrics): "
                            "run `make synth` first")
        # the core initialize_floorplan makes: area / utilisation, height / width = aspect ratio
        # (1 % short of it: the rows snap to whole sites and rows)
        core_h = (design_area_um2 / cfg.pnr.core_utilization * cfg.pnr.aspect_ratio) ** 0.5 * 0.99
        instances = netlist_macros(text, {m.name: lef_size(m.lef) for m in used})
        placed = column_placement(instances, core_h, cfg.pnr.macro_halo_um)
        path = paths.root / "macro_placement.tcl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(placement_tcl(cfg.name, placed))
        out["MACRO_PLACEMENT"] = path
    return out


_TCL_BARE = re.compile(r"^[A-Za-z0-9_./:+\-]+$")


def tcl_word(value) -> str:
    """One Tcl word for a Python value: numbers as they are, strings braced, sequences as [list ...]."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value!r}: not a finite number")
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        if _TCL_BARE.match(value):
            return value
        if "{" in value or "}" in value or "\\" in value:
            raise ValueError(f"{value!r}: braces and backslashes cannot be passed to the Tcl scripts")
        return "{" + value + "}"
    if isinstance(value, (tuple, list)):
        return "[list " + " ".join(tcl_word(v) for v in value) + "]" if value else "{}"
    raise TypeError(f"{value!r}: no Tcl form for {type(value).__name__}")


def config_tcl_text(settings: dict[str, object]) -> str:
    lines = ["# generated by flow/pnr.py from the config and pdk/kit.py; do not edit",
             "# read by flow/openroad/common.tcl as ::cfg(NAME)"]
    for name, value in settings.items():
        lines.append(f"set ::cfg({name}) {tcl_word(value)}")
    return "\n".join(lines) + "\n"


def write_config_tcl(settings: dict[str, object], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_tcl_text(settings))
    return path


# ---- running OpenROAD --------------------------------------------------------------

def find_openroad(env: dict[str, str] | None = None) -> str:
    """The openroad binary: $OPENROAD if set, else `openroad` on PATH; else a UserError saying how to get it."""
    env = os.environ if env is None else env
    named = env.get("OPENROAD")
    if named:
        found = shutil.which(named, path=env.get("PATH"))
        if not found:
            raise UserError(f"OPENROAD={named}: no such executable. " + OPENROAD_HELP)
        return found
    found = shutil.which("openroad", path=env.get("PATH"))
    if not found:
        raise UserError(OPENROAD_HELP)
    return found


def run_stage(openroad: str, stage: Stage, paths: PnrPaths, threads: int) -> float:
    """Run one stage; raise UserError naming its log if OpenROAD fails. Returns seconds."""
    env = dict(os.environ, **{CONFIG_ENV: str(paths.config_tcl)})
    log = paths.log(stage)
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run([openroad, "-exit", "-no_init", "-threads", str(threads), str(stage.script)],
                              stdout=out, stderr=subprocess.STDOUT, env=env, cwd=paths.root)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise UserError(f"pnr stage {stage.name} failed (exit {proc.returncode}); see {log}: "
                        + " | ".join(tail))
    return time.monotonic() - t0


# ---- reading the results -------------------------------------------------------------

_INF = 1e20   # OpenSTA reports an unconstrained slack as about 1e30


def read_metrics_file(path: Path) -> dict[str, float | int | None]:
    """A stage's `name value` lines: integers stay integers; an infinite slack (nothing
    constrained) becomes None."""
    metrics: dict[str, float | int | None] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        name, value = line.split(None, 1)
        try:
            metrics[name] = int(value)      # counts and flags: Tcl writes integers without a point
            continue
        except ValueError:
            number = float(value)
        metrics[name] = None if not math.isfinite(number) or abs(number) >= _INF else number
    return metrics


_DRT_VIOLATIONS = re.compile(r"Number of violations\s*=\s*(\d+)")
# the global router's final congestion table: "Total  <resource> <demand> <usage>%  <H> / <V> / <total>"
_GRT_OVERFLOW = re.compile(r"^Total\s+\d+\s+\d+\s+[\d.]+%\s+\d+\s*/\s*\d+\s*/\s*(\d+)\s*$", re.M)


def global_route_overflow(route_log: Path) -> int | None:
    """Overflowing global-routing edges left by the last route of the stage (None: no table)."""
    if not route_log.is_file():
        return None
    found = _GRT_OVERFLOW.findall(route_log.read_text(errors="replace"))
    return int(found[-1]) if found else None


def count_drc_violations(drc_report: Path, route_log: Path) -> int | None:
    """Routing DRC violations left: one `violation type:` entry each in the detailed router's
    report; if the router wrote no report, its last `Number of violations = N` log line."""
    if drc_report.is_file():
        return sum(1 for line in drc_report.read_text(errors="replace").splitlines()
                   if line.strip().lower().startswith("violation type:"))
    if route_log.is_file():
        counts = _DRT_VIOLATIONS.findall(route_log.read_text(errors="replace"))
        if counts:
            return int(counts[-1])
    return None


def merge_metrics(metrics_json: Path, new: dict[str, object], drop: tuple[str, ...] = ()) -> dict[str, object]:
    """Add the place-and-route metrics to reports/metrics.json, keeping what synthesis wrote
    (metrics whose name starts with one of `drop` are removed first: they describe a layout
    that no longer exists)."""
    merged: dict[str, object] = {}
    if metrics_json.is_file():
        merged = {k: v for k, v in json.loads(metrics_json.read_text()).items() if not k.startswith(drop)}
    merged.update(new)
    metrics_json.parent.mkdir(parents=True, exist_ok=True)
    metrics_json.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return merged


def collect_metrics(paths: PnrPaths) -> dict[str, object]:
    """Every stage's metrics file, plus the DRC count and the time each stage took."""
    metrics: dict[str, object] = {}
    for path in sorted(paths.reports.glob("*.metrics")):
        metrics.update(read_metrics_file(path))
    drc = count_drc_violations(paths.drc_report, paths.log(stage_named("detail_route")))
    if drc is not None:
        metrics["route__drc_errors"] = drc
    overflow = global_route_overflow(paths.log(stage_named("global_route")))
    if overflow is not None:
        metrics["globalroute__congestion__overflow"] = overflow
    metrics.update(stage_record_metrics(read_stage_records(paths)))
    return metrics


# ---- what each stage's run was: kept as it ends, so a run carried over several sessions
# (`moekda pnr --from STAGE` after an interrupted one) keeps every stage's wall time

def read_stage_records(paths: PnrPaths) -> dict[str, dict]:
    return json.loads(paths.stages_json.read_text()) if paths.stages_json.is_file() else {}


def start_stage_records(paths: PnrPaths, start: int) -> None:
    """A run from stage ``start``: the records of that stage and later ones are void (from 0:
    a new run, all of them)."""
    names = {s.name for s in STAGES[:start]}
    kept = {k: v for k, v in read_stage_records(paths).items() if k in names}
    paths.stages_json.write_text(json.dumps(kept, indent=2) + "\n")


def write_stage_record(paths: PnrPaths, stage: Stage, seconds: float) -> None:
    """A finished stage: its wall time, the commit its scripts ran at, when it ended."""
    import datetime
    from flow.provenance import git_commit
    records = read_stage_records(paths)
    commit, changed = git_commit()
    records[stage.name] = {"seconds": round(seconds, 1), "commit": commit, "working_tree_changed": changed,
                           "ended": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    paths.stages_json.write_text(json.dumps(records, indent=2) + "\n")


def stage_record_metrics(records: dict[str, dict]) -> dict[str, object]:
    """Each recorded stage's wall time (``pnr__<stage>__runtime__s``) and the run's commit:
    the first stage's; the working tree counts as changed if any stage's was, or if the
    stages ran at different commits (stages.json has each one's)."""
    metrics: dict[str, object] = {}
    ordered = [records[s.name] for s in STAGES if s.name in records]
    for s in STAGES:
        if s.name in records:
            metrics[f"pnr__{s.name}__runtime__s"] = records[s.name]["seconds"]
    if ordered:
        metrics["pnr__git_commit"] = ordered[0]["commit"]
        metrics["pnr__git_working_tree_changed"] = (any(r["working_tree_changed"] for r in ordered)
                                                    or len({r["commit"] for r in ordered}) > 1)
    return metrics


# ---- the report page's section -----------------------------------------------------------

SUMMARY_ROWS = (   # metric, label, unit, scale
    ("finish__design__instance__count", "cells (without fill)", "", 1),
    ("finish__design__instance__area", "cell area", "um2", 1),
    ("finish__design__core__area", "core area", "um2", 1),
    ("finish__design__instance__utilization", "utilisation", "%", 100),
    ("finish__timing__setup__ws", "worst setup slack", "ns", 1),
    ("finish__timing__setup__tns", "total negative setup slack", "ns", 1),
    ("finish__timing__hold__ws", "worst hold slack", "ns", 1),
    ("finish__power__total", "total power (activity 0.1 on the inputs)", "mW", 1000),
    ("finish__power__activity__total", "power from simulated activity, steady state (`moekda power`)", "mW", 1000),
    ("finish__power__activity__energy_per_token__j", "energy per token from simulated activity", "nJ", 1e9),
    ("route__drc_errors", "routing DRC violations", "", 1),
    ("finish__timing__fmax", "Fmax (worst setup path, propagated clock)", "MHz", 1e-6),
    ("finish__parasitics__extracted__nets", "nets with OpenRCX-extracted parasitics", "", 1),
    ("detailedroute__antenna__violating__nets", "antenna violations after routing", "", 1),
    ("globalroute__antenna__net_diodes", "antenna diodes on nets without n-diffusion (input ports, SRAM outputs)", "", 1),
    ("drc__klayout__violations", "KLayout DRC violations (`make drc`)", "", 1),
    ("drc__klayout__groups", "KLayout DRC rule groups checked", "", 1),
)


def summary_table(metrics: dict[str, object]) -> list[str]:
    """The post-route values as markdown table lines (SUMMARY_ROWS)."""
    lines = ["| | value |", "|---|---|"]
    for name, label, unit, scale in SUMMARY_ROWS:
        value = metrics.get(name)
        shown = "n/a" if value is None else (f"{value * scale:.4g}" if isinstance(value, float) else str(value))
        lines.append(f"| {label} | {shown}{' ' + unit if unit and value is not None else ''} |")
    return lines


def stage_files_line(paths: PnrPaths) -> str:
    return (f"Post-route values; every stage's report is in `{paths.reports.relative_to(paths.build.root)}/`, "
            f"its log in `logs/{paths.dir_name}_<stage>.log`.")


def summary_markdown(metrics: dict[str, object], paths: PnrPaths) -> str:
    """The place-and-route section of the report page (reports/pnr.md), from the merged metrics."""
    lines = ["## Place and route (OpenROAD, Nangate45)" + ("" if paths.mode == "signoff" else f", {paths.mode} mode"),
             "", stage_files_line(paths), "", *summary_table(metrics)]
    outputs = [p for p in (paths.final_odb, paths.final_def, paths.final_netlist, paths.final_spef, paths.gds)
               if p.is_file()]
    lines += ["", "Outputs: " + ", ".join(f"`{p.relative_to(paths.build.root)}`" for p in outputs) + "."]
    if paths.png.is_file():
        lines += ["", f"![layout]({os.path.relpath(paths.png, paths.build.reports)})"]
    return "\n".join(lines) + "\n"


# ---- the committed record of a real run ----------------------------------------------------

RECORD_PREFIXES = ("finish__", "route__", "detailedroute__", "globalroute__", "cts__", "pnr__", "drc__",
                   "synth__design__instance__area", "synth__design__instance__count")


def openroad_version(openroad: str) -> str:
    proc = subprocess.run([openroad, "-version"], capture_output=True, text=True, timeout=60)
    return (proc.stdout or proc.stderr).strip().splitlines()[0] if proc.returncode == 0 else "unknown"


def record(cfg: Config, build: BuildPaths, out_dir: Path, openroad_version_text: str,
           mode: str = "signoff") -> list[Path]:
    """bench/results/pnr-<cfg>[-<top>][-<mode>].{json,md,png} from the last run's metrics.json
    and picture, with the command, this repository's commit and the OpenROAD version."""
    from flow.provenance import provenance
    paths = PnrPaths(build, mode)
    if not paths.metrics.is_file():
        raise UserError(f"pnr --record: no {paths.metrics}; run `moekda pnr` first")
    metrics = json.loads(paths.metrics.read_text())
    if "finish__timing__setup__ws" not in metrics:
        raise UserError(f"pnr --record: {paths.metrics} holds no post-route metrics; run `moekda pnr` first")
    fast = mode != "signoff"
    name = f"pnr-{cfg.name}" + (f"-{build.top}" if build.block else "") + (f"-{mode}" if fast else "")
    command = (f"make synth pnr drc CONFIG={cfg.name}" + (f" TOP={build.top}" if build.block else "")
               if not fast else f"moekda pnr -c {cfg.name} --{mode}" + (f" --top {build.top}" if build.block else ""))
    rec = {"config": cfg.name, "config_hash": cfg.hash(), "top": build.top,
           "clock_period_ns": cfg.hw.clock_period_ns, "mode": mode, "mode_settings": PNR_MODES[mode],
           **provenance(command, openroad=openroad_version_text),
           # the commit the run itself was made at (the record may be written later)
           "run_commit": metrics.get("pnr__git_commit", "unknown"),
           "run_working_tree_changed": metrics.get("pnr__git_working_tree_changed"),
           "metrics": {k: v for k, v in sorted(metrics.items()) if k.startswith(RECORD_PREFIXES)}}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / f"{name}.json", out_dir / f"{name}.md"]
    written[0].write_text(json.dumps(rec, indent=2) + "\n")
    md = [f"# Place and route: {cfg.name}" + (f", {build.top}" if build.block else ""), "",
          f"`{command}` at commit `{str(rec['run_commit'])[:12]}`"
          + (" (working tree changed)" if rec["run_working_tree_changed"] else "")
          + f", {rec['date']}, {openroad_version_text}."
          + ("" if not fast else f"  Mode {mode}: " + ", ".join(f"{k} {v}" for k, v in PNR_MODES[mode].items())
             + " (flow/pnr.py PNR_MODES)."), "",
          stage_files_line(paths), "", *summary_table(metrics), "",
          "| stage | wall time s |", "|---|---|"]
    md += [f"| {s.name} | {metrics[f'pnr__{s.name}__runtime__s']:,.0f} |" for s in STAGES
           if f"pnr__{s.name}__runtime__s" in metrics]
    md.append(f"| total | {sum(metrics.get(f'pnr__{s.name}__runtime__s', 0) for s in STAGES):,.0f} |")
    if paths.png.is_file():
        shutil.copyfile(paths.png, out_dir / f"{name}.png")
        written.append(out_dir / f"{name}.png")
        md += ["", f"![layout]({name}.png)"]
    for picture, what in zip(paths.pictures(), ("blocks", "density")):
        if picture.is_file():
            target = out_dir / f"{name}-{what}.png"
            shutil.copyfile(picture, target)
            written.append(target)
            md += ["", f"![{what}]({target.name})"]
    written[1].write_text("\n".join(md) + "\n")
    return written


# ---- pictures a person reads ------------------------------------------------------------

def layout_pictures(cfg: Config, kit: Kit, paths: PnrPaths, def_path: Path, stage: Stage | None = None,
                    platform: Platform = PLATFORM) -> list[Path]:
    """The blocks and density pictures (flow/layout_plot.py) of a DEF of this run."""
    from flow.layout_plot import draw_pictures, bin_placement, lef_sizes, read_def_placement
    from flow.synth import macros_used
    netlist = paths.build.netlist
    macros = macros_used([netlist.read_text()], kit) if netlist.is_file() else []
    sizes = lef_sizes([kit.cell_lef, *(m.lef for m in macros)])
    binned = bin_placement(read_def_placement(def_path), sizes, {m.name for m in macros},
                           {kit.tapcell, *platform.fill_cells})
    title = f"{cfg.name}, " + (f"after {stage.name}" if stage else "routed") + \
        ("" if paths.mode == "signoff" else f" ({paths.mode})")
    blocks, density = paths.pictures(stage)
    return draw_pictures(binned, title, blocks, density, cfg.pnr.place_density)


def stage_pictures(cfg: Config, kit: Kit, openroad: str, paths: PnrPaths, stage: Stage) -> list[Path]:
    """The pictures of a stage's database: OpenROAD writes its DEF first (a placement to look at
    before the next hours of the flow)."""
    odb = paths.odb(stage)
    if not odb.is_file():
        raise UserError(f"pnr --pictures {stage.name}: no {odb}; run the flow to that stage first")
    def_path = paths.root / f"{stage.step}_{stage.name}.def"
    script = paths.root / "write_def.tcl"
    script.write_text(f"read_db {{{odb}}}\nwrite_def {{{def_path}}}\n")
    proc = subprocess.run([openroad, "-exit", "-no_init", str(script)], capture_output=True, text=True)
    if proc.returncode != 0 or not def_path.is_file():
        raise UserError(f"pnr --pictures: OpenROAD could not write {def_path}: "
                        + " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-2:]))
    return layout_pictures(cfg, kit, paths, def_path, stage)


# ---- the whole run -----------------------------------------------------------------

def check_inputs(netlist: Path, sdc: Path, kit: Kit):
    for what, path in (("netlist", netlist), ("constraints", sdc)):
        if not path.is_file():
            raise UserError(f"pnr: no {what} at {path}; run `make synth` (moekda synth) first")
    if kit.rcx_rules is None:
        raise UserError(f"pnr: the kit at {kit.root} has no rcx_patterns.rules: post-route parasitics "
                        "are extracted by OpenRCX from them (run `make setup`, or use an ORFS platform)")


_SPEF_NET = re.compile(rb"^\*D_NET\s", re.M)


def spef_net_count(spef: Path) -> int:
    """Nets with extracted parasitics in a SPEF (its *D_NET sections); 0 if there is no file."""
    return len(_SPEF_NET.findall(spef.read_bytes())) if spef.is_file() else 0


def synth_area(build: BuildPaths) -> float | None:
    """The synthesised netlist's cell area (macros included) from metrics.json, if any."""
    if not build.metrics.is_file():
        return None
    return json.loads(build.metrics.read_text()).get("synth__design__instance__area")


def run_pnr(cfg: Config, build: BuildPaths, kit: Kit, openroad: str, threads: int = 2,
            first: str | None = None, last: str | None = None, mode: str = "signoff",
            progress: Callable[[str], None] = print) -> dict[str, object]:
    """Run the stages (from `first` on, reusing the earlier stages' databases, to `last`), then,
    after the final stage, collect the metrics into metrics.json and reports/pnr.md and make
    the GDS and its picture.  A run that stops earlier returns the stages' wall times.
    ``mode``: a key of PNR_MODES (files of a non-sign-off run are kept apart, PnrPaths)."""
    check_inputs(build.netlist, build.sdc, kit)
    paths = PnrPaths(build, mode).make_dirs()
    names = [s.name for s in STAGES]
    start = names.index(stage_named(first).name) if first else 0
    stop = names.index(stage_named(last).name) + 1 if last else len(STAGES)
    if stop <= start:
        raise UserError(f"pnr --to {last}: it comes before --from {first}")
    if start > 0 and not paths.odb(STAGES[start - 1]).is_file():
        raise UserError(f"pnr --from {first}: no {paths.odb(STAGES[start - 1])} from stage "
                        f"{STAGES[start - 1].name}; run from an earlier stage")
    write_config_tcl(pnr_settings(cfg, kit, paths, build.netlist, build.sdc, design_area_um2=synth_area(build)),
                     paths.config_tcl)
    start_stage_records(paths, start)
    for i, stage in enumerate(STAGES[start:stop], start + 1):
        progress(f"pnr [{i}/{len(STAGES)}] {stage.name}: {stage.title} ...")
        seconds = run_stage(openroad, stage, paths, threads)
        write_stage_record(paths, stage, seconds)
        progress(f"pnr [{i}/{len(STAGES)}] {stage.name}: done in {seconds:.1f} s (log {paths.log(stage)})")
    if stop < len(STAGES):
        progress(f"pnr: stopped after {STAGES[stop - 1].name} (--to); `--from {STAGES[stop].name}` goes on")
        return stage_record_metrics(read_stage_records(paths))
    # every stage's wall time and the run's commit come from stages.json (collect_metrics)
    metrics = collect_metrics(paths)
    # OpenRCX without usable rules warns and writes an empty SPEF, exit code 0: the
    # post-route numbers would then be of unloaded wires, so the run fails here
    nets = spef_net_count(paths.final_spef)
    metrics["finish__parasitics__extracted__nets"] = nets
    if STAGES[-1].name == "final" and nets == 0:
        merge_metrics(paths.metrics, metrics)
        raise UserError(f"pnr: {paths.final_spef} holds no extracted nets (see {paths.log(STAGES[-1])}): "
                        "post-route timing and power would be of unloaded wires")
    # first: a GDS problem must not lose them; a new layout makes the last DRC and power stale
    merged = merge_metrics(paths.metrics, metrics, drop=("drc__", "finish__power__activity", "route__", "finish__"))
    # the GDS and the pictures are each drawn even if the other fails; the run says which
    missing = []
    try:
        from flow.gds import def_to_gds, gds_to_png
        def_to_gds(paths.final_def, kit, paths.gds)
        gds_to_png(paths.gds, paths.png, kit)
        progress(f"pnr: GDS {paths.gds}, picture {paths.png}")
    except UserError as e:
        missing.append(f"no GDS: {e}")
    try:
        progress("pnr: " + ", ".join(str(p) for p in layout_pictures(cfg, kit, paths, paths.final_def)))
    except UserError as e:
        missing.append(f"no layout pictures: {e}")
    paths.summary.write_text(summary_markdown(merged, paths))
    progress(f"pnr: metrics merged into {paths.metrics}; report section {paths.summary}")
    if missing:
        raise UserError("pnr: routed and reported, but " + "; ".join(missing))
    return metrics
