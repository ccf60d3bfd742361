"""SRAM macros in place and route (flow/macros.py, flow/pnr.py macro_settings): the macros a
netlist instantiates, the column placement computed from them, the Tcl that places them,
and the stage scripts' macro steps under the OpenROAD stand-ins."""
from __future__ import annotations

import re

import pytest

from flow.macros import MacroInstance, column_placement, netlist_macros, placement_tcl
from moekda.errors import UserError

NETLIST = """
module \\layer.datapath.kda.delta.mem (clk);
  input clk;
  fakeram45_64x32 bank0_r0_c0 (
    .clk(clk)
  );
  DFF_X1 _1_ (.CK(clk));
  fakeram45_64x32 bank1_r0_c0 (
    .clk(clk)
  );
endmodule
module layer(clk);
  input clk;
  \\layer.datapath.kda.delta.mem  mem (.clk(clk));
endmodule
"""
SIZES = {"fakeram45_64x32": (20.14, 61.6)}


def test_the_netlist_macros_are_named_by_their_instance_path():
    found = netlist_macros(NETLIST, SIZES)
    assert [(m.path, m.master) for m in found] == [("datapath/kda/delta/mem/bank0_r0_c0", "fakeram45_64x32"),
                                                   ("datapath/kda/delta/mem/bank1_r0_c0", "fakeram45_64x32")]
    assert found[0].width_um == 20.14 and found[0].height_um == 61.6


def _macros(n):
    return [MacroInstance(f"m{i}", "fakeram45_64x32", 20.14, 61.6) for i in range(n)]


def test_macros_fill_columns_from_the_left_edge_with_halos():
    halo = 5.0
    placed = column_placement(_macros(5), core_height_um=200.0, halo_um=halo)
    # 61.6 + 10 = 71.6 per macro: two fit in 200 um (5 + 71.6 + 61.6 + 5 = 143.2; a third would end at 214.8)
    xs = [x for _, x, _ in placed]
    ys = [y for _, _, y in placed]
    assert ys == [5.0, 76.6, 5.0, 76.6, 5.0]
    assert xs[0] == xs[1] == 5.0 and xs[2] == xs[3] == pytest.approx(5 + 20.14 + 10 + 10) and xs[4] > xs[2]
    # no two macros (with their halos) overlap, and every one is inside the core's height
    boxes = [(x - halo, y - halo, x + m.width_um + halo, y + m.height_um + halo) for m, x, y in placed]
    for i, a in enumerate(boxes):
        assert a[3] <= 200.0 + halo
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] + 1e-9 or b[2] <= a[0] + 1e-9 or a[3] <= b[1] + 1e-9 or b[3] <= a[1] + 1e-9


def test_a_macro_taller_than_the_core_is_refused():
    with pytest.raises(UserError, match="does not fit the core"):
        column_placement(_macros(1), core_height_um=60.0, halo_um=5.0)


def test_the_placement_tcl_places_each_macro_mirrored_from_the_core_corner():
    text = placement_tcl("model-tiny-sram", column_placement(_macros(2), 200.0, 5.0))
    lines = [line for line in text.splitlines() if line.startswith("place_macro")]
    assert len(lines) == 2
    assert lines[1] == "place_macro -macro_name {m1} -location [list [expr {$x0 + 5.0}] [expr {$y0 + 76.6}]] -orientation MY"
    assert re.search(r"getCoreArea", text)


@pytest.fixture(scope="module")
def kit():
    """The set-up kit with its SRAM macros, or a skip saying why not."""
    from pdk.kit import find_kit
    try:
        found = find_kit()
    except Exception as e:
        pytest.skip(f"no kit: {e}")
    if not found.macros:
        pytest.skip("the kit has no macros")
    return found


