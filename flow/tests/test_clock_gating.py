"""Clock gating in synthesis (flow/synth.py clock_gate_lines): registers whose flip-flops
share an enable are clocked through one integrated clock gate, registers with a
synchronous reset included (srst_enable_map), and only gates whose own layouts are
DRC-clean are used.  The netlist must still do what the RTL does, cycle for cycle: the
gated netlist runs in Icarus with the cells' models beside the RTL on random inputs."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from flow.liberty import read_cells
from flow.paths import BuildPaths
from flow.synth import SynthOptions, run_synth, srst_enable_map
from moekda.config import load_config
from pdk.kit import PLATFORM, find_kit

TOP = "regs"
# a: 16 bits, synchronous reset to a mixed value over its enable (reset and enable share a gate)
# b: 16 bits, enable only, fed by the gated a and by the free-running f (gated and ungated sources)
# c: 8 bits, enable over a synchronous reset (reset only while enabled)
# e: 4 bits behind their own enable: fewer than the platform's minimum, so not gated
# f: 8 bits, no enable: never gated
RTL = """
module regs(input clk, input rst, input en_a, input en_b, input en_c, input en_e, input [15:0] d,
            output [15:0] qa, output [15:0] qb, output [7:0] qc, output [3:0] qe, output [7:0] qf);
  reg [15:0] a; reg [15:0] b; reg [7:0] c; reg [3:0] e; reg [7:0] f;
  always @(posedge clk) if (rst) a <= 16'h5a3c; else if (en_a) a <= d;
  always @(posedge clk) if (en_b) b <= a ^ d ^ {f, f};
  always @(posedge clk) if (en_c) begin if (rst) c <= 8'h81; else c <= c + d[7:0]; end
  always @(posedge clk) if (en_e) e <= d[15:12] ^ a[3:0];
  always @(posedge clk) if (rst) f <= 0; else f <= f + 8'd3;
  assign qa = a; assign qb = b; assign qc = c; assign qe = e; assign qf = f;
