"""Synthesis and timing with SRAM macros, on tiny's SRAM-backed KDA state memory alone
(hw/kda/state.py kind="sram": two fakeram45_32x64 and their bank logic; seconds): the
behavioural models in the RTL become black boxes, the netlist instantiates the macros by
name, their Liberty area is in the area and on its own in the metrics, and OpenSTA times
the paths through them with their Liberty arcs."""
from __future__ import annotations

import json
import re

import pytest
from amaranth.hdl import Value

from flow.paths import BuildPaths
from flow.sta import REPORTS, parse_endpoints, parse_paths
from flow.synth_flow import FlowOptions, Steps, synth_and_sta
from hw.kda.state import StateMemory
from hw.mem.fakeram import FAKERAM45, convert_with_macros
from moekda.config import load_config
from pdk.kit import find_kit

TOP = "state_sram"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = load_config("tiny-sram")
    kit = find_kit()
    paths = BuildPaths.for_config(cfg, TOP, build_root=tmp_path_factory.mktemp("build"), block=True).make_dirs()
    m = cfg.model
    mem = StateMemory(m.n_heads, m.head_dim, m.head_dim, cfg.hw.state_lanes, cfg.formats.state_bits, kind="sram")
    ports = [Value.cast(v) for _p, _m, v in mem.signature.flatten(mem)]
    paths.rtl.write_text(convert_with_macros(mem, TOP, ports))
    metrics = synth_and_sta(cfg, kit, paths, [paths.rtl], FlowOptions(n_paths=4), Steps(print, lambda s, t: None))
    return dict(cfg=cfg, kit=kit, paths=paths, metrics=metrics, mem=mem)


def test_rtl_carries_the_model_and_the_instances(run):
    text = run["paths"].rtl.read_text()
    assert len(re.findall(r"^\s*fakeram45_32x64 bank\d_r0_c0 \(", text, re.M)) == 2
    assert len(re.findall(r"^module fakeram45_32x64\(", text, re.M)) == 1


def test_netlist_instantiates_the_macros_as_black_boxes(run):
    paths, spec = run["paths"], FAKERAM45["fakeram45_32x64"]
    netlist = paths.netlist.read_text()
    assert len(re.findall(r"^\s*fakeram45_32x64 \S+ \(", netlist, re.M)) == 2
    assert "module fakeram45_32x64" not in netlist          # no body: the macro is a black box
    for pin, _d, _w in spec.ports():
        assert f".{pin}(" in netlist, pin
    script = paths.synth_script.read_text()
    assert f"read_liberty -lib -overwrite {run['kit'].macro(spec.name).liberty}" in script
    assert "abc -liberty" in script and "-constr" in script


def test_macro_area_is_the_liberty_area_and_counted_apart(run):
    m = json.loads(run["paths"].metrics.read_text())
    spec = FAKERAM45["fakeram45_32x64"]
    assert m["synth__design__instance__count__macros"] == 2
    assert m["synth__design__instance__count__macro:fakeram45_32x64"] == 2
    assert m["synth__design__instance__area__macros"] == pytest.approx(2 * spec.area_um2, abs=0.01)
    assert m["synth__design__instance__area"] == pytest.approx(
        m["synth__design__instance__area__macros"] + m["synth__design__instance__area__stdcell"], abs=0.01)
    # the glue (bank decode, read select, read register) is small beside the macros
    assert 0 < m["synth__design__instance__area__stdcell"] < m["synth__design__instance__area__macros"]
    assert m["synth__design__instance__area__sequential"] < 200 * 4.6   # ~ the 64-bit read register


def test_sta_times_the_macro_arcs(run):
    """Out of a macro: its clk-to-rd_out arc (0.188 ns in fakeram45_32x64.lib) starts the path;
    into it: its inputs are endpoints with the .lib's 0.050 ns setup."""
    paths = run["paths"]
    assert "SRAM macros: 2" in paths.log("sta").read_text()
    out_of, into = parse_paths(paths.report(REPORTS["macros"]).read_text())
    assert out_of.cells[0][1] == "fakeram45_32x64" and re.search(r"/clk$", out_of.cells[0][0])
    assert out_of.cells[1][1] == "fakeram45_32x64" and out_of.cells[1][2] == pytest.approx(0.188, abs=1e-3)
    assert into.required == pytest.approx(run["cfg"].hw.clock_period_ns - 0.050, abs=1e-3)
    assert re.match(r"bank\d_r0_c0$", into.endpoint) and into.cells[-1][1] == "fakeram45_32x64"
    ends = {e.name for e in parse_endpoints(paths.report(REPORTS["endpoints_setup"]).read_text())}
    for bank in (0, 1):
        assert {f"bank{bank}_r0_c0/{pin}[0]" for pin in ("addr_in", "wd_in")} <= ends   # w_mask_in: tied high
    assert run["metrics"]["timing__setup__ws"] > 0