def test_macro_settings_of_a_netlist_with_and_without_macros(tmp_path, kit):
    from flow.paths import BuildPaths
    from flow.pnr import PnrPaths, macro_settings
    from moekda.config import load_config
    from pdk.kit import PLATFORM
    cfg = load_config("model-tiny-sram")
    paths = PnrPaths(BuildPaths.for_config(cfg, "layer", build_root=tmp_path))
    netlist = tmp_path / "n.v"
    netlist.write_text("module layer(clk);\n  input clk;\nendmodule\n")
    plain = macro_settings(cfg, kit, paths, netlist, PLATFORM, 1e5)
    assert plain["MACRO_LEFS"] == () and plain["MACRO_PLACEMENT"] == ""
    netlist.write_text(NETLIST)
    s = macro_settings(cfg, kit, paths, netlist, PLATFORM, 1e5)
    assert [p.name for p in s["MACRO_LEFS"]] == ["fakeram45_64x32.lef"]
    assert [p.name for p in s["MACRO_LIBS"]] == ["fakeram45_64x32.lib"]
    tcl = s["MACRO_PLACEMENT"].read_text()
    assert tcl.count("place_macro") == 2 and "datapath/kda/delta/mem/bank1_r0_c0" in tcl
    with pytest.raises(UserError, match="cell area"):
        macro_settings(cfg, kit, paths, netlist, PLATFORM, None)


def test_the_stage_scripts_place_the_macros_under_the_openroad_stand_ins(tmp_path, kit):
    """`moekda pnr --check` on a netlist with macros (tiny's SRAM state): the generated
    placement reads the core's corner from the database and places every macro, LOCKED
    before tapcell cuts the rows (it stopped at `$core xMin` before the stand-ins had it)."""
    import shutil
    from flow.openroad.check import run_stub_stages
    from flow.paths import BuildPaths
    from flow.pnr import PnrPaths, pnr_settings, write_config_tcl
    from moekda.config import load_config
    if shutil.which("tclsh") is None:
        pytest.skip("tclsh not installed")
    cfg = load_config("model-tiny-sram")
    paths = PnrPaths(BuildPaths.for_config(cfg, "layer", build_root=tmp_path)).make_dirs()
    netlist, sdc = tmp_path / "n.v", tmp_path / "n.sdc"
    netlist.write_text(NETLIST)
    sdc.write_text("")
    write_config_tcl(pnr_settings(cfg, kit, paths, netlist, sdc, design_area_um2=1e5), paths.config_tcl)
    runs = {r.stage.name: r for r in run_stub_stages(paths.config_tcl, tmp_path / "stubs")}
    placed = runs["floorplan"].named("place_macro")
    assert [c.options["-macro_name"] for c in placed] == ["datapath/kda/delta/mem/bank0_r0_c0",
                                                        "datapath/kda/delta/mem/bank1_r0_c0"]
    # offsets from the stand-in core's corner (4000 dbu at 2000 per um: 2 um)
    assert all(float(c.options["-location"].split()[0]) >= 2.0 for c in placed)
    assert not runs["floorplan"].named("rtl_macro_placer")
    # CTS-0080 with macros or clock gates: such a netlist's clock tree is built without sink
    # clustering (flow/pnr.py pnr_settings); a netlist with neither keeps it
    assert "-sink_clustering_enable" not in runs["cts"].named("clock_tree_synthesis")[0].options
    for n, (text, clustered) in enumerate([
            ("module layer(clk);\n  input clk;\nendmodule\n", True),
            ("module layer(clk);\n  input clk;\n  CLKGATE_X4 _156_ (\n    .CK(clk)\n  );\nendmodule\n", False)]):
        netlist.write_text(text)
        write_config_tcl(pnr_settings(cfg, kit, paths, netlist, sdc, design_area_um2=1e5), paths.config_tcl)
        plain = {r.stage.name: r for r in run_stub_stages(paths.config_tcl, tmp_path / f"stubs{n}")}
        assert ("-sink_clustering_enable" in plain["cts"].named("clock_tree_synthesis")[0].options) == clustered
