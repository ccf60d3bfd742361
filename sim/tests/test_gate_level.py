"""Gate-level simulation of the tiny layer chip: the synthesised Nangate45 netlist
(`moekda synth -c tiny --top layer`, build/tiny/synth/layer.netlist.v) in Icarus
with the kit's cell models (pdk/nangate45/stdcells.v, zero-delay functional
models) gives the same output tokens as the RTL on the same sequence.

The netlist bakes the constants of the seed-0 quantised layer (hw.layer.default_qlayer).
The reference is the RTL file the netlist was synthesised from (build/tiny/rtl/layer.v),
simulated on the same sequence; both are also compared with the integer model.  When the
netlist is missing, older than that file, or that file differs from today's Verilog,
the test synthesises first (about 12 minutes on 2 loaded cores); MOEKDA_GL_REUSE=1
takes the existing netlist and its RTL file as they are (no regeneration check).

A handful of tokens is enough at gate level (a few thousand cycles each at
~1 ms per cycle in Icarus): 3 tokens with stalls on every port and a CSR clear.
Selected by `-m gl` (make sim GL=1); also marked slow, so `-m "not slow"` leaves it out.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from flow.paths import BuildPaths
from moekda.config import REPO_ROOT, load_config
from sim.driver import LayerDriver, RunPlan

CONFIG = "tiny"
GL_PLAN = RunPlan(tokens=3, first=(0,), clears=(2,), stall=True, seed=11)


def _netlist(driver: LayerDriver):
    paths = BuildPaths.for_config(load_config(CONFIG), top="layer")
    fresh = (paths.netlist.is_file() and paths.rtl.is_file()
             and paths.netlist.stat().st_mtime >= paths.rtl.stat().st_mtime
             and (os.environ.get("MOEKDA_GL_REUSE") == "1" or paths.rtl.read_text() == driver.verilog()))
    if not fresh:
        subprocess.run([sys.executable, "-m", "moekda", "synth", "-c", CONFIG, "--top", "layer"],
                       cwd=REPO_ROOT, check=True)
    assert paths.netlist.is_file(), f"no netlist at {paths.netlist}"
    return paths.rtl, paths.netlist


@pytest.mark.gl
@pytest.mark.slow      # not in the default suite: it may synthesise first
def test_gate_level_tiny_matches_rtl():
    driver = LayerDriver.from_seed(CONFIG, seed=0)
    rtl_file, netlist = _netlist(driver)
    rtl = driver.run(GL_PLAN, simulator="icarus", verilog_file=rtl_file, name="gl_reference")
    assert rtl.match, rtl.summary()
    gl = driver.run(GL_PLAN, simulator="icarus", netlist=netlist, name="gl")
    assert gl.match, gl.summary()
    assert np.array_equal(gl.idx, rtl.idx) and np.array_equal(gl.got, rtl.got), "netlist and RTL outputs differ"
    for name in ("TOKENS", "MACS", "WEIGHT_BYTES"):
        assert gl.counters[name] == rtl.counters[name], (name, gl.counters, rtl.counters)
    print(f"gate level: {len(gl.idx)} tokens identical to the RTL; {gl.wall_s:.0f} s "
          f"(RTL {rtl.wall_s:.0f} s); counters {gl.counters}")
