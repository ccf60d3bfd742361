"""Gate-level simulation of the tiny layer chip: the synthesised Nangate45 netlist
(`moekda synth -c tiny --top layer`, build/tiny/synth/layer.netlist.v) in Icarus
with the kit's cell models (pdk/nangate45/sim/stdcells.v, zero-delay functional
models) gives the same output tokens as the RTL on the same sequence.

The netlist is the same for every model (the chip LOADs its model from the memory image):
the one netlist runs three models' images, each compared with its integer model.  For the
first, the RTL file the netlist was synthesised from (build/tiny/rtl/layer.v) runs the same
sequence as a reference, and outputs and counters must be identical.  When the
netlist is missing, older than that file, or that file differs from today's Verilog,
the test synthesises first (about 12 minutes on 2 loaded cores); MOEKDA_GL_REUSE=1
takes the existing netlist and its RTL file as they are (no regeneration check).

A handful of tokens is enough at gate level (a few thousand cycles each at
~0.1 s per cycle in Icarus), after the LOAD (~2 800 cycles with stalls): 2 tokens per
model with stalls on every port and a CSR clear.
The model chip (issue 14) has its own run: model-tiny's netlist (4 layers on one datapath,
two sequence slots, the LM head and the argmax) takes its image and one token in each slot,
with stalls, and must give the integer model's next tokens and logits' argmax, and the
same outputs and counters as the RTL file it was synthesised from.

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
from sim.cocotb_util import sim_config
from run.driver import LayerDriver, RunPlan, chip_driver

CONFIG = sim_config("tiny")    # `make sim GL=1 CONFIG=x` synthesises and runs x
GL_PLAN = RunPlan(tokens=2, first=(0,), clears=(1,), stall=True, seed=11)
GL_SEEDS = (0, 31, 32)


def _netlist(driver: LayerDriver, config: str = CONFIG):
    paths = BuildPaths.for_config(load_config(config), top="layer")
    fresh = (paths.netlist.is_file() and paths.rtl.is_file()
             and paths.netlist.stat().st_mtime >= paths.rtl.stat().st_mtime
             and (os.environ.get("MOEKDA_GL_REUSE") == "1" or paths.rtl.read_text() == driver.verilog()))
    if not fresh:
        subprocess.run([sys.executable, "-m", "cli", "synth", "-c", config, "--top", "layer"],
                       cwd=REPO_ROOT, check=True)
    assert paths.netlist.is_file(), f"no netlist at {paths.netlist}"
    return paths.rtl, paths.netlist


@pytest.mark.gl
@pytest.mark.slow      # not in the default suite: it may synthesise first
@pytest.mark.timeout(7200)   # synthesis (~12 min) + four Icarus runs of ~6 000 cycles at ~0.1 s each
def test_gate_level_tiny_runs_three_models():
    drivers = [LayerDriver.from_seed(CONFIG, seed=s) for s in GL_SEEDS]
    rtl_file, netlist = _netlist(drivers[0])
    rtl = drivers[0].run(GL_PLAN, simulator="icarus", verilog_file=rtl_file, name="gl_reference")
    assert rtl.match, rtl.summary()
    for n, driver in enumerate(drivers):
        gl = driver.run(GL_PLAN, simulator="icarus", netlist=netlist, name=f"gl_{driver.label}")
        assert gl.match, gl.summary()        # bit-exact against this model's integer model
        print(f"gate level, {driver.label}: {len(gl.idx)} tokens match the integer model; LOAD "
              f"{int(gl.load_cycles[0])} cycles; {gl.wall_s:.0f} s; counters {gl.counters}")
        if n == 0:
            assert np.array_equal(gl.idx, rtl.idx) and np.array_equal(gl.got, rtl.got), \
                "netlist and RTL outputs differ"
            for name in ("TOKENS", "MACS", "WEIGHT_BYTES"):
                assert gl.counters[name] == rtl.counters[name], (name, gl.counters, rtl.counters)


@pytest.mark.gl
@pytest.mark.slow
@pytest.mark.timeout(7200)   # synthesis, a Verilator build of the netlist (~8 min), seconds of simulation
def test_gate_level_tiny_on_verilator():
    """The same netlist in Verilator (the kit's models with their flip-flops as always blocks,
    pdk/cell_models.py): the integer model's tokens and the RTL's outputs and counters, at
    thousands of cycles a second where Icarus runs tens."""
    driver = LayerDriver.from_seed(CONFIG, seed=GL_SEEDS[0])
    rtl_file, netlist = _netlist(driver)
    rtl = driver.run(GL_PLAN, simulator="icarus", verilog_file=rtl_file, name="gl_reference")
    gl = driver.run(GL_PLAN, simulator="verilator", netlist=netlist, name=f"gl_{driver.label}")
    assert rtl.match and gl.match, (rtl.summary(), gl.summary())
    assert np.array_equal(gl.idx, rtl.idx) and np.array_equal(gl.got, rtl.got), "netlist and RTL outputs differ"
    for name in ("TOKENS", "MACS", "WEIGHT_BYTES"):
        assert gl.counters[name] == rtl.counters[name], (name, gl.counters, rtl.counters)


MODEL_CONFIG = "model-tiny"
# one token in each of the two slots, both inside together: the LOAD (~8 900 beats) and
# ~7 000 cycles of the two tokens' four layers and heads
MODEL_GL_PLAN = RunPlan(tokens=2, stall=True, seed=5)


@pytest.mark.gl
@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)   # synthesis + two Icarus runs of ~17 000 cycles (the netlist: ~0.2 s a cycle)
def test_gate_level_model_tiny():
    driver = chip_driver(MODEL_CONFIG, seed=3)
    rtl_file, netlist = _netlist(driver, MODEL_CONFIG)
    rtl = driver.run(MODEL_GL_PLAN, simulator="icarus", verilog_file=rtl_file, name="gl_model_reference")
    assert rtl.match, rtl.summary()
    gl = driver.run(MODEL_GL_PLAN, simulator="icarus", netlist=netlist, name="gl_model")
    assert gl.match, gl.summary()          # the next tokens of the integer model
    assert np.array_equal(gl.idx, rtl.idx) and np.array_equal(gl.got, rtl.got), "netlist and RTL outputs differ"
    for name in ("TOKENS", "MACS", "WEIGHT_BYTES", "BUSY_CYCLES"):
        assert gl.counters[name] == rtl.counters[name], (name, gl.counters, rtl.counters)
    print(f"gate level, {MODEL_CONFIG}: {len(gl.idx)} tokens match the integer model; LOAD "
          f"{int(gl.load_cycles[0])} cycles; {gl.wall_s:.0f} s; counters {gl.counters}")


@pytest.mark.gl
@pytest.mark.slow
@pytest.mark.timeout(7200)   # synthesis, a Verilator build with the SAIF writer (~10 min), seconds of simulation
def test_activity_runs_are_prefixes_of_one_simulation():
    """`moekda power`'s two activity runs (run/driver.py LayerDriver.activity): each ends at
    its token out, writes a SAIF from time 0, and the shorter is the longer's prefix: it
    stops where the full run gave that token out (the chip's output times are the bench's
    out_cycles), and its toggle counts are no larger, net by net."""
    import re as _re
    driver = LayerDriver.from_seed(CONFIG, seed=GL_SEEDS[0])
    _, netlist = _netlist(driver)
    plan = RunPlan(tokens=4, stall=False, seed=2)
    full = driver.run(plan, simulator="verilator", netlist=netlist, name="activity_check", saif=True)
    assert full.match, full.summary()
    root = driver.build_root / "power_test"
    a = driver.activity(plan, netlist, root / "a.saif", 2, name="activity_a")
    b = driver.activity(plan, netlist, root / "b.saif", 4, name="activity_b")
    assert (a.tokens, b.tokens) == (2, 4) and 0 < a.time_ps < b.time_ps
    from sim.cocotb.clocking import CLOCK_NS
    assert full.out_cycles is not None and len(full.out_cycles) == 4
    # the stop is at the edge the token was taken; the bench counts that edge's cycle
    assert abs(a.time_ps - (b.time_ps - (full.out_cycles[3] - full.out_cycles[1]) * CLOCK_NS * 1000)) <= CLOCK_NS * 1000

    def counts(path):
        return {m.group(1): int(m.group(2)) for m in _re.finditer(r"\((\S+) \(T0 \d+\).*?\(TC (\d+)\)", path.read_text())}
    ca, cb = counts(a.saif), counts(b.saif)
    assert len(ca) > 10_000 and set(ca) == set(cb)
    assert all(ca[n] <= cb[n] for n in ca)
    assert sum(cb.values()) > sum(ca.values())
