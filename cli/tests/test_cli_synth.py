"""`moekda synth` / `moekda report` from the command line: a user's mistakes
give one line and exit code 2; a good run shows one progress line per step
and a five-line summary.  Runs in-process with the build directory moved to
a temporary one, so the tests never touch the repo's build/."""
from __future__ import annotations

from pathlib import Path

import pytest

import flow.paths
from flow.tests.designs import write_two_macs
from cli import main
from moekda.config import REPO_ROOT


@pytest.fixture
def build_root(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "build"
    monkeypatch.setattr(flow.paths, "BUILD_ROOT", root)
    return root


@pytest.fixture(scope="module")
def verilog(tmp_path_factory) -> Path:
    return write_two_macs(tmp_path_factory.mktemp("rtl") / "two_macs.v")


def _one_line_error(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for w in words:
        assert w in err[0]


def test_bad_config_is_one_line(capsys, build_root, verilog):
    _one_line_error(capsys, ["synth", "-c", "no_such_config", "--verilog", str(verilog), "--top", "two_macs"],
                    "no_such_config")


def test_out_of_range_config_field_is_one_line(capsys, build_root, verilog, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text((REPO_ROOT / "configs" / "tiny.toml").read_text()
                   .replace("clock_period_ns = 1.25", "clock_period_ns = 0.01"))
    _one_line_error(capsys, ["synth", "-c", str(bad), "--verilog", str(verilog), "--top", "two_macs"],
                    "hw.clock_period_ns")


def test_missing_kit_is_one_line(capsys, build_root, verilog, tmp_path, monkeypatch):
    empty = tmp_path / "empty_kit"
    empty.mkdir()
    monkeypatch.setenv("NANGATE45_DIR", str(empty))
    _one_line_error(capsys, ["synth", "-c", "tiny", "--verilog", str(verilog), "--top", "two_macs"],
                    "kit", "liberty")


def test_report_without_a_synth_run_is_one_line(capsys, build_root):
    _one_line_error(capsys, ["report", "-c", "tiny", "--top", "two_macs"], "moekda synth")


def test_unknown_top_in_the_verilog_is_one_line(capsys, build_root, verilog):
    _one_line_error(capsys, ["synth", "-c", "tiny", "--verilog", str(verilog), "--top", "not_in_file"],
                    "yosys failed", "synth.log")


def test_synth_then_report(capsys, build_root, verilog):
    assert main(["synth", "-c", "tiny", "--verilog", str(verilog), "--top", "two_macs", "--paths", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    steps = [line.split("]")[0] + "]" for line in out if line.startswith("[")]
    assert steps == [f"[{i}/5]" for i in range(1, 6)]
    summary = [line.split()[0] for line in out if not line.startswith("[")]
    assert summary == ["design", "area", "setup", "hold", "power", "report:"]
    page = build_root / "tiny" / "reports" / "two_macs" / "report.md"
    assert page.is_file()
    page.unlink()
    assert main(["report", "-c", "tiny", "--top", "two_macs"]) == 0
    assert page.is_file()


def test_flat_run_takes_the_block_split_from_a_hierarchical_pass(capsys, build_root, verilog):
    import json
    assert main(["synth", "-c", "tiny", "--verilog", str(verilog), "--top", "two_macs", "--flatten"]) == 0
    capsys.readouterr()
    reports = build_root / "tiny" / "reports" / "two_macs"
    m = json.loads((reports / "metrics.json").read_text())
    assert m["flow__synth__flatten"] is True
    assert m["synth__block_split__source"] == "hierarchical pass"
    assert m["synth__design__instance__area__block:mac_a"] > 0
    # the flat netlist is one module; the blocks come from the second pass's statistics
    assert len(json.loads((reports / "synth_stat.json").read_text())["modules"]) == 1
    assert len(json.loads((reports / "synth_stat_blocks.json").read_text())["modules"]) == 3
    assert "synthesised flat" in (reports / "report.md").read_text()


@pytest.fixture
def fake_tops(monkeypatch):
    """A stand-in hw.tops with the registry shape the hardware side provides
    (name -> factory(cfg) -> (elaboratable, ports)), so the RTL step is tested
    without depending on the real engine."""
    import sys
    import types

    import hw
    from flow.tests.designs import TwoMacs

    def factory(cfg):
        d = TwoMacs()
        return d, [d.a, d.b, d.y]

    fake = types.ModuleType("hw.tops")
    fake.TOPS = {"matvec": factory}
    monkeypatch.setitem(sys.modules, "hw.tops", fake)
    monkeypatch.setattr(hw, "tops", fake, raising=False)
    return fake


def test_default_top_is_the_chip_top_of_the_registry(capsys, build_root, fake_tops):
    assert main(["synth", "-c", "tiny", "--paths", "2"]) == 0
    assert (build_root / "tiny" / "rtl" / "matvec.v").is_file()
    assert "3 modules" in (build_root / "tiny" / "logs" / "rtl.log").read_text()
    assert (build_root / "tiny" / "reports" / "metrics.json").is_file()  # the chip top: no sub-directory
    assert "design  matvec @ tiny" in capsys.readouterr().out


def test_unknown_top_lists_the_known_ones(capsys, build_root, fake_tops):
    _one_line_error(capsys, ["synth", "-c", "tiny", "--top", "nope"], "--top nope", "matvec")
