"""The constraints every stage reads, and the metrics procs of the final stage,
run in the real OpenSTA (/usr/bin/sta) on a small netlist synthesised here."""
from __future__ import annotations

import re
import shutil

import pytest

from flow.openroad.check import CheckError, check_sdc_with_sta
from flow.pnr import read_metrics_file
from flow.sdc import write_sdc
from moekda.config import load_config
from pdk.kit import find_kit

pytestmark = pytest.mark.skipif(shutil.which("sta") is None, reason="OpenSTA (sta) not installed")

# registered inputs, an adder, a registered output: every path kind the SDC constrains
ACC_V = """
module acc(input clk, input rst, input [7:0] a, input [7:0] b, output reg [8:0] y);
  reg [7:0] ra, rb;
  always @(posedge clk) begin
    if (rst) begin ra <= 0; rb <= 0; y <= 0; end
    else begin ra <= a; rb <= b; y <= ra + rb; end
  end
endmodule
"""


@pytest.fixture(scope="module")
def design(tmp_path_factory):
    from pyosys import libyosys as ys
    tmp = tmp_path_factory.mktemp("pnr_sta")
    kit = find_kit()
    rtl, netlist = tmp / "acc.v", tmp / "acc.netlist.v"
    rtl.write_text(ACC_V)
    d = ys.Design()
    for cmd in (f"read_verilog {rtl}", "synth -top acc -flatten", f"dfflibmap -liberty {kit.liberty}",
                f"abc -liberty {kit.liberty}", "opt_clean", f"write_verilog -noattr {netlist}"):
        ys.run_pass(cmd, d)
    sdc = tmp / "acc.sdc"
    write_sdc(load_config("tiny"), sdc)        # the project's one SDC generator
    return kit, netlist, sdc, tmp


def test_constraints_load_in_opensta_without_warnings(design):
    kit, netlist, sdc, tmp = design
    out = check_sdc_with_sta([kit.liberty], netlist, "acc", sdc, tmp)
    assert re.search(r"^wns ", out, re.MULTILINE) and "Total" in out


def test_metrics_tcl_agrees_with_opensta_reports(design):
    kit, netlist, sdc, tmp = design
    metrics_file = tmp / "acc.metrics"
    out = check_sdc_with_sta([kit.liberty], netlist, "acc", sdc, tmp, metrics_out=metrics_file)
    m = read_metrics_file(metrics_file)
    worst = float(re.search(r"^worst slack (\S+)", out, re.MULTILINE).group(1))
    total_power = float(re.search(r"^Total\s+\S+\s+\S+\s+\S+\s+(\S+)", out, re.MULTILINE).group(1))
    tns = float(re.search(r"^tns (\S+)", out, re.MULTILINE).group(1))
    assert m["synth__timing__setup__ws"] == pytest.approx(worst, abs=0.006)      # report rounds to 2 digits
    assert m["synth__power__total"] == pytest.approx(total_power, rel=0.01)
    assert m["synth__timing__setup__tns"] == pytest.approx(tns, abs=0.006)
    assert m["synth__timing__hold__ws"] is not None and m["synth__power__leakage__total"] > 0
    parts = sum(m[f"synth__power__{p}__total"] for p in ("internal", "switching", "leakage"))
    assert parts == pytest.approx(m["synth__power__total"], rel=1e-6)


def test_a_constraint_on_a_missing_port_fails(design, tmp_path):
    kit, netlist, sdc, _ = design
    bad = tmp_path / "bad.sdc"
    bad.write_text(sdc.read_text().replace("[get_ports {clk}]", "[get_ports {clock}]"))
    assert bad.read_text() != sdc.read_text()
    with pytest.raises(CheckError, match="port 'clock' not found.*unclocked register"):
        check_sdc_with_sta([kit.liberty], netlist, "acc", bad, tmp_path)


def test_a_netlist_with_an_sram_macro_loads_with_the_macros_liberty(design, tmp_path):
    """tiny's KDA state is two fakeram45 macros: without their Liberty OpenSTA makes black
    boxes of them (a warning, so the check fails); with it the same netlist loads clean."""
    kit, _, sdc, _ = design
    macro = next((m for m in kit.macros if m.name == "fakeram45_32x64"), None) if kit.macros else None
    if macro is None:
        pytest.skip("the kit has no fakeram45_32x64")
    netlist = tmp_path / "ram.v"
    netlist.write_text("module acc(input clk, input rst, input [7:0] a, input [7:0] b, output [8:0] y);\n"
                       "  fakeram45_32x64 ram (.clk(clk));\nendmodule\n")
    with pytest.raises(CheckError, match="module fakeram45_32x64 not found"):
        check_sdc_with_sta([kit.liberty], netlist, "acc", sdc, tmp_path)
    check_sdc_with_sta([kit.liberty, macro.liberty], netlist, "acc", sdc, tmp_path)
