"""End to end on a small two-block design: Yosys (pyosys) + OpenSTA, then the
metrics and the page.  The parsers are checked on the reports this run
produces, and the numbers are cross-checked between tools and against the
clock period rather than against values copied from an earlier run."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from flow import report as report_mod
from flow.errors import FlowError
from flow.metrics import compute
from flow.paths import BuildPaths
from flow.sdc import Constraints
from flow.sta import REPORTS, parse_endpoints, parse_paths, parse_power, parse_registers, parse_summary, run_sta
from flow.synth import SynthOptions, read_stats, run_synth
from flow.synth_flow import FlowOptions, Steps, synth_and_sta
from flow.tests.designs import write_two_macs
from moekda.config import load_config
from pdk.kit import find_kit

TOP = "two_macs"
N_PATHS = 6


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = load_config("tiny")
    kit = find_kit()
    paths = BuildPaths.for_config(cfg, TOP, build_root=tmp_path_factory.mktemp("build")).make_dirs()
    write_two_macs(paths.rtl, TOP)
    seen = []
    steps = Steps(lambda s: seen.append(("start", s)), lambda s, t: seen.append(("end", s)))
    m = synth_and_sta(cfg, kit, paths, [paths.rtl], FlowOptions(n_paths=N_PATHS), steps)
    return dict(cfg=cfg, kit=kit, paths=paths, metrics=m, steps=seen)


def _text(paths, role):
    return paths.report(REPORTS[role]).read_text()


def test_every_step_ran_and_left_a_log(run):
    assert [s for kind, s in run["steps"] if kind == "end"] == ["synth", "sta", "metrics", "report"]
    for step in ("synth", "sta"):
        assert run["paths"].log(step).stat().st_size > 0
    assert "register names written" in run["paths"].log("sta").read_text()


def test_metrics_exist_with_orfs_names(run):
    m = json.loads(run["paths"].metrics.read_text())
    for key in ("synth__design__instance__area", "synth__design__instance__count", "timing__setup__ws",
                "timing__setup__tns", "timing__hold__ws", "clock__period", "fmax", "power__total"):
        assert m[key] is not None, key
    assert m["synth__design__instance__area"] > 0
    assert m["synth__design__instance__count"] > 0
    assert m["power__total"] > 0
    assert m["clock__period"] == run["cfg"].hw.clock_period_ns


def test_block_areas_add_up_and_twin_blocks_match(run):
    m = run["metrics"]
    blocks = {k.split(":", 1)[1]: v for k, v in m.items()
              if k.startswith("synth__design__instance__area__block:")}
    assert set(blocks) == {"(top)", "mac_a", "mac_b"}
    assert sum(blocks.values()) == pytest.approx(m["synth__design__instance__area"], abs=0.01)
    assert blocks["mac_a"] == pytest.approx(blocks["mac_b"], rel=0.05)  # same logic, mirrored ports
    # Yosys's own total in synth_stat.txt agrees with the sum over the liberty areas
    yosys_total = float(re.search(r"Chip area for top module '\\two_macs': ([\d.]+)",
                                  run["paths"].synth_stat.read_text()).group(1))
    assert yosys_total == pytest.approx(m["synth__design__instance__area"], abs=0.01)


def test_category_areas_add_up_and_unmapped_blocks_are_shown(run):
    """The two-MAC design has none of the chip's blocks: both MACs are unmapped (its top
    glue counts as the top's), and the page and metrics.json say so rather than dropping them."""
    m = run["metrics"]
    cats = {k.split(":", 1)[1]: v for k, v in m.items()
            if k.startswith("synth__design__instance__area__category:")}
    block = {k.split(":", 1)[1]: v for k, v in m.items() if k.startswith("synth__design__instance__area__block:")}
    assert sum(cats.values()) == pytest.approx(m["synth__design__instance__area"], abs=0.01)
    assert cats["unmapped"] == pytest.approx(block["mac_a"] + block["mac_b"], abs=0.01)
    assert cats["residual"] == pytest.approx(block["(top)"], abs=0.01)
    page = run["paths"].report_md.read_text()
    assert "## Area by category" in page and "cells are unmapped" in page


def test_synth_log_ends_with_time_per_pass(run):
    log = run["paths"].log("synth").read_text()
    tail = log[log.index("# wall time per script command"):]
    assert ". SYNTH" in tail and ". ABC" in tail and "# wall time per pass" in tail
    assert "time " in run["paths"].log("sta").read_text()   # the STA log's laps


