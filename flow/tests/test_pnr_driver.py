"""flow/pnr.py without OpenROAD: finding the binary, running the stages in
order with a log each, reading their results, merging metrics.json.

The end-to-end test puts a stand-in `openroad` on PATH: it runs each real
stage script under tclsh with the recording stand-ins of check.py (the fake
odb block holds one 0.19 x 1.4 um cell and a fill cell), and plays the two things only
OpenROAD makes here: the detailed router's DRC report and the final DEF.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from flow.openroad.check import stub_tcl
from flow.paths import BuildPaths
from flow.pnr import (STAGES, PnrPaths, stage_named, count_drc_violations, find_openroad, merge_metrics, read_metrics_file,
                      run_pnr)
import cli
from cli import UserError
from moekda.config import load_config
from pdk.kit import find_kit

FAKE_OPENROAD = r'''#!{python}
"""stand-in for openroad: run the stage script under tclsh with the recording stand-ins"""
import json, os, subprocess, sys
from pathlib import Path

assert sys.argv[1:4] == ["-exit", "-no_init", "-threads"], sys.argv
script = Path(sys.argv[-1])
stage = script.stem
if os.environ.get("FAKE_FAIL_STAGE") == stage:
    print(f"[ERROR GPL-0301] fake failure in {{stage}}")
    sys.exit(1)
state = Path(os.environ["FAKE_STATE"])
state.mkdir(parents=True, exist_ok=True)
written = json.loads((state / "written.json").read_text()) if (state / "written.json").exists() else []
calls = state / f"{{stage}}.jsonl"
driver = state / f"{{stage}}.tcl"
driver.write_text("source {{%s}}\nset ::stub_written [list %s]\nsource {{%s}}\nclose $::stub_out\n"
                  % (os.environ["FAKE_STUBS"], " ".join("{{%s}}" % w for w in written), script))
env = dict(os.environ, STUB_CALLS=str(calls))
rc = subprocess.run(["tclsh", str(driver)], env=env).returncode
if rc:
    sys.exit(rc)
records = [json.loads(line) for line in calls.read_text().splitlines()]
written += [r["written"] for r in records if "written" in r]
(state / "written.json").write_text(json.dumps(written))
for r in records:
    if r.get("name") == "detailed_route":
        Path(r["options"]["-output_drc"]).write_text(
            "violation type: Short\n  srcs: net:a net:b\n  bbox = ( 1, 2 ) - ( 3, 4 ) on Layer metal2\n"
            "violation type: EOL\n  srcs: net:c\n  bbox = ( 5, 6 ) - ( 7, 8 ) on Layer metal3\n")
        print("[INFO DRT-0199]   Number of violations = 2.")
    if r.get("name") == "write_db" and not Path(r["positionals"][0]).exists():
        Path(r["positionals"][0]).write_text("fake odb")
    if r.get("name") == "write_spef":
        # OpenRCX without usable rules writes a SPEF with a header and no nets
        nets = "" if os.environ.get("FAKE_EMPTY_SPEF") else "*D_NET n1 0.01\n*CONN\n*END\n"
        Path(r["positionals"][0]).write_text('*SPEF "IEEE 1481-1998"\n' + nets)
    if r.get("name") == "write_def":
        Path(r["positionals"][0]).write_text(Path(os.environ["FAKE_DEF"]).read_text())
'''

SMALL_DEF = """VERSION 5.8 ;
DIVIDERCHAR "/" ;
BUSBITCHARS "[]" ;
DESIGN layer ;
UNITS DISTANCE MICRONS 2000 ;
DIEAREA ( 0 0 ) ( 11400 5600 ) ;
COMPONENTS 2 ;
- tap TAPCELL_X1 + PLACED ( 0 0 ) N ;
- u1 INV_X1 + PLACED ( 1140 0 ) N ;
END COMPONENTS
END DESIGN
"""


def _fake_openroad(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "openroad"
    fake.write_text(FAKE_OPENROAD.format(python=sys.executable))
    (bindir / "stubs.tcl").write_text(stub_tcl())   # the recording stand-ins of the static check
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


@pytest.fixture
def synthesised(tmp_path, monkeypatch):
    """A build tree as `moekda synth` leaves it (netlist, SDC, metrics.json), and the stand-in openroad."""
    cfg = load_config("tiny")
    build = BuildPaths(root=tmp_path / "build" / "tiny", top="layer")
    build.make_dirs()
    build.netlist.write_text("module layer(); endmodule\n")
    build.sdc.write_text("create_clock -name clk -period 1.25 [get_ports {clk}]\n")
    build.metrics.write_text(json.dumps({"synth__design__instance__area__stdcell": 123.0}))
    fake = _fake_openroad(tmp_path)
    (tmp_path / "small.def").write_text(SMALL_DEF)
    monkeypatch.setenv("FAKE_STATE", str(tmp_path / "fake_state"))
    monkeypatch.setenv("FAKE_DEF", str(tmp_path / "small.def"))
    monkeypatch.setenv("FAKE_STUBS", str(fake.parent / "stubs.tcl"))
    return cfg, build, str(fake)


# ---- finding OpenROAD ---------------------------------------------------------------

def test_without_openroad_the_message_says_how_to_get_it(tmp_path):
    with pytest.raises(UserError) as e:
        find_openroad({"PATH": str(tmp_path)})
    message = str(e.value)
    for needed in ("OPENROAD=", "prebuilt", "container", "make synth"):
        assert needed in message
    with pytest.raises(UserError, match="OPENROAD=/no/such/openroad: no such executable"):
        find_openroad({"PATH": str(tmp_path), "OPENROAD": "/no/such/openroad"})


def test_openroad_from_the_variable_or_path(tmp_path):
    fake = _fake_openroad(tmp_path)
    assert find_openroad({"PATH": str(fake.parent)}) == str(fake)
    assert find_openroad({"PATH": "", "OPENROAD": str(fake)}) == str(fake)


def test_make_pnr_without_openroad_stops_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("OPENROAD", raising=False)
    assert cli.main(["pnr", "-c", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "moekda pnr: error: OpenROAD is not installed" in err


# ---- reading results ------------------------------------------------------------------

def test_metrics_file_values_and_unconstrained_slack(tmp_path):
    path = tmp_path / "6_finish.metrics"
    path.write_text("finish__timing__setup__ws -0.125\nfinish__timing__hold__ws 1e+30\n"
                    "finish__design__instance__count 4821\nfinish__power__total 0.0123\nfinish__x 2.0\n")
    assert read_metrics_file(path) == {"finish__timing__setup__ws": -0.125, "finish__timing__hold__ws": None,
                                       "finish__design__instance__count": 4821, "finish__power__total": 0.0123,
                                       "finish__x": 2.0}
    assert isinstance(read_metrics_file(path)["finish__x"], float)


def test_drc_count_from_report_then_log(tmp_path):
    report, log = tmp_path / "drc.rpt", tmp_path / "route.log"
    assert count_drc_violations(report, log) is None
    log.write_text("[INFO DRT-0199]   Number of violations = 615.\n[INFO DRT-0199]   Number of violations = 3.\n")
    assert count_drc_violations(report, log) == 3
    report.write_text("")
    assert count_drc_violations(report, log) == 0      # the report is the authority once it exists
    report.write_text("violation type: Short\n  srcs: net:a net:b\nviolation type: Metal Spacing\n  srcs: net:c\n")
    assert count_drc_violations(report, log) == 2


def test_merge_keeps_synthesis_metrics(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"synth__area": 1.0, "finish__power__total": 9.0}))
    merged = merge_metrics(path, {"finish__power__total": 0.5, "route__drc_errors": 0})
    assert merged == json.loads(path.read_text()) == {"synth__area": 1.0, "finish__power__total": 0.5,
                                                      "route__drc_errors": 0}


# ---- the whole run, with the stand-in openroad --------------------------------------------

def test_run_without_synthesis_says_what_to_run(synthesised):
    cfg, build, fake = synthesised
    build.netlist.unlink()
    with pytest.raises(UserError, match="no netlist at .*make synth"):
        run_pnr(cfg, build, find_kit(), fake)


def test_every_stage_runs_in_order_and_metrics_are_merged(synthesised):
    pytest.importorskip("klayout.db", reason="KLayout Python module not installed (pip install klayout==0.30.12)")
    cfg, build, fake = synthesised
    lines = []
    metrics = run_pnr(cfg, build, find_kit(("liberty", "tech_lef", "cell_lef", "gds")), fake, threads=3,
                      progress=lines.append)
    started = [line.split()[2].rstrip(":") for line in lines if line.endswith("...")]
    assert started == [s.name for s in STAGES]
    paths = PnrPaths(build)
    for stage in STAGES:
        assert paths.log(stage).is_file(), stage.name
    assert "report_checks -path_delay max" in paths.log(STAGES[-1]).read_text()
    assert "MOEKDA_PNR_CONFIG" not in os.environ          # passed to openroad only
    merged = json.loads(build.metrics.read_text())
    assert merged["synth__design__instance__area__stdcell"] == 123.0
    assert merged["route__drc_errors"] == 2
    # the stand-in block: one 380 x 2800 dbu cell at 2000 dbu/um, and a fill cell that does not count
    assert merged["finish__design__instance__area"] == pytest.approx(0.19 * 1.4)
    assert merged["finish__design__instance__count"] == 1
    assert merged["finish__timing__setup__ws"] == 0.0 and "finish__power__total" in merged
    assert merged["finish__parasitics__extracted__nets"] == 1
    assert all(f"pnr__{s.name}__runtime__s" in merged for s in STAGES)
    assert metrics["route__drc_errors"] == 2
    assert paths.gds.stat().st_size > 0 and paths.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (build.reports / "pnr.md").read_text()
    assert "| routing DRC violations | 2 |" in page and "| cells (without fill) | 1 |" in page
    assert "![layout](../pnr/layer.png)" in page and "`pnr/layer.gds`" in page


def test_a_run_whose_spef_has_no_nets_fails(synthesised, monkeypatch):
    # the real run: RCX-0127 "No RC model was read ... will not perform extraction!" is a
    # warning, the tool exits 0 and the SPEF is empty; the run must not report that as signed off
    cfg, build, fake = synthesised
    monkeypatch.setenv("FAKE_EMPTY_SPEF", "1")
    with pytest.raises(UserError, match=r"layer.spef holds no extracted nets"):
        run_pnr(cfg, build, find_kit(), fake, progress=lambda _: None)
    assert json.loads(build.metrics.read_text())["finish__parasitics__extracted__nets"] == 0


def test_a_failing_stage_names_its_log(synthesised, monkeypatch):
    cfg, build, fake = synthesised
    monkeypatch.setenv("FAKE_FAIL_STAGE", "cts")
    lines = []
    with pytest.raises(UserError, match=r"pnr stage cts failed \(exit 1\); see .*pnr_cts.log: .*GPL-0301"):
        run_pnr(cfg, build, find_kit(), fake, progress=lines.append)
    assert lines[-1].startswith("pnr [8/12] cts")


def test_a_block_run_gets_its_own_pnr_directory(tmp_path):
    chip = PnrPaths(BuildPaths(root=tmp_path, top="layer"))
    block = PnrPaths(BuildPaths(root=tmp_path, top="matvec", block=True))
    assert chip.root == tmp_path / "pnr" and block.root == tmp_path / "pnr" / "matvec"
    assert block.final_def == tmp_path / "pnr" / "matvec" / "matvec.def"


def test_pnr_check_command_runs_without_openroad(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path), "/usr/bin", "/bin"]))
    monkeypatch.delenv("OPENROAD", raising=False)
    # a top nobody synthesised: the result must not depend on what build/ holds
    assert cli.main(["pnr", "-c", "tiny", "--check", "--top", "pnr_check_test_top"]) == 0
    out = capsys.readouterr().out
    assert "12 stages sourced by tclsh" in out and "kit names:" in out and ": ok" in out
    assert "constraints: skipped" in out


def test_a_gds_problem_keeps_the_metrics(synthesised, tmp_path, monkeypatch):
    pytest.importorskip("klayout.db", reason="KLayout Python module not installed (pip install klayout==0.30.12)")
    cfg, build, fake = synthesised
    (tmp_path / "bad.def").write_text(SMALL_DEF.replace("INV_X1", "NOT_IN_KIT_X1"))
    monkeypatch.setenv("FAKE_DEF", str(tmp_path / "bad.def"))
    with pytest.raises(UserError, match="routed and reported, but no GDS: .*NOT_IN_KIT_X1"):
        run_pnr(cfg, build, find_kit(("liberty", "tech_lef", "cell_lef", "gds")), fake, progress=lambda _: None)
    assert json.loads(build.metrics.read_text())["route__drc_errors"] == 2
    assert "| routing DRC violations | 2 |" in (build.reports / "pnr.md").read_text()


def test_from_a_stage_reuses_the_earlier_databases(synthesised):
    pytest.importorskip("klayout.db", reason="KLayout Python module not installed (pip install klayout==0.30.12)")
    cfg, build, fake = synthesised
    kit = find_kit(("liberty", "tech_lef", "cell_lef", "gds"))
    with pytest.raises(UserError, match=r"pnr --from cts: no .*3_5_detail_place.odb from stage detail_place"):
        run_pnr(cfg, build, kit, fake, first="cts", progress=lambda _: None)
    run_pnr(cfg, build, kit, fake, progress=lambda _: None)
    lines = []
    run_pnr(cfg, build, kit, fake, first="cts", progress=lines.append)
    started = [line.split()[2].rstrip(":") for line in lines if line.endswith("...")]
    assert started == ["cts", "global_route", "detail_route", "fill", "final"]
    assert lines[0].startswith("pnr [8/12] cts")


def test_the_record_of_a_run_names_its_commit_and_tool(synthesised, tmp_path):
    pytest.importorskip("klayout.db", reason="KLayout Python module not installed (pip install klayout==0.30.12)")
    from flow.pnr import record
    cfg, build, fake = synthesised
    with pytest.raises(UserError, match="no post-route metrics"):
        record(cfg, build, tmp_path / "results", "OpenROAD test")
    run_pnr(cfg, build, find_kit(("liberty", "tech_lef", "cell_lef", "gds")), fake, progress=lambda _: None)
    files = record(cfg, build, tmp_path / "results", "OpenROAD 26Q3-test")
    # the GDS picture and the pictures of blocks and density (flow/layout_plot.py) the run drew
    assert [f.name for f in files] == ["pnr-tiny.json", "pnr-tiny.md", "pnr-tiny.png", "pnr-tiny-blocks.png",
                                       "pnr-tiny-density.png"]
    rec = json.loads(files[0].read_text())
    assert rec["command"] == "make synth pnr drc CONFIG=tiny" and rec["openroad_version"] == "OpenROAD 26Q3-test"
    assert len(rec["run_commit"]) == 40 and rec["metrics"]["route__drc_errors"] == 2
    assert "synth__design__instance__area__stdcell" in rec["metrics"]
    text = files[1].read_text()
    assert "| routing DRC violations | 2 |" in text and "| total |" in text and "![layout](pnr-tiny.png)" in text
    assert "![blocks](pnr-tiny-blocks.png)" in text and "![density](pnr-tiny-density.png)" in text


def test_the_global_routers_overflow_is_read_from_its_log(tmp_path):
    from flow.pnr import global_route_overflow
    log = tmp_path / "pnr_global_route.log"
    log.write_text("""[INFO GRT-0096] Final congestion report:
