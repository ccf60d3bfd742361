"""The human page: build/<cfg>/reports/report.md, with its PNG plots.

Built only from metrics.json and the raw reports next to it, so
`moekda report` can rebuild it at any time without rerunning a tool.
"""
from __future__ import annotations

import math
from pathlib import Path

from flow.categories import UNMAPPED, category_areas, titles
from flow.metrics import block_areas, read as read_metrics, split_stats
from flow.orfs_reference import ORFS_DATA, read_orfs_data
from flow.paths import BuildPaths
from flow.sta import (IO_SHARE, REPORTS, TimingPath, block_of, parse_endpoints, parse_paths,
                      parse_registers)
from flow.synth import SynthStats, read_stats
from pdk.kit import PLATFORM

AREA_PLOT = "area_by_block.png"
SLACK_PLOT = "slack_histogram.png"
TOP_CELL_TYPES = 25


def _fmt(v, digits=3, unit=""):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{digits}f}{unit}"
    return f"{v:,}{unit}" if isinstance(v, int) else f"{v}{unit}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out + [""]


def _point(name: str, kind: str, registers: dict[str, str]) -> str:
    """'engine: acc[3] (engine/_123_)' -- block, then the RTL signal when known."""
    if "port" in kind:
        return f"port `{name}`"
    # a register is reported by instance (engine/_123_); show the signal it holds
    signal = registers.get(name)
    return f"{block_of(name)}: `{signal or name}`"


def _depth(path: TimingPath) -> int:
    """Cells on a path (each appears with an input and an output pin)."""
    return len({pin.rsplit("/", 1)[0] for pin, _cell, _t in path.cells})


# ---------------------------------------------------------------- plots