endmodule
"""
INPUTS = (("rst", 1), ("en_a", 1), ("en_b", 1), ("en_c", 1), ("en_e", 1), ("d", 16))
OUTPUTS = (("qa", 16), ("qb", 16), ("qc", 8), ("qe", 4), ("qf", 8))


def _synth(tmp_path, min_flops):
    kit = find_kit()
    paths = BuildPaths.for_config(load_config("tiny"), TOP, build_root=tmp_path / "build").make_dirs()
    paths.rtl.write_text(RTL)
    run_synth([paths.rtl], kit, paths, SynthOptions(top=TOP, period_ns=1.25, clock_gate_min_flops=min_flops))
    return kit, paths, paths.netlist.read_text()


def _cells(netlist: str) -> dict[str, int]:
    found = {}
    for cell in re.findall(r"^\s*(\w+)\s+\S+\s*\(", netlist, re.M):
        found[cell] = found.get(cell, 0) + 1
    return found


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    return _synth(tmp_path_factory.mktemp("gated"), PLATFORM.clock_gate_measured_min_flops)


def test_registers_sharing_an_enable_get_one_clean_gate_each(gated):
    kit, paths, netlist = gated
    cells = _cells(netlist)
    gates = {c: n for c, n in cells.items() if c.startswith("CLKGATE")}
    # a (its enable OR its reset), b and c; not e (4 < the minimum) and not f (no enable)
    assert PLATFORM.clock_gate_measured_min_flops > 4
    assert gates == {"CLKGATE_X4": 3}, gates
    assert not set(gates) & set(PLATFORM.dont_use)
    assert cells["DFF_X1"] == 16 + 16 + 8 + 4 + 8
    # the gated flip-flops take their clock from a gate's GCK; e and f from clk
    gck = set(re.findall(r"\.GCK\((\w+)\)", netlist))
    clocks = re.findall(r"DFF_X1 \S+ \(\s*\.CK\((\w+)\)", netlist)
    assert sum(c in gck for c in clocks) == 40 and clocks.count("clk") == 12


def test_gating_removes_the_enable_multiplexers(gated, tmp_path):
    kit, paths, netlist = gated
    _, plain_paths, plain = _synth(tmp_path, 0)
    assert not any(c.startswith("CLKGATE") for c in _cells(plain))
    lib = read_cells(kit.liberty)
    area = lambda text: sum(n * lib[c].area for c, n in _cells(text).items() if c in lib)
    assert area(netlist) < area(plain)


def test_clock_gates_count_as_sequential_cells():
    lib = read_cells(find_kit().liberty)
    assert lib["CLKGATE_X4"].sequential and lib["DFF_X1"].sequential
    assert not lib["MUX2_X1"].sequential and not lib["AND2_X1"].sequential


def test_the_reset_map_covers_every_reset_enable_flip_flop():
    text = srst_enable_map()
    names = re.findall(r"^module \\\$_(\w+)_ ", text, re.M)
    assert len(names) == 32 and len(set(names)) == 32
    # reset over enable: the gate's enable includes the reset; enable over reset: it does not
    assert "$_OR_" in text.split("module \\$_SDFFE_PP0P_")[1].split("endmodule")[0]
    assert "$_OR_" not in text.split("module \\$_SDFFCE_PP0P_")[1].split("endmodule")[0]


def _simulate(tmp_path, files, name, steps, module=TOP):
    tb = tmp_path / f"tb_{name}.v"
    regs = "".join(f"  reg [{w - 1}:0] {n} = 0;\n" for n, w in INPUTS)
    wires = "".join(f"  wire [{w - 1}:0] {n};\n" for n, w in OUTPUTS)
    ports = ", ".join(f".{n}({n})" for n, _ in INPUTS + OUTPUTS)
    drive = "".join("  @(negedge clk); " + " ".join(f"{n} = {v};" for n, v in s.items()) + "\n" for s in steps)
    show = " ".join("%h" for _ in OUTPUTS)
    tb.write_text("`timescale 1ns/1ps\nmodule tb;\n  reg clk = 0;\n" + regs + wires
                  + f"  {module} dut(.clk(clk), {ports});\n  always #5 clk = ~clk;\n"
                  + f"  always @(posedge clk) #1 $display(\"{show}\", {', '.join(n for n, _ in OUTPUTS)});\n"
                  + "  initial begin\n" + drive + "  @(negedge clk); $finish;\n  end\nendmodule\n")
    exe = tmp_path / f"{name}.vvp"
    subprocess.run(["iverilog", "-g2012", "-o", str(exe), str(tb), *map(str, files)], check=True)
    out = subprocess.run(["vvp", "-n", str(exe)], check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if re.fullmatch(r"[0-9a-fx ]+", line)]


def test_gated_netlist_does_what_the_rtl_does(gated, tmp_path):
    kit, paths, _ = gated
    if not shutil.which("iverilog") or kit.verilog_models is None:
        pytest.skip("needs iverilog and the cells' Verilog models")
    rng = np.random.default_rng(5)
    # reset (c resets only while enabled), then load b and e from defined values: no x after
    steps = [dict(rst=1, en_c=1), dict(en_b=1, en_e=1)] + [dict(rst=int(rng.random() < 0.05), en_a=int(rng.random() < 0.3),
                                  en_b=int(rng.random() < 0.3), en_c=int(rng.random() < 0.5),
                                  en_e=int(rng.random() < 0.3), d=int(rng.integers(1 << 16)))
                             for _ in range(400)]
    rtl = _simulate(tmp_path, [paths.rtl], "rtl", steps)
    from run.driver import write_gl_wrapper     # the netlist's one-bit ports as the RTL's vectors
    wrapper = write_gl_wrapper(paths.netlist, TOP, tmp_path / "gl_wrapper.v")
    gl = _simulate(tmp_path, [tmp_path / "gl_wrapper.v", paths.netlist, kit.verilog_models], "gl", steps, wrapper)
    assert len(rtl) == len(steps) + 1 and not any("x" in line for line in rtl[3:])
    assert gl == rtl


def test_gated_netlist_is_proven_equivalent_to_the_rtl(gated, tmp_path):
    """flow/equiv.py reads the gates back as enables (ungate_clocks) and proves every
    register pair: the reset map and the gates' enables are what the RTL means."""
    from flow.equiv import check_equivalence, ungate_clocks
    kit, paths, netlist = gated
    if kit.verilog_models is None:
        pytest.skip("needs the cells' Verilog models")
    ungated = ungate_clocks(netlist)
    assert "CLKGATE" not in ungated and "GCK" not in ungated
    result = check_equivalence(paths.rtl, paths.netlist, TOP, tmp_path / "equiv")
    assert result.passed, result.summary()
    # and a wrong enable is caught: b's gate takes c's enable
    wrong = re.sub(r"\.E\(en_b\)", ".E(en_c)", netlist)
    assert wrong != netlist
    bad = tmp_path / "wrong.v"
    bad.write_text(wrong)
    assert not check_equivalence(paths.rtl, bad, TOP, tmp_path / "equiv_wrong").passed


FANOUT_RTL = """
module fanout(input clk, input a, input b, input c, input [7:0] x, input [63:0] en, output [511:0] q);
  wire [7:0] d = {8{~(a | b | c)}} ^ x;
  genvar i;
  generate for (i = 0; i < 64; i = i + 1) begin : w
    reg [7:0] r;
    always @(posedge clk) if (en[i]) r <= d;
    assign q[8 * i +: 8] = r;
  end endgenerate
endmodule
"""


def test_a_value_loaded_into_many_gated_registers_is_not_one_net(tmp_path):
    """64 registers of 8 bits, each behind its own gate, all loading one value: with their
    enable multiplexers gone, ABC must still see the 64 D pins of each bit as loads
    (d_buffer_map, and no opt_clean between it and ABC, which takes the buffers out again).
    Before that fix one gate drove each bit's 64 (model-small-sram: a NOR3_X1 on 2,304 D
    pins, WNS -39 ns)."""
    kit = find_kit()
    paths = BuildPaths.for_config(load_config("tiny"), "fanout", build_root=tmp_path / "build").make_dirs()
    paths.rtl.write_text(FANOUT_RTL)
    run_synth([paths.rtl], kit, paths, SynthOptions(top="fanout", period_ns=1.25,
                                                    clock_gate_min_flops=PLATFORM.clock_gate_measured_min_flops))
    netlist = paths.netlist.read_text()
    assert _cells(netlist).get("CLKGATE_X4") == 64
    loads: dict[str, int] = {}
    for net in re.findall(r"\.D\(([^()]*)\)", netlist):
        loads[net.strip()] = loads.get(net.strip(), 0) + 1
    assert max(loads.values()) <= 16, max(loads.values())