Layer         Resource        Demand        Usage (%)    Max H / Max V / Total Congestion
metal2          241162        170657           70.76%             0 /  2 / 10
Total          4333243       1239688           28.61%             7 / 11 / 167
...
Total          4333243       1239000           28.60%             0 /  0 / 0
""")
    assert global_route_overflow(log) == 0          # the last route of the stage counts
    log.write_text("no table\n")
    assert global_route_overflow(log) is None and global_route_overflow(tmp_path / "none.log") is None


def test_a_run_carried_over_an_interruption_keeps_every_stage_s_time(synthesised, monkeypatch):
    """A long run stopped part way (a failed stage, or a session that ended) and resumed with
    --from: the stages that finished before keep their wall times and the run its commit,
    as each stage writes its record (stages.json) when it ends, not when the run does."""
    pytest.importorskip("klayout.db", reason="KLayout Python module not installed (pip install klayout==0.30.12)")
    cfg, build, fake = synthesised
    kit = find_kit(("liberty", "tech_lef", "cell_lef", "gds"))
    paths = PnrPaths(build)
    monkeypatch.setenv("FAKE_FAIL_STAGE", "cts")
    with pytest.raises(UserError, match="pnr stage cts failed"):
        run_pnr(cfg, build, kit, fake, progress=lambda _: None)
    done = list(json.loads(paths.stages_json.read_text()))
    assert done == [s.name for s in STAGES[:STAGES.index(stage_named("cts"))]]
    monkeypatch.delenv("FAKE_FAIL_STAGE")
    run_pnr(cfg, build, kit, fake, first="cts", progress=lambda _: None)
    merged = json.loads(build.metrics.read_text())
    assert all(f"pnr__{s.name}__runtime__s" in merged for s in STAGES)
    from flow.provenance import git_commit
    assert merged["pnr__git_commit"] == git_commit()[0]
    assert merged["pnr__cts__runtime__s"] == json.loads(paths.stages_json.read_text())["cts"]["seconds"]
    # a new run from the first stage voids the records of the earlier one
    monkeypatch.setenv("FAKE_FAIL_STAGE", "pins")
    with pytest.raises(UserError):
        run_pnr(cfg, build, kit, fake, progress=lambda _: None)
    assert list(json.loads(paths.stages_json.read_text())) == ["floorplan", "tapcell", "pdn"]
