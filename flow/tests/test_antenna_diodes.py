"""The antenna diodes on nets without n-diffusion (flow/openroad/diodes.tcl), without OpenROAD.

The KLayout deck skips a net that reaches n-diffusion; a net whose driver has no layout in
the GDS (a block input port, an SRAM macro's output) has none, and the deck sums its whole
metal against its gates.  diodes.tcl runs here under tclsh on a fake odb design with the
flow's stand-ins (flow/openroad/check.py): which nets get a diode, where it goes, what it is
connected to; and the config knob reaches the stage scripts.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from flow.openroad.check import run_stub_stages, stub_tcl
from flow.openroad.commands import COMMANDS, parse_help
from flow.paths import BuildPaths
from flow.pnr import PnrPaths, pnr_settings, write_config_tcl
from moekda.config import ConfigError, config_from_dict, load_config
from pdk.kit import PLATFORM, find_kit

SCRIPTS = Path(__file__).resolve().parents[1] / "openroad"

pytestmark = pytest.mark.skipif(shutil.which("tclsh") is None, reason="tclsh not installed (apt-get install tcl)")

# A block (2000 dbu per um, core 2..12 um square) with:
#   clk   input, clock net: a far and a near register pin, and its driver's output
#   d     input on two ports (one net), loads: a macro input (no gate in the GDS) and a cell
#   m     input whose only load is a macro: no gate to sit beside, so the entry point
#         pulled into the core
#   o     output; vdd an inout supply; nc an input with no net
#   ram   a macro (isBlock): output q0 to a cell, output q1 unconnected, input a0 on d
FAKE_DESIGN = r'''
proc fake {name table} {
  proc $name {method args} "return \[fake_call $name [list $table] \$method \$args\]"
}
proc fake_call {name table method argv} {
  if {$method eq "connect"} { lappend ::connected [[lindex $argv 0] getName]; return "" }
  if {$method eq "findInst"} { return diode_inst }
  if {![dict exists $table $method]} { error "fake $name: no method $method" }
  return [dict get $table $method]
}
proc point {name x y} { fake $name [list xMin $x xMax $x yMin $y yMax $y] }
set ::connected {}
point p_clk 0 10000; point p_d 0 20000; point p_m 0 30000; point p_far 20000 10000
point p_near 6000 10000; point p_cell_d 8000 20000; point p_q0 22000 5000; point p_l1 21000 5000
fake core {xMin 4000 yMin 4000 xMax 24000 yMax 24000}
fake block {getDbUnitsPerMicron 2000 getCoreArea core getBTerms {b_clk b_d b_d2 b_m b_o b_vdd b_nc}
            getInsts {cell ram}}
fake b_clk {getIoType INPUT getNet n_clk getBBox p_clk}
fake b_d {getIoType INPUT getNet n_d getBBox p_d}
fake b_d2 {getIoType INPUT getNet n_d getBBox p_d}
fake b_m {getIoType INPUT getNet n_m getBBox p_m}
fake b_o {getIoType OUTPUT getNet n_o getBBox p_d}
fake b_vdd {getIoType INOUT getNet n_vdd getBBox p_d}
fake b_nc {getIoType INPUT getNet NULL getBBox p_d}
fake n_clk {getName clk getSigType CLOCK getITerms {i_far i_near i_drv}}
fake n_d {getName d getSigType SIGNAL getITerms {i_a0 i_cell_d}}
fake n_m {getName m getSigType SIGNAL getITerms {i_a0}}
fake n_o {getName o getSigType SIGNAL getITerms {}}
fake n_vdd {getName VDD getSigType POWER getITerms {}}
fake n_q0 {getName q0 getSigType SIGNAL getITerms {i_q0 i_l1}}
fake cell {getMaster std}
fake ram {getMaster sram getITerms {i_q0 i_q1 i_a0}}
fake std {isBlock 0}
fake sram {isBlock 1}
fake i_far {getIoType INPUT getInst cell getBBox p_far}
fake i_near {getIoType INPUT getInst cell getBBox p_near}
fake i_drv {getIoType OUTPUT getInst cell getBBox p_clk}
fake i_cell_d {getIoType INPUT getInst cell getBBox p_cell_d}
fake i_a0 {getIoType INPUT getInst ram getBBox p_q0 getNet n_d}
fake i_q0 {getIoType OUTPUT getInst ram getBBox p_q0 getNet n_q0}
fake i_q1 {getIoType OUTPUT getInst ram getBBox p_q0 getNet NULL}
fake i_l1 {getIoType INPUT getInst cell getBBox p_l1}
fake diode_inst {findITerm diode_iterm}
fake diode_iterm {}
proc ord::get_db_block {} { return block }
'''


def _place(tmp: Path, ports: int, macros: int) -> tuple[list[str], list[dict]]:
    """Run place_antenna_diodes on the fake design: (the nets connected, the place_inst calls)."""
    calls = tmp / f"calls_{ports}{macros}.jsonl"
    script = tmp / f"run_{ports}{macros}.tcl"
    script.write_text(stub_tcl() + FAKE_DESIGN +
                      f"source {{{SCRIPTS / 'diodes.tcl'}}}\n"
                      f"set n [place_antenna_diodes ANTENNA_X1 A {ports} {macros}]\n"
                      "close $::stub_out\n"
                      "puts \"COUNT $n\"\nputs \"NETS $::connected\"\n")
    proc = subprocess.run(["tclsh", str(script)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, STUB_CALLS=str(calls)))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = dict(line.split(" ", 1) if " " in line else (line, "") for line in proc.stdout.splitlines())
    nets = out["NETS"].split()
    placed = [r for r in map(json.loads, calls.read_text().splitlines()) if r.get("name") == "place_inst"]
    assert int(out["COUNT"]) == len(nets) == len(placed)
    return nets, placed


def test_a_diode_on_each_input_port_net_and_macro_output_and_nowhere_else(tmp_path):
    nets, placed = _place(tmp_path, 1, 1)
    # each net once (d has two ports); no output port, supply, unconnected port or macro pin
    assert nets == ["clk", "d", "m", "q0"]
    assert [p["options"]["-cell"] for p in placed] == ["ANTENNA_X1"] * 4
    assert {p["options"]["-status"] for p in placed} == {"PLACED"}
    assert len({p["options"]["-name"] for p in placed}) == 4


def test_the_diode_sits_beside_the_first_gate_the_net_reaches(tmp_path):
    _, placed = _place(tmp_path, 1, 1)
    where = [tuple(float(v) for v in p["options"]["-location"].split()) for p in placed]
    # clk: the near register pin, not the far one nor the driver's output; d: the cell, not the
    # macro input; m: only a macro load, so the port's point pulled into the core (um);
    # q0: its cell load
    assert where == [(3.0, 5.0), (4.0, 10.0), (2.0, 12.0), (10.5, 2.5)]


def test_the_knob_chooses_ports_macros_or_neither(tmp_path):
    assert _place(tmp_path, 1, 0)[0] == ["clk", "d", "m"]
    assert _place(tmp_path, 0, 1)[0] == ["q0"]
    assert _place(tmp_path, 0, 0) == ([], [])


def test_place_inst_options_come_from_its_help():
    # `(-origin xy | -location xy)` is a choice of two options, not a plain argument
    cmd = COMMANDS["place_inst"]
    assert {"-name", "-origin", "-location", "-cell", "-status"} <= cmd.keys and cmd.positionals == (0, 0)
    keys, _, pos = parse_help("place_inst", "place_inst -name inst_name (-origin xy_origin | -location xy_location) "
                                            "[-cell library_cell]")
    assert keys == {"-name", "-origin", "-location", "-cell"} and pos == (0, 0)


# ---- the config knob and the stage script -------------------------------------------------

def _runs(tmp: Path, cfg):
    kit = find_kit()
    build = BuildPaths(root=tmp / "build" / cfg.name, top="layer")
    paths = PnrPaths(build).make_dirs()
    netlist, sdc = tmp / "layer.netlist.v", tmp / "layer.sdc"
    netlist.write_text("module layer(); endmodule\n")
    sdc.write_text("")
    settings = pnr_settings(cfg, kit, paths, netlist, sdc)
    write_config_tcl(settings, paths.config_tcl)
    runs = {r.stage.name: r for r in run_stub_stages(paths.config_tcl, tmp / "stubs")}
    return settings, paths, runs


def _custom(antenna_diodes: str):
    return config_from_dict({"name": "custom", "model": {}, "hw": {}, "formats": {},
                             "pnr": {"antenna_diodes": antenna_diodes}})


def test_sign_off_default_puts_diodes_before_the_first_route(tmp_path):
    cfg = load_config("tiny")
    assert cfg.pnr.antenna_diodes == "ports+macros"
    assert "antenna_diodes" not in cfg.to_dict()["pnr"]      # the default keeps older configs' hashes
    settings, paths, runs = _runs(tmp_path, cfg)
    assert settings["ANTENNA_DIODE"] == PLATFORM.antenna_diode == ("ANTENNA_X1", "A")
    assert (settings["ANTENNA_DIODE_PORTS"], settings["ANTENNA_DIODE_MACROS"]) == (1, 1)
    grt = [c.name for c in runs["global_route"].calls]
    place = grt.index("place_inst")
    # legalised (with the supply pins joined) before pin access and the first route see the cells
    assert place < grt.index("global_connect") < grt.index("detailed_placement") < grt.index("pin_access") \
        < grt.index("global_route")
    assert runs["global_route"].named("place_inst")[0].options["-cell"] == "ANTENNA_X1"
    assert (paths.reports / "5_antenna_net_diodes.metrics").read_text().split() == \
        ["globalroute__antenna__net_diodes", "1"]
    for stage in ("floorplan", "global_place", "cts", "detail_route"):
        assert not runs[stage].named("place_inst"), stage


def test_antenna_diodes_none_places_nothing(tmp_path):
    settings, paths, runs = _runs(tmp_path, _custom("none"))
    assert (settings["ANTENNA_DIODE_PORTS"], settings["ANTENNA_DIODE_MACROS"]) == (0, 0)
    grt = runs["global_route"]
    assert not grt.named("place_inst")
    names = [c.name for c in grt.calls]
    assert "detailed_placement" not in names[:names.index("pin_access")]
    assert (paths.reports / "5_antenna_net_diodes.metrics").read_text().split()[1] == "0"
    assert _custom("ports").pnr.antenna_diodes == "ports"
    with pytest.raises(ConfigError, match="antenna_diodes"):
        _custom("everywhere")