def test_slack_is_consistent_with_the_period(run):
    paths, m = run["paths"], run["metrics"]
    period = m["clock__period"]
    r2r = parse_paths(_text(paths, "reg2reg"))[0]
    # required time = period - setup time of the capturing flip-flop (ideal clock)
    assert period - 0.1 < r2r.required < period
    assert r2r.required - r2r.arrival == pytest.approx(r2r.slack, abs=0.002)
    assert m["fmax"] == pytest.approx(1000.0 / (period - r2r.slack), abs=0.1)
    # an input path starts at the 20 % input delay
    in2reg = parse_paths(_text(paths, "in2reg"))[0]
    assert in2reg.cells[0][2] == pytest.approx(m["clock__io_delay"], abs=0.002)


def test_reg2reg_slack_moves_one_for_one_with_the_period(run, tmp_path):
    """Rerun STA on the same netlist at a longer period: ideal-clock reg-to-reg
    slack must grow by exactly the period change."""
    paths, kit, m = run["paths"], run["kit"], run["metrics"]
    longer = replace(paths, root=tmp_path)
    for d in (longer.synth_dir, longer.reports, longer.logs):
        d.mkdir(parents=True, exist_ok=True)
    longer.netlist.write_text(paths.netlist.read_text())
    cons = Constraints(period_ns=m["clock__period"] + 0.5, io_delay_ns=0.0)
    longer.sdc.write_text(cons.sdc_text())
    run_sta(kit, longer, cons, n_paths=1)
    slack = parse_paths(_text(longer, "reg2reg"))[0].slack
    assert slack == pytest.approx(m["timing__setup__ws__path:reg2reg"] + 0.5, abs=0.002)


def test_parsers_on_this_runs_reports(run):
    paths, m = run["paths"], run["metrics"]
    setup = parse_paths(_text(paths, "setup"))
    assert len(setup) == N_PATHS
    assert [p.slack for p in setup] == sorted(p.slack for p in setup)
    assert all(p.path_type == "max" for p in setup)
    summary = parse_summary(_text(paths, "summary"))
    assert setup[0].slack == pytest.approx(summary["worst slack"], abs=0.001)
    # one endpoint per flip-flop D pin plus one per output bit
    stats = read_stats(paths.synth_stat_json, run["kit"].liberty, TOP)
    n_ff = m["synth__design__instance__count__sequential"]
    assert n_ff == sum(n for c, n in stats.flat_cells().items() if c.startswith("DFF"))
    endpoints = parse_endpoints(_text(paths, "endpoints_setup"))
    assert len(endpoints) == n_ff + 24  # y is 24 bits wide
    assert min(e.slack for e in endpoints) == pytest.approx(summary["worst slack"], abs=0.001)
    tns = sum(min(e.slack, 0) for e in endpoints)
    assert tns == pytest.approx(summary["tns"], abs=0.001 * len(endpoints))
    hold = parse_paths(_text(paths, "hold"))
    assert hold and all(p.path_type == "min" for p in hold)
    power = parse_power(_text(paths, "power"))
    total = power["total"]
    assert total["total"] == pytest.approx(total["internal"] + total["switching"] + total["leakage"], rel=1e-3)
    assert total["total"] == pytest.approx(sum(power[g]["total"] for g in ("sequential", "combinational")),
                                           rel=1e-3)
    regs = parse_registers(_text(paths, "registers"))
    assert any(name.startswith("mac_a/acc[") for name in regs.values())


def test_power_grows_with_activity(run, tmp_path):
    paths, kit, m = run["paths"], run["kit"], run["metrics"]
    busy = replace(paths, root=tmp_path)
    for d in (busy.synth_dir, busy.reports, busy.logs):
        d.mkdir(parents=True, exist_ok=True)
    busy.netlist.write_text(paths.netlist.read_text())
    busy.sdc.write_text(paths.sdc.read_text())
    run_sta(kit, busy, Constraints.from_config(run["cfg"]), n_paths=1, activity=0.3)
    assert parse_power(_text(busy, "power"))["total"]["total"] > 1.5 * m["power__total"]


