"""`moekda synth`: Verilog of a top -> Yosys -> OpenSTA -> metrics.json -> report.md.

    moekda synth -c tiny                  the chip top of hw.tops
    moekda synth -c small --top matvec    another registered top (a block run:
                                          reports in build/<cfg>/reports/<top>/)
    moekda synth -c tiny --verilog f.v --top name   an existing Verilog file

One progress line per step with its wall time, one log per step under
build/<cfg>/logs/, then a five-line summary.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from cli import UserError
from moekda.config import load_config, require_chip_formats

STEPS = ("rtl", "synth", "sta", "metrics", "report")


def configure(p):
    p.add_argument("--top", help="top to synthesise (default: the chip top of hw.tops)")
    p.add_argument("--verilog", type=Path, help="synthesise this Verilog file instead of generating RTL")
    p.add_argument("--paths", type=int, default=10, help="critical paths to report (default 10)")
    p.add_argument("--activity", type=float, default=None,
                   help="switching activity per clock cycle for report_power (default 0.1)")
    p.add_argument("--flatten", action="store_true",
                   help="synthesise flat (ABC optimises across blocks); the per-block area split "
                        "then comes from a hierarchical pass run alongside")
    p.add_argument("--abc", choices=("lean", "yosys"), default="lean",
                   help="ABC mapping script: lean (default; no SAT sweeping) or Yosys's own -constr script")
    p.add_argument("--clock-gate-min", type=int, default=None, metavar="N",
                   help="clock gating: an integrated clock gate for every N or more flip-flops sharing "
                        "an enable; 0 turns it off (default: the platform's, pdk/kit.py clock_gate_min_flops: 8, "
                        "the measured setting)")
    p.add_argument("--timeout", type=float, default=3600.0, help="Yosys time limit in seconds")


class Progress:
    """'[2/5] synth ...' then the time; Yosys passes shown in place on a terminal."""

    def __init__(self, steps: tuple[str, ...], out=None):
        out = out or sys.stdout
        self.steps, self.out, self.tty, self.t0 = steps, out, out.isatty(), time.monotonic()
        self.step, self.step_t0 = "", self.t0
        self.last_note, self.noted = self.t0, False

    NOTE_EVERY_S = 30.0

    def _head(self, step: str) -> str:
        return f"[{self.steps.index(step) + 1}/{len(self.steps)}] {step} ..."

    def start(self, step: str):
        self.step, self.step_t0 = step, time.monotonic()
        self.last_note, self.noted = self.step_t0, False
        self._line(self._head(step), end="")

    def on_pass(self, name: str):
        dt = time.monotonic() - self.step_t0
        if self.tty:
            self._line(f"\r\033[K{self._head(self.step)} {dt:5.1f} s  {name[:60]}", end="")
        elif time.monotonic() - self.last_note >= self.NOTE_EVERY_S:
            # a log file or CI: a line now and then, so a long synthesis shows life
            self.last_note, self.noted = time.monotonic(), True
            self._line(f"\n    {dt:6.0f} s  {name[:70]}", end="")

    def end(self, step: str, seconds: float):
        prefix = (f"\r\033[K{self._head(step)}" if self.tty
                  else f"\n{self._head(step)}" if self.noted else "")
        self._line(f"{prefix} {seconds:.1f} s (total {time.monotonic() - self.t0:.1f} s)")

    def _line(self, text: str, end: str = "\n"):
        print(text, end=end, file=self.out, flush=True)


def resolve_top(top: str | None) -> tuple[str, bool]:
    """(top, is a block run): the chip top owns build/<cfg>/reports/, any other
    top writes reports/<top>/ so the two never overwrite each other."""
    from flow.rtl import chip_top
    chip = chip_top()
    if top is None and chip is None:
        raise UserError("no --top given and hw.tops is not available to name the chip top")
    top = top or chip
    return top, top != chip


def summary_lines(m: dict) -> list[str]:
    mw = m["power__total"] * 1e3 if m["power__total"] is not None else float("nan")
    fmax = f"{m['fmax']:.0f} MHz" if m["fmax"] else "n/a (no register-to-register path)"
    return [
        f"design  {m['design__name']} @ {m['config__name']}: clock {m['clock__period']:g} ns "
        f"({1000 / m['clock__period']:.0f} MHz), IO delays {m['clock__io_delay']:g} ns",
        f"area    {m['synth__design__instance__area']:,.1f} um2 in {m['synth__design__instance__count']:,} cells "
        f"({m['synth__design__instance__area__sequential']:,.1f} um2 sequential)",
        f"setup   WNS {m['timing__setup__ws']:.3f} ns, TNS {m['timing__setup__tns']:.3f} ns, "
        f"{m['timing__setup__endpoints__violating']} violating endpoints; Fmax {fmax} (reg-to-reg)",
        f"hold    worst slack {m['timing__hold__ws']:.3f} ns, TNS {m['timing__hold__tns']:.3f} ns (ideal clock)",
        f"power   {mw:.3f} mW at activity {m['power__activity']:g}",
    ]


def run(args) -> int:
    from flow.errors import FlowError
    from flow.paths import BuildPaths
    from flow.rtl import write_rtl
    from flow.sta import DEFAULT_ACTIVITY
    from flow.synth_flow import FlowOptions, Steps, synth_and_sta
    from pdk.kit import KitError, find_kit

    cfg = load_config(args.config)

    require_chip_formats(cfg)       # MXFP4 / MXFP8: numpy models only (issue 48)
    if args.paths < 1:
        raise UserError(f"--paths {args.paths}: must be at least 1")
    activity = DEFAULT_ACTIVITY if args.activity is None else args.activity
    if not 0.0 <= activity <= 2.0:
        raise UserError(f"--activity {activity:g}: allowed range is 0 to 2 transitions per cycle")
    if args.clock_gate_min is not None and args.clock_gate_min < 0:
        raise UserError(f"--clock-gate-min {args.clock_gate_min}: 0 (no clock gating) or more flip-flops")
    try:
        kit = find_kit()
    except KitError as e:
        raise UserError(str(e)) from None

    if args.verilog:
        if not args.top:
            raise UserError("--verilog needs --top NAME (the module to synthesise)")
        if not args.verilog.is_file():
            raise UserError(f"--verilog {args.verilog}: no such file")
    top, block = resolve_top(args.top)
    paths = BuildPaths.for_config(cfg, top, block=block).make_dirs()

    progress = Progress(STEPS)
    steps = Steps(progress.start, progress.end)
    if args.verilog:
        rtl = [args.verilog.resolve()]
        steps.run("rtl", lambda: None)
    else:
        steps.run("rtl", write_rtl, cfg, top, paths.rtl, paths.log("rtl"))
        rtl = [paths.rtl]
    opts = FlowOptions(n_paths=args.paths, activity=activity, flatten=args.flatten,
                       synth_timeout_s=args.timeout, abc_script=args.abc,
                       clock_gate_min_flops=args.clock_gate_min)
    try:
        m = synth_and_sta(cfg, kit, paths, rtl, opts, steps, on_pass=progress.on_pass,
                          extra_seconds={"rtl": steps.seconds["rtl"]})
    except FlowError:
        print(file=sys.stdout)  # end the open progress line
        raise
    print("\n".join(summary_lines(m)))
    print(f"report: {paths.report_md}")
    return 0
