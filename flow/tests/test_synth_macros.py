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
    cfg = load_config("tiny")
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


def test_gate_level_netlist_with_the_macro_models(run, tmp_path):
    """The netlist, the cells' models and <top>.macros.v (the flow writes it beside the
    netlist) simulate in Icarus like the RTL (which carries the same models): after a fill,
    every cycle a read and a write in different banks; each read returns what was written
    before it, in both."""
    import shutil
    import subprocess

    import numpy as np

    from flow.synth import macro_models_path
    from run.driver import write_gl_wrapper
    if not shutil.which("iverilog") or run["kit"].verilog_models is None:
        pytest.skip("needs iverilog and the cells' Verilog models")
    paths, mem = run["paths"], run["mem"]
    words, wb = mem.words, mem.lanes * mem.width
    rng = np.random.default_rng(3)
    steps, expect, shadow = [], {}, {}
    steps.append(dict(commit=1))
    for w in range(words):
        d = int(rng.integers(1 << 62))
        shadow[w] = d
        steps.append(dict(wr_en=1, wr_addr=w, wr_data=d))
    for _ in range(3 * words):
        r = int(rng.integers(words))
        w = int(rng.integers(words // 2)) * 2 + (1 - r % 2)
        d = int(rng.integers(1 << 62))
        expect[len(steps) + mem.READ_LATENCY] = shadow[r]     # rd_data READ_LATENCY cycles on
        steps.append(dict(rd_en=1, rd_addr=r, wr_en=1, wr_addr=w, wr_data=d))
        shadow[w] = d
    steps += [{}] * 3
    names = ("rd_en", "rd_addr", "wr_en", "wr_addr", "wr_data", "clear", "commit")
    lines = [f"  @(negedge clk); " + " ".join(f"{n} = {wb}'d{s.get(n, 0)};" for n in names)
             for s in steps]

    def simulate(dut_files, module):
        tb = tmp_path / f"tb_{module}.v"
        tb.write_text(
            "`timescale 1ns/1ps\nmodule tb;\n  reg clk = 0, rst = 1;\n"
            + "".join(f"  reg [{wb - 1}:0] {n};\n" for n in names)
            + f"  wire [{wb - 1}:0] rd_data; wire cleared, collision;\n"
            f"  {module} dut(.clk(clk), .rst(rst), .rd_en(rd_en[0]), .rd_addr(rd_addr[5:0]), .wr_en(wr_en[0]),\n"
            "    .wr_addr(wr_addr[5:0]), .wr_data(wr_data), .clear(clear[0]), .commit(commit[0]),\n"
            "    .rd_data(rd_data), .cleared(cleared), .collision(collision));\n"
            "  always #5 clk = ~clk;\n  integer cycle = 0;\n"
            "  always @(posedge clk) begin #1 $display(\"%0d %h\", cycle, rd_data); cycle = cycle + 1; end\n"
            "  initial begin\n" + "".join(f"    {n} = 0;\n" for n in names)
            + "    @(negedge clk); @(negedge clk); rst = 0;\n    cycle = 0;\n"
            + "\n".join(lines) + "\n    $finish;\n  end\nendmodule\n")
        exe = tmp_path / f"{module}.vvp"
        subprocess.run(["iverilog", "-g2005", "-o", str(exe), str(tb), *map(str, dut_files)], check=True,
                       capture_output=True)
        out = subprocess.run(["vvp", "-n", str(exe)], check=True, capture_output=True, text=True).stdout
        return {int(c): v for c, v in (ln.split() for ln in out.splitlines() if ln[:1].isdigit())}

    gl_top = write_gl_wrapper(paths.netlist, TOP, tmp_path / "gl_wrapper.v")
    macros = macro_models_path(paths)
    assert "module fakeram45_32x64(" in macros.read_text()
    gl = simulate([tmp_path / "gl_wrapper.v", paths.netlist, run["kit"].verilog_models, macros], gl_top)
    rtl = simulate([paths.rtl], TOP)
    assert len(expect) == 3 * words
    for cycle, value in expect.items():        # the value shown after the cycle's rising edge
        assert int(gl[cycle], 16) == value == int(rtl[cycle], 16), cycle