def _plot_area(blocks: dict[str, tuple[float, int, float]], out: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    items = sorted(blocks.items(), key=lambda kv: kv[1][0])
    names = [k for k, _ in items]
    comb = [a - s for _, (a, _c, s) in items]
    seq = [s for _, (_a, _c, s) in items]
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(items) + 1.5))
    ax.barh(names, seq, label="sequential", color="#4c72b0")
    ax.barh(names, comb, left=seq, label="combinational", color="#dd8452")
    ax.set_xlabel("cell area (um²)")
    ax.set_title("Synthesised area by block")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _plot_slack(slacks: list[float], period: float, out: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    bins = 40
    neg = [s for s in slacks if s < 0]
    pos = [s for s in slacks if s >= 0]
    lo, hi = min(slacks + [0.0]), max(slacks + [0.0])
    width = (hi - lo) / bins or 0.01
    first = math.floor(lo / width)  # bin edges on multiples of width: 0 is an edge
    edges = [(first + i) * width for i in range(math.ceil(hi / width) - first + 1)]
    ax.hist([neg, pos], bins=edges, stacked=True, color=["#c44e52", "#55a868"],
            label=["violating", "met"])
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel(f"setup slack per endpoint (ns), clock {period:g} ns")
    ax.set_ylabel("endpoints")
    ax.set_title("Endpoint slack histogram (synthesis, ideal clock, no wires)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- sections

def _summary(m: dict) -> list[str]:
    power_mw = m["power__total"] * 1e3 if m["power__total"] is not None else None
    rows = [
        ["clock period", f"{m['clock__period']:g} ns ({1000 / m['clock__period']:.0f} MHz)"],
        ["cell area", _fmt(m["synth__design__instance__area"], 1, " um²")],
        ["cells", _fmt(m["synth__design__instance__count"])],
        ["sequential area", _fmt(m["synth__design__instance__area__sequential"], 1, " um²")
         + f" ({_fmt(m['synth__design__instance__count__sequential'])} flip-flops)"],
        ["setup WNS / TNS", f"{_fmt(m['timing__setup__ws'])} ns / {_fmt(m['timing__setup__tns'])} ns"
         f" ({m['timing__setup__endpoints__violating']} of {m['timing__setup__endpoints']} endpoints violating)"],
        ["hold worst slack / TNS", f"{_fmt(m['timing__hold__ws'])} ns / {_fmt(m['timing__hold__tns'])} ns"],
        ["Fmax (register to register)", _fmt(m["fmax"], 1, " MHz")],
        ["Fmax allowed by IO paths", _fmt(m["fmax__io_limited"], 1, " MHz")],
        [f"power (activity {m['power__activity']:g})", _fmt(power_mw, 3, " mW")],
    ]
    if m.get("synth__power__activity__total") is not None:
        rows.append([_activity_label(m, "synth"), _activity_value(m, "synth")])
    return ["## Summary", ""] + _table(["quantity", "value"], rows + _post_route_rows(m))


def _activity_label(m: dict, stage: str) -> str:
    p = f"{stage}__power__activity"
    return (f"power from simulated activity ({m.get(p + '__tokens')} tokens after {m.get(p + '__warmup_tokens')}, "
            "`moekda power`)")


def _activity_value(m: dict, stage: str) -> str:
    p = f"{stage}__power__activity"
    e = m.get(p + "__energy_per_token__j")
    return _fmt(m[p + "__total"] * 1e3, 3, " mW") + ("" if e is None else f", {_fmt(e * 1e9, 2)} nJ per token")


def _post_route_rows(m: dict) -> list[list[str]]:
    """After `moekda pnr` (and `moekda power`, `moekda drc`) the same quantities after routing:
    they beat the synthesis figures above, which have no wires and an ideal clock."""
    if m.get("finish__timing__fmax") is None:
        return []
    mw = lambda k: None if m.get(k) is None else m[k] * 1e3      # noqa: E731
    rows = [["**after routing**: Fmax (extracted parasitics, propagated clock)",
             _fmt(m["finish__timing__fmax"] / 1e6, 1, " MHz")],
            ["after routing: setup WNS / hold worst slack",
             f"{_fmt(m.get('finish__timing__setup__ws'))} ns / {_fmt(m.get('finish__timing__hold__ws'))} ns"],
            ["after routing: cell area (with buffers, taps, fill excluded) / utilisation",
             _fmt(m.get("finish__design__instance__area"), 1, " um²")
             + f" / {_fmt(100 * m.get('finish__design__instance__utilization', 0), 1, ' %')}"],
            ["after routing: power (activity 0.1)", _fmt(mw("finish__power__total"), 3, " mW")]]
    if m.get("finish__power__activity__total") is not None:
        rows.append(["after routing: " + _activity_label(m, "finish"), _activity_value(m, "finish")])
    rows.append(["after routing: DRC (router / KLayout deck)",
                 f"{_fmt(m.get('route__drc_errors'))} / {_fmt(m.get('drc__klayout__violations'))}"])
    return rows


def _area_section(stats: SynthStats, m: dict, reports: Path) -> list[str]:
    """``stats`` carries the hierarchy (for a flat run: its hierarchical pass)."""
    blocks = block_areas(stats)
    total = stats.area() or 1.0
    rows = [[f"`{b}`", _fmt(a, 1), f"{100 * a / total:.1f} %", _fmt(c), _fmt(s, 1)]
            for b, (a, c, s) in sorted(blocks.items(), key=lambda kv: -kv[1][0])]
    rows.append(["**total**", _fmt(total, 1), "100 %", _fmt(stats.count()), _fmt(stats.sequential_area(), 1)])
    _plot_area(blocks, reports / AREA_PLOT)
    lines = ["## Area by block", "",
             "A block is a first-level instance of the top (Amaranth names each submodule's "
             "module after its instance path, and synthesis keeps that hierarchy); `(top)` is "
             "the top module's own glue logic.  Cell area from the liberty file, before "
             "placement (no fill, taps or buffers added by place and route).", ""]
    if m.get("flow__synth__flatten"):
        lines += [f"**This run was synthesised flat** for timing (total {_fmt(m['synth__design__instance__area'], 1)}"
                  " um²); the split below comes from a second, hierarchical pass of the same script "
                  "(`synth_stat_blocks.txt`), so its total differs from the flat netlist's.", ""]
    lines += _table(["block", "area um²", "share", "cells", "sequential um²"], rows)
    lines += [f"![area by block]({AREA_PLOT})", ""]
    deeper = [(p, mod) for p, mod in stats.instances() if p.count("/") == 1]
    if deeper:
        lines += ["Second level:", ""]
        lines += _table(["instance", "area um²", "cells"],
                        [[f"`{p}`", _fmt(stats.area(mod), 1), _fmt(stats.count(mod))]
                         for p, mod in sorted(deeper, key=lambda pm: -stats.area(pm[1]))])
    return lines


def _category_section(stats: SynthStats, m: dict | None = None) -> list[str]:
    """Area by the issue's functional categories, from the declared table in flow/categories.py;
    with `moekda power`'s figures in ``m`` (after routing, else before it) each category's
    energy per token from simulated activity beside its area."""
    cats = category_areas(stats)
    total = stats.area() or 1.0
    names = titles()
    m = m or {}
    stage = next((s for s in ("finish", "synth") if m.get(f"{s}__power__activity__energy_per_token__j") is not None),
                 None)
    energy = {}
    if stage:
        key = f"{stage}__power__activity__energy_per_token__j__category:"
        energy = {k[len(key):]: v for k, v in m.items() if k.startswith(key)}
    rows = [[names[k], f"`{k}`", _fmt(c.area, 1), f"{100 * c.area / total:.1f} %", _fmt(c.cells),
             _fmt(c.sequential, 1)] + ([_fmt(energy.get(k, 0.0) * 1e9, 3)] if stage else [])
            + [", ".join(f"`{p}`" for p in c.instances) or "-"]
            for k, c in cats.items()]
    rows.append(["**total**", "", _fmt(sum(c.area for c in cats.values()), 1), "100 %",
                 _fmt(sum(c.cells for c in cats.values())), _fmt(sum(c.sequential for c in cats.values()), 1)]
                + ([_fmt(m[f"{stage}__power__activity__energy_per_token__j"] * 1e9, 3)] if stage else []) + [""])
    lines = ["## Area by category", "",
             "Each instance's own cells (not its children's) go to the first category of the table "
             "in `flow/categories.py` whose pattern matches its path; `unmapped` collects the rest "
             "and is always listed.  **KDA state** is the named submodule `datapath/kda/delta/mem` "
             "(hw/kda/state.py: the state registers, their write decode and the registered one-hot read select and AND-OR tree); the "
             "delta rule's arithmetic is KDA datapath.  The top's own logic `(top)` (the token "
             "buffers of both stages, their FSMs and counters) is counted with the residual adds.  "
             "metrics.json: `synth__design__instance__area__category:<key>`.", ""]
    if cats[UNMAPPED].cells:
        lines += [f"**{cats[UNMAPPED].cells} cells are unmapped**: extend the table in flow/categories.py.", ""]
    if stage:
        lines += [f"Energy per token: `moekda power`{' (routed chip)' if stage == 'finish' else ' --synth (no wires)'}, "
                  f"{m.get(f'{stage}__power__activity__tokens')} tokens after "
                  f"{m.get(f'{stage}__power__activity__warmup_tokens')} from simulated activity "
                  "(flow/power.py); metrics.json: "
                  f"`{stage}__power__activity__energy_per_token__j__category:<key>`.", ""]
    header = ["category", "key", "area um²", "share", "cells", "sequential um²"]
    header += ["energy per token nJ"] if stage else []
    return lines + _table(header + ["instances"], rows)


def _cell_section(stats: SynthStats) -> list[str]:
    cells = stats.flat_cells()
    total = stats.area() or 1.0
    ranked = sorted(cells.items(), key=lambda kv: -kv[1] * stats.cell_area[kv[0]])
    rows = [[f"`{c}`", _fmt(n), _fmt(n * stats.cell_area[c], 1), f"{100 * n * stats.cell_area[c] / total:.1f} %"]
            for c, n in ranked[:TOP_CELL_TYPES]]
    lines = ["## Cell-type usage", "",
             f"{len(cells)} cell types; the {min(TOP_CELL_TYPES, len(cells))} largest by area "
             "(full list per module in `synth_stat.txt`):", ""]
    return lines + _table(["cell", "count", "area um²", "share"], rows)


def _timing_section(m: dict, paths: BuildPaths, registers: dict[str, str]) -> list[str]:
    period = m["clock__period"]
    io = PLATFORM.io_delay_fraction
    lines = ["## Timing", "",
             f"OpenSTA, typical corner, ideal clock, no wire load (before placement).  Clock "
             f"{period:g} ns; every input and output carries an external delay of {io:.0%} of the "
             f"period ({m['clock__io_delay']:g} ns), as ORFS does.", "",
             "**Fmax** is taken from the worst register-to-register path: with an ideal clock it "
             f"needs `period - slack` = {period:g} - ({_fmt(m['timing__setup__ws__path:reg2reg'])}) ns.  "
             "IO paths are left out of Fmax because their budget scales with the period; the "
             "period each IO class would need is `period - slack / share`, with share "
             + ", ".join(f"{s:.1f} for {k}" for k, s in IO_SHARE.items())
             + "; the worst of these gives *Fmax allowed by IO paths*.", ""]
    rows = [[k, _fmt(m.get(f"timing__setup__ws__path:{k}"))]
            for k in ("reg2reg", "in2reg", "reg2out", "in2out")]
    lines += _table(["path class", "worst setup slack ns"], rows)

    setup = parse_paths(paths.report(REPORTS["setup"]).read_text())
    lines += [f"### Critical paths (setup, worst path to each of the top {len(setup)} endpoints)", ""]
    lines += _table(["#", "slack ns", "arrival ns", "cells", "start", "end"],
                    [[i + 1, _fmt(p.slack), _fmt(p.arrival), _depth(p),
                      _point(p.startpoint, p.start_kind, registers), _point(p.endpoint, p.end_kind, registers)]
                     for i, p in enumerate(setup)])
    if setup:
        lines += ["Worst path, cell by cell (pin, cell, arrival ns):", "", "```"]
        lines += [f"{t:8.3f}  {c:12s} {pin}" for pin, c, t in setup[0].cells]
        lines += ["```", "", f"Full paths: `{REPORTS['setup']}`.", ""]

    slacks = [e.slack for e in parse_endpoints(paths.report(REPORTS["endpoints_setup"]).read_text())]
    if slacks:
        _plot_slack(slacks, period, paths.report(SLACK_PLOT))
        lines += [f"![slack histogram]({SLACK_PLOT})", ""]

    hold = parse_paths(paths.report(REPORTS["hold"]).read_text())[:5]
    lines += ["### Hold", "",
              "Hold with an ideal clock: real clock skew after CTS changes these numbers.", ""]
    lines += _table(["#", "slack ns", "start", "end"],
                    [[i + 1, _fmt(p.slack), _point(p.startpoint, p.start_kind, registers),
                      _point(p.endpoint, p.end_kind, registers)] for i, p in enumerate(hold)])
    return lines


def _power_section(m: dict) -> list[str]:
    rows = [[k, _fmt(m.get(f"power__{k}__total"), 6)] for k in ("internal", "switching", "leakage")]
    rows.append(["**total**", _fmt(m["power__total"], 6)])
    return ["## Power", "",
            f"OpenSTA `report_power` with `set_power_activity -global -activity {m['power__activity']:g} "
            "-duty 0.5`: every net toggles with that probability per clock cycle -- a stated "
            "assumption, not simulation activity (this OpenSTA has no VCD/SAIF reader).  "
            "Raw table: `power.rpt`.", ""] + _table(["component", "W"], rows)


def _orfs_section(m: dict) -> list[str]:
    lines = ["## Context: ORFS Nangate45 designs", ""]
    source, designs = read_orfs_data()      # in the repository: a damaged file is our bug
    lines += ["ORFS numbers are after place and route (their synth area is before); ours are "
              "synthesis only, ideal clock, so the WNS column compares unlike stages: expect ours "
              f"to lose some slack after placement and CTS.  Source: {source['repository']}, "
              f"{source['files']}, {source['version']} (kept in `flow/data/{ORFS_DATA.name}`).", ""]
    power = m["power__total"]
    ours = [f"**moekda {m['design__name']} ({m['config__name']})**", f"{m['clock__period']:g}",
            _fmt(m["synth__design__instance__area"], 0), "(synth only)",
            _fmt(m["synth__design__instance__count"]) + " (synth)", _fmt(m["timing__setup__ws"]),
            _fmt(power, 4) if power is not None else "n/a"]
    rows = [ours] + [[d.name, f"{d.clock_ns:g}", _fmt(d.synth_area_um2, 0), _fmt(d.final_area_um2, 0),
                      _fmt(d.final_cells), _fmt(d.wns_ns), f"{d.power_w:g}"] for d in designs]
    return lines + _table(["design", "clock ns", "synth area um²", "final area um²", "cells",
                           "WNS ns", "power W"], rows)


def build_report(paths: BuildPaths, liberty: Path) -> Path:
    """Write report.md and its plots from metrics.json and the raw reports."""
    m = read_metrics(paths.metrics)
    stats = read_stats(paths.synth_stat_json, liberty, paths.top)
    registers = parse_registers(paths.report(REPORTS["registers"]).read_text())
    lines = [f"# Synthesis report: `{m['design__name']}`, config `{m['config__name']}`", "",
             f"Config hash `{m['config__hash']}`; Yosys engine {m.get('flow__yosys__engine', 'n/a')}; "
             f"rebuild this page with `moekda report -c {m['config__name']}`.  Step times: "
             + ", ".join(f"{k.split('__')[1]} {v:.1f} s" for k, v in m.items()
                         if k.startswith("flow__") and k.endswith("__seconds")) + ".", ""]
    lines += _summary(m)
    split = split_stats(paths, liberty, bool(m.get("flow__synth__flatten")))
    lines += _area_section(split, m, paths.reports)
    if not paths.block:
        lines += _category_section(split, m)
    lines += _cell_section(stats)
    lines += _timing_section(m, paths, registers)
    lines += _power_section(m)
    lines += _orfs_section(m)
    lines += ["## Files", "",
              "Raw reports here: `synth_stat.txt` (Yosys `stat -liberty`, per module), "
              + ", ".join(f"`{v}`" for v in REPORTS.values())
              + ", `metrics.json`.  Logs (one per step): `" + str(paths.logs.relative_to(paths.root))
              + "/` and netlist, SDC and scripts: `synth/` under `" + str(paths.root) + "`.", ""]
    if paths.report("pnr.md").is_file():
        lines += ["Place and route (`moekda pnr`): [pnr.md](pnr.md).", ""]
    paths.report_md.write_text("\n".join(lines))
    return paths.report_md
