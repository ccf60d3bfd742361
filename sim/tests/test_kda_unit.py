"""The whole KDA unit (hw/kda.py) in cocotb against the integer model, bit for bit.

Icarus for the short default runs, Verilator for the long ones (>= 512
tokens, two configs, a clear in the middle, stalls and back-pressure) and
the constant-cost check: cycles per token at token 4096 equal those at 16.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
from amaranth.back import verilog

from hw.kda import KdaUnit
from moekda.config import REPO_ROOT
from sim.cocotb_util import simulator_available


def run_kda(config: str, simulator: str, tokens: int, first=(0,), stall=True, seed=0) -> list[int]:
    """Generate the unit for (config, seed), simulate ``tokens`` tokens; returns token_cycles per token."""
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    from sim.cocotb.tb_kda import kda_case, save_case
    case = kda_case(config, seed, tokens, first)
    build = REPO_ROOT / "build" / config / "sim" / f"kda_{simulator}_s{seed}"
    build.mkdir(parents=True, exist_ok=True)
    src = build / "kda.v"
    text = verilog.convert(KdaUnit(case.cfg, case.qkda), name="kda")
    cycles_out = build / f"cycles_{tokens}.txt"
    case_file = build / f"case_{tokens}.npz"
    save_case(case, case_file)
    runner = get_runner(simulator)
    # Icarus in its default -g2012 mode applies declaration initialisers without an
    # event, so the generated always @* blocks would never run: use -g2005 semantics
    build_args = ["-Wno-fatal", "-O2"] if simulator == "verilator" else ["-g2005"]
    # runs of the same (config, seed) share one build; a lock keeps parallel pytest
    # workers from building in the same directory at once
    with open(build / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not src.exists() or src.read_text() != text:
            src.write_text(text)
        runner.build(sources=[src], hdl_toplevel="kda", build_dir=build, build_args=build_args,
                     timescale=("1ns", "1ps"))
    results = runner.test(
        # the simulator runs in the build directory (cocotb drops result files in it);
        # the bench is imported as a module of the installed repository
        test_module="sim.cocotb.tb_kda", hdl_toplevel="kda", test_dir=build, build_dir=build,
        results_xml=str(build / f"results_{tokens}_{int(stall)}.xml"),
        extra_env={"KDA_CASE": str(case_file), "KDA_SEED": str(seed), "KDA_STALL": "1" if stall else "0",
                   "KDA_CYCLES_OUT": str(cycles_out),
                   "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])})
    n, failed = get_results(Path(results))
    assert n >= 1 and failed == 0, f"{failed} of {n} cocotb tests failed; see {build}"
    return [int(v) for v in cycles_out.read_text().split()]


needs_verilator = pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")


def test_kda_tiny_icarus_short_with_clear():
    """Quick: 12 tokens, a new sequence at token 5, all stalls on."""
    run_kda("tiny", "icarus", 12, first=(0, 5))


def test_kda_small_icarus_short():
    """The second config, quick: 3 tokens with stalls, a new sequence at the third."""
    run_kda("small", "icarus", 3, first=(0, 2))


@needs_verilator
@pytest.mark.verilator
def test_kda_tiny_512_tokens_verilator():
    """>= 512 tokens, stalls and back-pressure everywhere, a state clear mid-run."""
    run_kda("tiny", "verilator", 512, first=(0, 300), seed=1)


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_kda_small_512_tokens_verilator():
    """The same on the second config (a few minutes: slow suite)."""
    run_kda("small", "verilator", 512, first=(0, 300), seed=1)


@needs_verilator
@pytest.mark.verilator
def test_kda_cycles_constant_short():
    """Without stalls every token costs the same cycles; same RTL as the 512-token run,
    so the Verilator model is built once."""
    cycles = run_kda("tiny", "verilator", 64, stall=False, seed=1)
    assert len(set(cycles)) == 1, cycles


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_kda_cycles_at_4096_equal_16():
    cycles = run_kda("tiny", "verilator", 4097, stall=False, seed=1)
    assert cycles[4096] == cycles[16], (cycles[16], cycles[4096])
