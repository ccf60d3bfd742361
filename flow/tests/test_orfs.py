"""`moekda orfs`: the design directory for stock OpenROAD-flow-scripts, without ORFS.

config.mk is read back by GNU make itself (ORFS includes it into its Makefile), so a
syntax error, an unexported variable or a value make would cut short fails here; every
value is compared with the config it came from, on a config whose [pnr] knobs and clock
are all off their defaults.  The build directory is a temporary one: the repo's build/
is never touched."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import flow.paths
from flow.paths import BuildPaths
from flow.sdc import write_sdc
from cli import main
from moekda.config import REPO_ROOT, load_config

TOP = "matvec"
ORFS_VARS = ("PLATFORM", "DESIGN_NAME", "VERILOG_FILES", "SDC_FILE", "SYNTH_NETLIST_FILES",
             "ABC_CLOCK_PERIOD_IN_PS", "CORE_UTILIZATION", "CORE_ASPECT_RATIO", "CORE_MARGIN",
             "PLACE_DENSITY", "TAPCELL_TCL")


@pytest.fixture
def build_root(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "build"
    monkeypatch.setattr(flow.paths, "BUILD_ROOT", root)
    return root


@pytest.fixture
def cfg_path(tmp_path) -> Path:
    """tiny with every knob moekda orfs passes on moved off its default."""
    text = (REPO_ROOT / "configs" / "tiny.toml").read_text()
    assert "clock_period_ns = 1.25" in text
    text = text.replace('name = "tiny"', 'name = "orfs_test"').replace("clock_period_ns = 1.25",
                                                                       "clock_period_ns = 1.6")
    text += ("\n[pnr]\ncore_utilization = 0.42\naspect_ratio = 1.5\ncore_margin_um = 3.5\n"
             "place_density = 0.55\ntapcell_distance_um = 80\n")
    path = tmp_path / "orfs_test.toml"
    path.write_text(text)
    return path


def make_env(config_mk: Path, tmp_path: Path) -> dict[str, str]:
    """The variables config.mk exports, as the recipes (ORFS's scripts) see them."""
    makefile = tmp_path / "read_config.mk"
    makefile.write_text(f"include {config_mk}\nall:\n\t@env\n")
    out = subprocess.run(["make", "-s", "-f", str(makefile)], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {k: v for k, v in env.items() if k in ORFS_VARS}


def fake_synth(cfg, build_root: Path, config_hash: str | None = None) -> BuildPaths:
    """What `moekda synth --top matvec` leaves: a netlist and a metrics.json naming the config."""
    build = BuildPaths.for_config(cfg, top=TOP, block=True).make_dirs()
    build.netlist.write_text(f"module {TOP}(clk); input clk; endmodule\n")
    build.metrics.write_text(json.dumps({"config__hash": config_hash or cfg.hash()}))
    return build


def one_line_error(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for w in words:
        assert w in err[0], err[0]


def test_config_mk_read_back_by_make(build_root, cfg_path, tmp_path, capsys):
    cfg = load_config(cfg_path)
    build = fake_synth(cfg, build_root)
    out = tmp_path / "design"
    assert main(["orfs", "-c", str(cfg_path), "--top", TOP, "--netlist", "-o", str(out)]) == 0
    env = make_env(out / "config.mk", tmp_path)
    assert env == {
        "PLATFORM": "nangate45",
        "DESIGN_NAME": TOP,
        "VERILOG_FILES": str(out / f"{TOP}.v"),
        "SDC_FILE": str(out / "constraint.sdc"),
        "SYNTH_NETLIST_FILES": str(out / f"{TOP}.netlist.v"),
        "ABC_CLOCK_PERIOD_IN_PS": "1600",
        "CORE_UTILIZATION": "42",
        "CORE_ASPECT_RATIO": "1.5",
        "CORE_MARGIN": "3.5",
        "PLACE_DENSITY": "0.55",
        "TAPCELL_TCL": str(out / "tapcell.tcl"),
    }
    for name in ("VERILOG_FILES", "SDC_FILE", "SYNTH_NETLIST_FILES", "TAPCELL_TCL"):
        assert Path(env[name]).is_absolute() and Path(env[name]).is_file(), name
    # the files are the project's own: the netlist of synth, the RTL of `moekda rtl`, our SDC
    assert (out / f"{TOP}.netlist.v").read_text() == build.netlist.read_text()
    rtl = tmp_path / "rtl.v"
    assert main(["rtl", "-c", str(cfg_path), "--top", TOP, "-o", str(rtl)]) == 0
    assert (out / f"{TOP}.v").read_text() == rtl.read_text()
    ours = tmp_path / "ours.sdc"
    write_sdc(cfg, ours)
    assert (out / "constraint.sdc").read_text() == ours.read_text()
    assert "-period $clk_period" in ours.read_text() and "set clk_period 1.6" in ours.read_text()
    assert "-distance 80 " in (out / "tapcell.tcl").read_text()
    readme = (out / "README.md").read_text()
    assert f"DESIGN_CONFIG={out / 'config.mk'}" in readme and "make -C" in readme
    capsys.readouterr()


def test_rtl_only_and_rewrite(build_root, cfg_path, tmp_path):
    cfg = load_config(cfg_path)
    fake_synth(cfg, build_root)
    out = tmp_path / "design"
    assert main(["orfs", "-c", str(cfg_path), "--top", TOP, "--netlist", "-o", str(out)]) == 0
    # written again without --netlist: ORFS must synthesise, no netlist may be left behind
    assert main(["orfs", "-c", str(cfg_path), "--top", TOP, "-o", str(out)]) == 0
    env = make_env(out / "config.mk", tmp_path)
    assert "SYNTH_NETLIST_FILES" not in env
    assert not (out / f"{TOP}.netlist.v").exists()
    assert env["ABC_CLOCK_PERIOD_IN_PS"] == "1600"


def test_defaults_of_tiny(build_root, tmp_path):
    # tiny's [pnr] is the defaults: 0.5 -> 50 %, not 50.0 or 50.00000000000001
    cfg = load_config("tiny")
    out = tmp_path / "design"
    assert main(["orfs", "-c", "tiny", "--top", TOP, "-o", str(out)]) == 0
    env = make_env(out / "config.mk", tmp_path)
    assert env["CORE_UTILIZATION"] == f"{cfg.pnr.core_utilization * 100:g}" == "50"
    assert env["PLACE_DENSITY"] == f"{cfg.pnr.place_density:g}"
    assert env["ABC_CLOCK_PERIOD_IN_PS"] == "1250"


def test_errors_are_one_line(build_root, cfg_path, tmp_path, capsys):
    cfg = load_config(cfg_path)
    out = tmp_path / "design"
    one_line_error(capsys, ["orfs", "-c", str(cfg_path), "--top", TOP], "-o is required")
    one_line_error(capsys, ["orfs", "-c", "no_such_config", "--top", TOP, "-o", str(out)], "no_such_config")
    one_line_error(capsys, ["orfs", "-c", str(cfg_path), "--top", "no_such_top", "-o", str(out)],
                   "no_such_top")
    # --netlist with no synthesis run: says which command makes it, writes nothing
    one_line_error(capsys, ["orfs", "-c", str(cfg_path), "--top", TOP, "--netlist", "-o", str(out)],
                   "moekda synth", "--top matvec")
    assert not out.exists()
    # a netlist of another config (another clock) would be placed against this SDC
    fake_synth(cfg, build_root, config_hash="0123456789ab")
    one_line_error(capsys, ["orfs", "-c", str(cfg_path), "--top", TOP, "--netlist", "-o", str(out)],
                   "0123456789ab", cfg.hash())
    # a netlist of this config but of other RTL (the generator changed since the synthesis)
    build = fake_synth(cfg, build_root)
    build.metrics.write_text(json.dumps({"config__hash": cfg.hash(), "rtl__verilog_digest": "f" * 16}))
    one_line_error(capsys, ["orfs", "-c", str(cfg_path), "--top", TOP, "--netlist", "-o", str(out)],
                   "other RTL", "moekda synth")
    assert not out.exists()
    from flow.fingerprint import verilog_digest
    build.metrics.write_text(json.dumps({"config__hash": cfg.hash(),
                                         "rtl__verilog_digest": verilog_digest([build.rtl.read_text()])}))
    assert main(["orfs", "-c", str(cfg_path), "--top", TOP, "--netlist", "-o", str(out)]) == 0
    shutil.rmtree(build_root)
    shutil.rmtree(out)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    one_line_error(capsys, ["orfs", "-c", str(cfg_path), "--top", TOP, "-o", str(a_file)],
                   "not a directory")
    foreign = tmp_path / "someone_elses"
    foreign.mkdir()
    (foreign / "config.mk").write_text("export DESIGN_NAME = theirs\n")
    one_line_error(capsys, ["orfs", "-c", str(cfg_path), "--top", TOP, "-o", str(foreign)],
                   "not written by `moekda orfs`")
    assert (foreign / "config.mk").read_text() == "export DESIGN_NAME = theirs\n"


def test_read_orfs_run_and_comparison(tmp_path):
    from flow.orfs import comparison, read_orfs_run
    logs = tmp_path / "logs"
    logs.mkdir()
    # what ORFS's run_command.py and its metrics writer leave, in their formats
    (logs / "3_1_place_gp_skip_io.log").write_text(
        "global_placement -skip_io\nElapsed time: 0:45.51[h:]min:sec. CPU time: user 26.43 sys 0.05 (58%). "
        "Peak memory: 111216KB.\n")
    (logs / "3_2_place_iop.log").write_text(
        "Elapsed time: 0:00.81[h:]min:sec. CPU time: user 0.24 sys 0.06 (36%). Peak memory: 97828KB.\n")
    (logs / "5_2_route.log").write_text(   # a stage that ran twice: its latest run counts
        "Elapsed time: 0:09.00[h:]min:sec. CPU time: user 1.00 sys 0.00 (10%). Peak memory: 1KB.\n"
        "Elapsed time: 1:02:03.50[h:]min:sec. CPU time: user 7000.25 sys 1.25 (99%). Peak memory: 1KB.\n")
    (logs / "5_2_route.json").write_text(json.dumps({"detailedroute__route__drc_errors": 0}))
    (logs / "6_report.json").write_text(json.dumps({   # ORFS's plain count includes the fill cells
        "finish__timing__setup__ws": 0.2, "finish__power__total": 0.03,
        "finish__design__instance__count": 18880, "finish__design__instance__count__stdcell": 8927}))
    metrics, times = read_orfs_run(logs)
    assert times["3_1_place_gp_skip_io"] == {"wall_s": 45.51, "cpu_s": 26.48}
    assert times["5_2_route"] == {"wall_s": 3723.5, "cpu_s": 7001.5}
    ours = {"finish__timing__setup__ws": 0.16, "route__drc_errors": 3, "pnr__pins__runtime__s": 0.9,
            "pnr__detail_route__runtime__s": 282.7}
    table = comparison(ours, metrics, times)
    assert table["metrics"]["finish__timing__setup__ws"] == {"moekda": 0.16, "orfs": 0.2}
    assert table["metrics"]["finish__timing__hold__ws"] == {"moekda": None, "orfs": None}
    assert table["metrics"]["route__drc_errors"] == {"moekda": 3, "orfs": 0}
    assert table["metrics"]["finish__design__instance__count"]["orfs"] == 8927
    # ORFS's two pin-placement logs are one stage of ours
    assert table["stage_times"]["pins"] == {"moekda_wall_s": 0.9, "orfs_wall_s": 46.32, "orfs_cpu_s": 26.78,
                                            "orfs_logs": ["3_1_place_gp_skip_io", "3_2_place_iop"]}
    assert table["stage_times"]["detail_route"]["orfs_wall_s"] == 3723.5
    assert table["stage_times"]["cts"]["orfs_wall_s"] is None
    with pytest.raises(Exception, match="no ORFS log directory"):
        read_orfs_run(tmp_path / "missing")


def test_compare_command(build_root, cfg_path, tmp_path, capsys):
    cfg = load_config(cfg_path)
    work = tmp_path / "work"
    out = tmp_path / "cmp.json"
    argv = ["orfs", "-c", str(cfg_path), "--top", TOP, "--compare", str(work), "-o", str(out),
            "--orfs-version", "8c009b0"]
    one_line_error(capsys, argv, "moekda pnr")          # no run of ours yet
    build = fake_synth(cfg, build_root)
    one_line_error(capsys, argv, "post-route")          # synthesis only
    build.metrics.write_text(json.dumps({"config__hash": cfg.hash(), "finish__timing__setup__ws": 0.16,
                                         "pnr__cts__runtime__s": 4.1}))
    one_line_error(capsys, argv, "no ORFS log directory")
    logs = work / "logs" / "nangate45" / TOP / "base"
    logs.mkdir(parents=True)
    (logs / "4_1_cts.log").write_text(
        "OpenROAD 26Q3-1551-g5c9e487120\nElapsed time: 0:09.14[h:]min:sec. CPU time: user 5.59 sys 0.16 "
        "(62%). Peak memory: 164260KB.\n")
    one_line_error(capsys, argv, "make finish")         # ORFS stopped before its final report
    (logs / "6_report.json").write_text(json.dumps({"finish__timing__setup__ws": 0.166}))
    assert main(argv) == 0
    table = json.loads(out.read_text())
    assert table["orfs"] == "8c009b0" and table["openroad_in_orfs_run"] == ["26Q3-1551-g5c9e487120"]
    assert table["config_hash"] == cfg.hash() and table["clock_period_ns"] == 1.6
    assert table["metrics"]["finish__timing__setup__ws"] == {"moekda": 0.16, "orfs": 0.166}
    assert table["stage_times"]["cts"]["moekda_wall_s"] == 4.1
    assert table["stage_times"]["cts"]["orfs_cpu_s"] == 5.75
    capsys.readouterr()