def test_report_page_and_plots(run):
    paths = run["paths"]
    page = paths.report_md.read_text()
    for heading in ("## Area by block", "## Cell-type usage", "## Timing", "### Critical paths",
                    "## Power", "## Context: ORFS Nangate45 designs"):
        assert heading in page
    assert "mac_a: `mac_a/" in page  # paths named by block and RTL signal
    for png in (report_mod.AREA_PLOT, report_mod.SLACK_PLOT):
        assert paths.report(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_has_the_orfs_table_and_its_source(run):
    """The ORFS figures come from the repository's data file (flow/orfs_reference.py), so every
    report has the table and names where the figures come from."""
    page = run["paths"].report_md.read_text()
    assert "| gcd | 0.46 |" in page and "| ariane133 | 4 |" in page
    assert "Source: The-OpenROAD-Project/OpenROAD-flow-scripts" in page


def test_metrics_carry_the_fingerprint_of_what_was_synthesised(run):
    """bench and sweep reuse a synthesis by its fingerprint: the Verilog file it read, the
    config, the cell library (flow/fingerprint.py)."""
    from flow.fingerprint import synthesis_fingerprint, verilog_digest
    m, paths, cfg = run["metrics"], run["paths"], run["cfg"]
    assert m["rtl__verilog_digest"] == verilog_digest(paths.rtl.read_text())
    assert m["rtl__fingerprint"] == synthesis_fingerprint(m["rtl__verilog_digest"], cfg.hash(), run["kit"])


def test_metrics_are_rebuilt_from_the_raw_reports(run):
    paths, cfg = run["paths"], run["cfg"]
    again = compute(paths, run["kit"].liberty, Constraints.from_config(cfg), cfg.name, cfg.hash(), 0.1)
    for k, v in again.items():
        assert run["metrics"][k] == v, k


def test_yosys_error_is_one_line_naming_the_log(tmp_path):
    cfg, kit = load_config("tiny"), find_kit()
    paths = BuildPaths.for_config(cfg, "broken", build_root=tmp_path).make_dirs()
    paths.rtl.write_text("module broken(input a, output b);\n  assign b = a &;\nendmodule\n")
    with pytest.raises(FlowError) as e:
        run_synth([paths.rtl], kit, paths, SynthOptions(top="broken", period_ns=1.0))
    msg = str(e.value)
    assert "\n" not in msg and str(paths.log("synth")) in msg and msg.startswith("yosys failed: ")


def test_a_second_run_on_the_same_top_is_refused(tmp_path):
    from flow.synth_flow import build_lock
    cfg = load_config("tiny")
    paths = BuildPaths.for_config(cfg, TOP, build_root=tmp_path).make_dirs()
    with build_lock(paths):
        with pytest.raises(FlowError, match="another `moekda synth`"):
            synth_and_sta(cfg, find_kit(), paths, [paths.rtl], FlowOptions(),
                          Steps(lambda s: None, lambda s, t: None))
    with build_lock(paths):  # released: free again
        pass


def test_summary_of_old_and_new_opensta():
    """OpenSTA 2019 (apt) and OpenROAD's sta word the summary differently; both parse."""
    old = "wns -0.012\ntns -0.340\nworst slack -0.012\n"
    new = "wns max -0.012\ntns max -0.340\nworst slack max -0.012\n"
    want = {"wns": -0.012, "tns": -0.34, "worst slack": -0.012}
    assert parse_summary(old) == parse_summary(new) == want


def test_summary_shows_the_routed_figures_once_a_run_exists():
    """No rows after routing until `moekda pnr` merged its finish__ metrics; then Fmax, slacks,
    area, both powers and both DRC counts, read from the ORFS-named keys."""
    assert report_mod._post_route_rows({}) == []
    m = {"finish__timing__fmax": 874.9e6, "finish__timing__setup__ws": 0.107, "finish__timing__hold__ws": 0.043,
         "finish__design__instance__area": 505114.8, "finish__design__instance__utilization": 0.514,
         "finish__power__total": 0.6275, "finish__power__activity__total": 0.4914,
         "finish__power__activity__energy_per_token__j": 8.6e-7, "finish__power__activity__tokens": 16,
         "finish__power__activity__warmup_tokens": 2, "route__drc_errors": 0, "drc__klayout__violations": 1}
    text = "\n".join(" | ".join(r) for r in report_mod._post_route_rows(m))
    for want in ("874.9 MHz", "0.107 ns / 0.043 ns", "505,114.8 um²", "51.4 %", "627.500 mW",
                 "491.400 mW, 860.00 nJ per token", "0 / 1"):
        assert want in text, want
