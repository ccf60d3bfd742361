"""The flow's numbers under ORFS-style names, in one flat dict -> metrics.json.

Names follow ORFS/OpenROAD's metrics (``stage__object__quantity``, a
qualifier after a colon): synth__design__instance__area, timing__setup__ws,
power__total, per block ``synth__design__instance__area__block:<name>`` and,
for the chip top, per functional category (flow/categories.py)
``synth__design__instance__area__category:<key>``.  SRAM macros (hw.state_memory =
"sram") are counted in those like any cell, at their Liberty area, and on their own in
``synth__design__instance__area__macros`` / ``__count__macros`` (and per macro kind,
``synth__design__instance__count__macro:<name>``); ``__area__stdcell`` is the rest.
Units are fixed and written into the file under "units".

Every value is read back from the raw reports (synth_stat.json, the STA
reports), never carried over from memory, so metrics.json always agrees
with the files next to it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from flow.categories import category_areas
from flow.paths import BuildPaths
from flow.sdc import Constraints
from flow.sta import IO_SHARE, REPORTS, parse_endpoints, parse_paths, parse_power, parse_summary
from flow.synth import SynthStats, read_stats

UNITS = {"area": "um2", "time": "ns", "power": "W", "fmax": "MHz", "runtime": "s"}


def _read(paths: BuildPaths, role: str) -> str:
    return paths.report(REPORTS[role]).read_text()


def _worst(paths: BuildPaths, role: str) -> float | None:
    found = parse_paths(_read(paths, role))
    return found[0].slack if found else None


def block_areas(stats: SynthStats) -> dict[str, tuple[float, int, float]]:
    """Block -> (area, cells, sequential area); a block is a first-level instance,
    '(top)' is the glue logic of the top module itself."""
    top = stats.modules[stats.top]
    out = {"(top)": (stats.own_area(stats.top), sum(top.cells.values()),
                     sum(n * stats.cell_area[c] for c, n in top.cells.items() if c in stats.sequential))}
    for path, module in stats.instances():
        if "/" not in path:
            out[path] = (stats.area(module), stats.count(module), stats.sequential_area(module))
    return out


def split_stats(paths: BuildPaths, liberty: Path, flatten: bool) -> SynthStats:
    """The statistics that carry the block hierarchy: the run's own, or for a
    flat run those of its hierarchical pass."""
    return read_stats(paths.synth_stat_blocks_json if flatten else paths.synth_stat_json,
                      liberty, paths.top)


def compute(paths: BuildPaths, liberty: Path, cons: Constraints, config_name: str,
            config_hash: str, activity: float, extra: dict | None = None,
            flatten: bool = False) -> dict:
    stats = read_stats(paths.synth_stat_json, liberty, paths.top)
    # the result's fingerprint (rtl__fingerprint) comes with ``extra`` from flow/synth_flow.py,
    # which knows the Verilog that was synthesised
    m: dict = {"design__name": paths.top, "config__name": config_name, "config__hash": config_hash,
               "units": UNITS}
    m["clock__period"] = cons.period_ns
    m["clock__io_delay"] = cons.io_delay_ns
    m["synth__design__instance__area"] = round(stats.area(), 3)
    m["synth__design__instance__count"] = stats.count()
    m["synth__design__instance__area__sequential"] = round(stats.sequential_area(), 3)
    m["synth__design__instance__count__sequential"] = sum(
        n for c, n in stats.flat_cells().items() if c in stats.sequential)
    m["synth__design__instance__area__macros"] = round(stats.macro_area(), 3)
    m["synth__design__instance__area__stdcell"] = round(stats.area() - stats.macro_area(), 3)
    m["synth__design__instance__count__macros"] = sum(stats.macro_cells().values())
    for name, n in sorted(stats.macro_cells().items()):
        m[f"synth__design__instance__count__macro:{name}"] = n
    m["synth__block_split__source"] = "hierarchical pass" if flatten else "this netlist"
    split = split_stats(paths, liberty, flatten)
    for block, (area, cells, _seq) in block_areas(split).items():
        m[f"synth__design__instance__area__block:{block}"] = round(area, 3)
        m[f"synth__design__instance__count__block:{block}"] = cells
    if not paths.block:   # the categories describe the chip's hierarchy (flow/categories.py)
        for key, cat in category_areas(split).items():
            m[f"synth__design__instance__area__category:{key}"] = round(cat.area, 3)
            m[f"synth__design__instance__count__category:{key}"] = cat.cells
            m[f"synth__design__instance__area__sequential__category:{key}"] = round(cat.sequential, 3)

    summary = parse_summary(_read(paths, "summary"))
    m["timing__setup__ws"] = summary["worst slack"]
    m["timing__setup__tns"] = summary["tns"]
    setup_ends = parse_endpoints(_read(paths, "endpoints_setup"))
    hold_ends = parse_endpoints(_read(paths, "endpoints_hold"))
    m["timing__setup__endpoints"] = len(setup_ends)
    m["timing__setup__endpoints__violating"] = sum(e.slack < 0 for e in setup_ends)
    m["timing__hold__ws"] = min((e.slack for e in hold_ends), default=None)
    m["timing__hold__tns"] = round(sum(min(e.slack, 0.0) for e in hold_ends), 3)
    m["timing__hold__endpoints__violating"] = sum(e.slack < 0 for e in hold_ends)

    # Fmax from the worst register-to-register path (ideal clock): it needs period - slack
    r2r = _worst(paths, "reg2reg")
    m["timing__setup__ws__path:reg2reg"] = r2r
    m["fmax"] = round(1000.0 / (cons.period_ns - r2r), 1) if r2r is not None else None
    # IO paths: the period at which each class would just meet, with IO delays scaling
    io_periods = []
    for role, share in IO_SHARE.items():
        ws = _worst(paths, role)
        m[f"timing__setup__ws__path:{role}"] = ws
        if ws is not None:
            io_periods.append(cons.period_ns - ws / share)
    m["fmax__io_limited"] = round(1000.0 / max(io_periods), 1) if io_periods else None

    power = parse_power(_read(paths, "power"))
    total = power.get("total", {})
    m["power__total"] = total.get("total")
    m["power__internal__total"] = total.get("internal")
    m["power__switching__total"] = total.get("switching")
    m["power__leakage__total"] = total.get("leakage")
    m["power__activity"] = activity
    m.update(extra or {})
    return m


def write(metrics: dict, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
    path.write_text(json.dumps(clean, indent=2) + "\n")


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())
