"""Verilog in, reports out: SDC -> Yosys -> OpenSTA -> metrics.json -> report.md.

One function with the steps in order, so the command and the tests run the
same code.  Each step reports progress through ``progress(step, seconds)``
and writes its own log under build/<cfg>/logs/.
"""
from __future__ import annotations

import fcntl
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from flow import metrics as metrics_mod
from flow.errors import FlowError
from flow.paths import BuildPaths
from flow.report import build_report
from flow.sdc import write_sdc
from flow.sta import DEFAULT_ACTIVITY, run_sta
from flow.synth import SynthOptions, abc_constraints, lean_abc_script, run_block_split, run_synth
from flow.yosys_driver import yosys_command
from moekda.config import Config
from flow.fingerprint import synthesis_fingerprint, verilog_digest
from pdk.kit import Kit


@dataclass(frozen=True)
class FlowOptions:
    n_paths: int = 10                   # critical paths in timing.rpt and the page
    activity: float = DEFAULT_ACTIVITY  # switching activity for report_power
    flatten: bool = False
    clock_port: str = "clk"
    synth_timeout_s: float = 3600.0
    abc_script: str = "lean"            # see flow/synth.py: lean_abc_script
    clock_gate_min_flops: int | None = None   # None: the platform's (flow/synth.py clock_gate_lines)


class Steps:
    """Times each step and tells the caller when one starts and ends."""

    def __init__(self, on_start: Callable[[str], None], on_end: Callable[[str, float], None]):
        self.on_start, self.on_end, self.seconds = on_start, on_end, {}

    def run(self, name: str, fn, *args, **kw):
        self.on_start(name)
        t0 = time.monotonic()
        out = fn(*args, **kw)
        self.seconds[name] = time.monotonic() - t0
        self.on_end(name, self.seconds[name])
        return out


def _synthesise(rtl, kit, paths, sopts: SynthOptions, on_pass) -> None:
    """Yosys; for a flat run, the hierarchical block-split pass runs at the same
    time in a second process (Yosys is single-threaded; the flow targets 2 cores)."""
    if not sopts.flatten:
        run_synth(rtl, kit, paths, sopts, on_pass)
        return
    paths.abc_constr.write_text(abc_constraints())  # before either process reads it
    paths.abc_script.write_text(lean_abc_script(round(sopts.period_ns * 1000)))  # (unused if "yosys")
    with ThreadPoolExecutor(max_workers=1) as pool:
        split = pool.submit(run_block_split, rtl, kit, paths, sopts)
        try:
            run_synth(rtl, kit, paths, sopts, on_pass)
        finally:
            split.result()  # waits; re-raises the split pass's FlowError, if any


def synth_and_sta(cfg: Config, kit: Kit, paths: BuildPaths, rtl: list[Path], opts: FlowOptions,
                  steps: Steps, on_pass: Callable[[str], None] | None = None,
                  extra_seconds: dict[str, float] | None = None) -> dict:
    """Run synthesis, STA, metrics and the report for ``paths.top``; return the metrics."""
    paths.make_dirs()
    with build_lock(paths):
        return _synth_and_sta(cfg, kit, paths, rtl, opts, steps, on_pass, extra_seconds)


@contextmanager
def build_lock(paths: BuildPaths):
    """One run per (build directory, top) at a time: Yosys reads its script as it
    goes and every step rewrites the same files, so a second run started alongside
    would corrupt the first.  The lock is released when the process ends, however."""
    lock = paths.synth_dir / f"{paths.top}.lock"
    with open(lock, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            raise FlowError(f"another `moekda synth` (pid {holder}) is running for top {paths.top} "
                            f"in {paths.root}; wait for it to finish") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _synth_and_sta(cfg: Config, kit: Kit, paths: BuildPaths, rtl: list[Path], opts: FlowOptions,
                   steps: Steps, on_pass, extra_seconds) -> dict:
    cons = write_sdc(cfg, paths.sdc, opts.clock_port)
    sopts = SynthOptions(top=paths.top, period_ns=cons.period_ns, flatten=opts.flatten,
                         timeout_s=opts.synth_timeout_s, abc_script=opts.abc_script,
                         clock_gate_min_flops=opts.clock_gate_min_flops)
    steps.run("synth", _synthesise, rtl, kit, paths, sopts, on_pass)
    steps.run("sta", run_sta, kit, paths, cons, opts.n_paths, opts.activity)
    seconds = dict(extra_seconds or {}, **steps.seconds)
    extra = {f"flow__{k}__seconds": round(v, 2) for k, v in seconds.items()}
    extra["flow__yosys__engine"] = yosys_command(paths.synth_script)[1]
    extra["flow__synth__flatten"] = opts.flatten
    extra["flow__synth__abc_script"] = opts.abc_script
    extra["flow__synth__clock_gate_min_flops"] = sopts.clock_gating
    # what decides this result (flow/fingerprint.py): bench and sweep reuse it only for the same
    digest = verilog_digest([p.read_text() for p in rtl])
    extra["rtl__verilog_digest"] = digest
    extra["rtl__fingerprint"] = synthesis_fingerprint(digest, cfg.hash(), kit, sopts.clock_gate_min_flops)
    m = steps.run("metrics", metrics_mod.compute, paths, kit.liberty, cons, cfg.name, cfg.hash(),
                  opts.activity, extra, opts.flatten)
    metrics_mod.write(m, paths.metrics)
    steps.run("report", build_report, paths, kit.liberty)
    return m
