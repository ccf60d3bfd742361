"""Run a Yosys script in a child process, its whole output into one log.

Yosys runs through pyosys (the pinned wheel in .venv, which brings its own
``yosys-abc``) or, when pyosys is missing or MOEKDA_YOSYS names a binary, a
``yosys`` executable.  Either way it runs in a subprocess: a Yosys crash
(abort, segfault) or a run past the time limit kills that process, not the
caller, and leaves a complete log behind.

While it runs, ``on_pass`` is called with each top-level pass header
and sub-pass header ("12. Executing ABC pass.", "3.25. Executing MEMORY_MAP
pass.") so the caller can show progress inside a long synthesis.

At the end the log gets a table of wall time per pass (the time from one
pass header to the next, summed by pass name, and per top-level script
command), so a slow synthesis says where its time went.

``python -m flow.yosys_driver SCRIPT`` is the child side of the pyosys path.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from flow.errors import FlowError

# "12. Executing ABC pass (technology mapping using ABC)." or a sub-pass "3.25. Executing
# MEMORY_MAP pass ..." at the start of a line
_PASS_HEADER = re.compile(r"^(\d+(?:\.\d+)*)\. (Executing .*?|Printing statistics)\.?\s*$")
_ERROR = re.compile(r"^ERROR: (.*)$")
_PASS_NAME = re.compile(r"Executing (\S+)")
PASS_TABLE_ROWS = 15


class PassClock:
    """Wall time per Yosys pass, from the pass headers as they stream by."""

    def __init__(self):
        self.by_pass: dict[str, float] = {}      # leaf pass name -> seconds (all its runs)
        self.by_command: dict[str, float] = {}   # top-level script command "7. ABC" -> seconds
        self._open: tuple[str, str, float] | None = None   # (pass, command, start)

    @staticmethod
    def _names(number: str, text: str) -> tuple[str, str]:
        m = _PASS_NAME.match(text)
        name = m.group(1).upper() if m else text.split()[0].upper()
        return name, f"{number.split('.')[0]}. {name}"

    def header(self, number: str, text: str, now: float) -> None:
        name, command = self._names(number, text)
        if "." in number and self._open:   # a sub-pass: keep the command of its parent
            command = self._open[1]
        self.close(now)
        self._open = (name, command, now)

    def close(self, now: float) -> None:
        if self._open:
            name, command, t0 = self._open
            self.by_pass[name] = self.by_pass.get(name, 0.0) + now - t0
            self.by_command[command] = self.by_command.get(command, 0.0) + now - t0
            self._open = None

    def table(self) -> str:
        rows = ["# wall time per script command (s):"]
        rows += [f"#   {t:8.1f}  {c}" for c, t in self.by_command.items()]
        rows.append(f"# wall time per pass, the {PASS_TABLE_ROWS} largest (s):")
        rows += [f"#   {t:8.1f}  {p}" for p, t in
                 sorted(self.by_pass.items(), key=lambda kv: -kv[1])[:PASS_TABLE_ROWS]]
        return "\n".join(rows) + "\n"


def yosys_command(script: Path) -> tuple[list[str], str]:
    """The command line that runs ``script`` and a short name of the engine used."""
    explicit = os.environ.get("MOEKDA_YOSYS")
    if explicit:
        if not shutil.which(explicit):
            raise FlowError(f"MOEKDA_YOSYS={explicit}: no such executable")
        return [explicit, "-s", str(script)], explicit
    try:
        import pyosys  # noqa: F401  (only checking that it is installed)
        return [sys.executable, "-m", "flow.yosys_driver", str(script)], "pyosys"
    except ImportError:
        pass
    on_path = shutil.which("yosys")
    if on_path:
        return [on_path, "-s", str(script)], on_path
    raise FlowError("no Yosys: install the pinned pyosys into .venv (`make setup`) "
                    "or put a yosys on PATH")


def run_yosys(script: Path, log: Path, timeout_s: float = 3600.0,
              on_pass: Callable[[str], None] | None = None) -> float:
    """Run ``script``; return the wall time in seconds. Raises FlowError on failure."""
    cmd, engine = yosys_command(script)
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    last_error = None
    clock = PassClock()
    with open(log, "w") as out:
        out.write(f"# engine: {engine}\n# command: {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, cwd=script.parent)
        # a watchdog, because a stuck ABC prints nothing for minutes
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                out.write(line)
                m = _PASS_HEADER.match(line)
                if m:
                    clock.header(m.group(1), m.group(2), time.monotonic())
                    if on_pass:
                        on_pass(m.group(2))
                e = _ERROR.match(line)
                if e:
                    last_error = e.group(1).strip()
            proc.wait()
            clock.close(time.monotonic())
            out.write(clock.table())
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    elapsed = time.monotonic() - start
    if proc.returncode != 0 and elapsed >= timeout_s:
        raise FlowError(f"yosys ran longer than {timeout_s:.0f} s and was stopped (log: {log})")
    if proc.returncode != 0:
        why = last_error or f"exit code {proc.returncode}"
        raise FlowError(f"yosys failed: {why} (log: {log})")
    return elapsed


def _child(script: str) -> int:
    from pyosys import libyosys as ys
    try:
        ys.run_pass(f"script {script}")
    except Exception as e:  # Yosys errors arrive as Python exceptions here
        print(f"ERROR: {e}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
