"""moekda power without a simulation: the window the bench prints, the VCD scope, the
energy per token, and power.tcl under the OpenROAD stand-ins of the static check."""
from __future__ import annotations

import pytest

from flow.openroad.check import run_stub_stages
from flow.pnr import Stage
from flow.power import Window, energy_metrics, read_window, vcd_scope
from moekda.errors import UserError

VCD_HEAD = """$timescale 1ps $end
$scope module layer_sim $end
$var wire 1 ! clk $end
$scope module chip $end
$scope module u_layer $end
$var wire 1 " n1 $end
$upscope $end
$upscope $end
$upscope $end
$enddefinitions $end
#0
"""


def test_the_window_is_read_from_the_bench_log(tmp_path):
    log = tmp_path / "sim.log"
    log.write_text("...\nactivity: dump on at 2835000 ps\n...\nactivity: dump off at 5468750 ps after 2 tokens\n")
    w = read_window(log)
    assert w == Window(2835000, 5468750, 2) and w.ns == pytest.approx(2633.75)
    log.write_text("activity: dump on at 10 ps\n")
    with pytest.raises(UserError, match="printed no activity window"):
        read_window(log)
    with pytest.raises(UserError, match="printed no activity window"):
        read_window(tmp_path / "missing.log")


def test_the_vcd_scope_of_the_netlist_instance(tmp_path):
    vcd = tmp_path / "a.vcd"
    vcd.write_text(VCD_HEAD)
    assert vcd_scope(vcd, "u_layer") == "layer_sim/chip/u_layer"
    with pytest.raises(UserError, match="no scope u_matvec"):
        vcd_scope(vcd, "u_matvec")


def test_energy_per_token_is_power_times_window_over_tokens():
    m = energy_metrics("finish", {"power__vcd__total": 0.2, "power__default__total": 0.4},
                       Window(0, 1_000_000, 4))
    assert m["finish__power__vcd__energy_per_token__j"] == pytest.approx(0.2 * 1e-6 / 4)
    assert m["finish__power__vcd__window__ns"] == 1000.0 and m["finish__power__vcd__tokens"] == 4


@pytest.mark.parametrize("kind", ["odb", "verilog"])
def test_power_tcl_runs_under_the_openroad_stand_ins(tmp_path, monkeypatch, kind):
    files = {name: tmp_path / name for name in ("lib.lib", "tech.lef", "cell.lef", "design", "c.sdc",
                                                "d.spef", "a.vcd")}
    for f in files.values():
        f.write_text("x\n")
    cfg = tmp_path / "power_config.tcl"
    cfg.write_text("\n".join([
        f"set ::pwr(LIB_FILES) [list {{{files['lib.lib']}}}]", f"set ::pwr(TECH_LEF) {{{files['tech.lef']}}}",
        f"set ::pwr(CELL_LEF) {{{files['cell.lef']}}}", f"set ::pwr(DESIGN_KIND) {kind}",
        f"set ::pwr(DESIGN) {{{files['design']}}}", "set ::pwr(TOP) layer",
        f"set ::pwr(SDC_FILE) {{{files['c.sdc']}}}", f"set ::pwr(SPEF) {{{files['d.spef']}}}",
        "set ::pwr(DEFAULT_ACTIVITY) 0.1", f"set ::pwr(VCD) {{{files['a.vcd']}}}",
        "set ::pwr(SCOPE) layer_sim/chip/u_layer", "set ::pwr(BEGIN) 100", "set ::pwr(END) 200",
        f"set ::pwr(REPORT) {{{tmp_path / 'p.rpt'}}}", f"set ::pwr(METRICS) {{{tmp_path / 'p.metrics'}}}", ""]))
    monkeypatch.setenv("MOEKDA_POWER_CONFIG", str(cfg))
    (run,) = run_stub_stages(cfg, tmp_path / "stubs", stages=(Stage("power", "7", "power"),))
    vcd = run.named("read_vcd")[0]
    assert vcd.options == {"-scope": "layer_sim/chip/u_layer", "-begin_time": "100", "-end_time": "200"}
    names = [c.name for c in run.calls]
    assert names.index("set_power_activity") < names.index("read_vcd") < names.index("report_power")
    assert ("read_db" in names) == (kind == "odb") and ("link_design" in names) == (kind == "verilog")


def test_the_window_is_cropped_and_time_scaled(tmp_path):
    from flow.power import window_vcd
    src = tmp_path / "a.vcd"
    src.write_text(VCD_HEAD + "$dumpoff\nx!\n$end\n#5000\n#10000\n$dumpon\n1!\n1\"\n$end\n#15000\n0!\n"
                   "#20000\n1!\n0\"\n$dumpoff\nx!\nx\"\n$end\n#25000\n")
    out = window_vcd(src, tmp_path / "b.vcd", Window(10000, 20000, 1), scale=0.125)
    assert out == Window(0, 1250, 1)
    body = (tmp_path / "b.vcd").read_text().split("$enddefinitions $end\n")[1]
    assert body == "#0\n1!\n1\"\n#625\n0!\n#1250\n1!\n0\"\n"     # Icarus's $dump sections dropped
