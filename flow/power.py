"""`moekda power`: power and energy per token from simulated switching activity.

The flow's other power figures assume one activity on every input (OpenSTA
propagates it through the logic).  Here the chip's gate-level netlist runs real
tokens instead (sim/driver.py, Icarus, the kit's cell models, bit-exact against
the integer model), the netlist's nets are dumped as VCD from the first token
the chip takes (after its LOAD) to the last it gives out, and OpenROAD's timer
reads that VCD (``read_vcd``) over the same window:

* after `make pnr`: the routed netlist (``pnr/layer.v``, names as in the
  database) on the routed database with the extracted SPEF: post-route power;
* before it (``--synth``): the synthesised netlist, no wires: pre-layout power.

Energy per token is the window's average power times its length over the
tokens in it.  The metrics (``power__vcd__total`` W, ``..._internal``,
``_switching``, ``_leakage``, ``power__vcd__window__ns``, ``power__vcd__tokens``,
``power__vcd__energy_per_token__j``, with the stage as prefix: ``finish__`` or
``synth__``) go into metrics.json, the report into reports/power_vcd.rpt.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from moekda.errors import UserError

SCRIPT = Path(__file__).resolve().parent / "openroad" / "power.tcl"
DEFAULT_ACTIVITY = 0.1     # what the flow's activity-only figure uses (flow/sta.py)
_ON = re.compile(r"activity: dump on at (\d+) ps")
_OFF = re.compile(r"activity: dump off at (\d+) ps after (\d+) tokens")


@dataclass(frozen=True)
class Window:
    begin_ps: int
    end_ps: int
    tokens: int

    @property
    def ns(self) -> float:
        return (self.end_ps - self.begin_ps) / 1000.0


def read_window(sim_log: Path) -> Window:
    """The dump window the gate-level bench printed (sim/driver.py ACTIVITY_DUMP)."""
    text = sim_log.read_text(errors="replace") if sim_log.is_file() else ""
    on, off = _ON.search(text), _OFF.search(text)
    if not on or not off:
        raise UserError(f"{sim_log}: the bench printed no activity window (did the chip take and give tokens?)")
    w = Window(int(on.group(1)), int(off.group(1)), int(off.group(2)))
    if w.end_ps <= w.begin_ps or w.tokens < 1:
        raise UserError(f"{sim_log}: empty activity window {w}")
    return w


def window_vcd(src: Path, dst: Path, window: Window, scale: float) -> Window:
    """Copy the VCD's header and its changes inside `window` to `dst`, with every time
    t mapped to (t - begin) * scale; returns the new window (0, (end - begin) * scale).

    Why: the bench clocks the chip at its own period (sim/cocotb/tb_layer.py CLOCK_NS),
    not the config's.  A zero-delay gate-level run does the same thing at any period, so
    stretching time by period / bench period gives the activity the chip has at its clock;
    OpenSTA's power is energy per transition times transitions per second, so the clock in
    the SDC and the data must agree.  Changes mapped to one time are merged into it."""
    last = None
    with src.open("rb") as f, dst.open("wb") as out:
        for line in f:                      # the header, up to $enddefinitions
            out.write(line)
            if line.startswith(b"$enddefinitions"):
                break
        keep = False
        for line in f:
            if line.startswith(b"#"):
                t = int(line[1:])
                if t > window.end_ps:
                    break
                keep = t >= window.begin_ps
                if keep:
                    new = round((t - window.begin_ps) * scale)
                    if new != last:
                        out.write(b"#%d\n" % new)
                        last = new
            elif line.startswith(b"$dumpoff"):
                if keep:
                    break                   # what follows is x until the next $dumpon
                continue
            elif line.startswith((b"$dumpon", b"$dumpall", b"$dumpvars", b"$end")):
                continue                    # Icarus's section keywords; OpenSTA reads only the values
            elif keep:
                out.write(line)
    return Window(0, round((window.end_ps - window.begin_ps) * scale), window.tokens)


def vcd_scope(vcd: Path, instance: str) -> str:
    """The VCD scope path (a/b/c) of the module instance named ``instance``."""
    stack: list[str] = []
    with vcd.open(errors="replace") as f:
        for line in f:
            words = line.split()
            if words[:1] == ["$scope"] and len(words) >= 3:
                stack.append(words[2])
                if words[2] == instance:
                    return "/".join(stack)
            elif words[:1] == ["$upscope"]:
                stack.pop()
            elif words[:1] == ["$enddefinitions"]:
                break
    raise UserError(f"{vcd}: no scope {instance} in its header")


def _tcl(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[list " + " ".join(_tcl(v) for v in value) + "]"
    text = str(value)
    return "{" + text + "}" if text else "{}"


def openroad_power(openroad: str, settings: dict[str, object], workdir: Path, log: Path) -> dict[str, float]:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir.resolve() / "power_config.tcl"
    cfg.write_text("# generated by flow/power.py\n" + "".join(f"set ::pwr({k}) {_tcl(v)}\n"
                                                               for k, v in settings.items()))
    env = dict(os.environ, MOEKDA_POWER_CONFIG=str(cfg))
    with log.open("w") as out:
        proc = subprocess.run([openroad, "-exit", "-no_init", str(SCRIPT)], stdout=out,
                              stderr=subprocess.STDOUT, env=env, cwd=workdir)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise UserError(f"power: openroad failed (exit {proc.returncode}); see {log}: " + " | ".join(tail))
    from flow.pnr import read_metrics_file
    metrics = read_metrics_file(Path(settings["METRICS"]))
    text = log.read_text(errors="replace")
    annotated = re.search(r"Annotated (\d+) pin activities", text)
    if annotated:
        metrics["power__vcd__annotated_pins"] = int(annotated.group(1))
    return metrics


def energy_metrics(stage: str, power: dict[str, float], window: Window) -> dict[str, object]:
    out: dict[str, object] = {f"{stage}__{k}": v for k, v in power.items()}
    out[f"{stage}__power__vcd__window__ns"] = window.ns
    out[f"{stage}__power__vcd__tokens"] = window.tokens
    out[f"{stage}__power__vcd__energy_per_token__j"] = power["power__vcd__total"] * window.ns * 1e-9 / window.tokens
    return out


def power_from_vcd(build, kit, openroad: str, routed: bool, vcd: Path, window: Window,
                   scale: float = 1.0) -> dict[str, object]:
    """OpenROAD's power on `vcd` over `window`, the VCD's time first scaled by `scale` (the
    chip's clock period over the bench's, see window_vcd); the metrics, also merged into
    metrics.json.  (The gate-level run that writes the VCD is the simulation side's:
    moekda/cmd_power.py.)"""
    from flow.pnr import PnrPaths, merge_metrics
    pnr = PnrPaths(build)
    stage = "finish" if routed else "synth"
    work = vcd.parent.resolve()
    cropped = work / "activity_window.vcd"
    window = window_vcd(vcd, cropped, window, scale)
    vcd = cropped
    settings = {
        "LIB_FILES": [kit.liberty], "TECH_LEF": kit.tech_lef, "CELL_LEF": kit.cell_lef,
        "DESIGN_KIND": "odb" if routed else "verilog",
        "DESIGN": pnr.final_odb if routed else build.netlist,
        "TOP": build.top,
        "SDC_FILE": pnr.final_sdc if routed else build.sdc,
        "SPEF": pnr.final_spef if routed else "",
        "DEFAULT_ACTIVITY": DEFAULT_ACTIVITY,
        "VCD": vcd, "SCOPE": vcd_scope(vcd, f"u_{build.top}"),
        "BEGIN": window.begin_ps, "END": window.end_ps,
        "REPORT": build.reports / f"power_vcd_{stage}.rpt",
        "METRICS": work / "power.metrics",
    }
    power = openroad_power(openroad, settings, work, build.log(f"power_{stage}"))
    metrics = energy_metrics(stage, power, window)
    merge_metrics(build.metrics, metrics)
    return metrics


def design_files(build, routed: bool) -> tuple[Path, str]:
    """(the netlist to simulate, the metric stage) after checking every file the step reads."""
    from flow.pnr import PnrPaths
    pnr = PnrPaths(build)
    if routed:
        needed = (pnr.final_netlist, pnr.final_odb, pnr.final_spef, pnr.final_sdc)
        hint = "run `make pnr` first (or --synth for the pre-layout figure)"
    else:
        needed = (build.netlist, build.sdc)
        hint = "run `make synth` first"
    missing = [p for p in needed if not p.is_file()]
    if missing:
        raise UserError(f"power: no {missing[0]}; {hint}")
    return needed[0], "finish" if routed else "synth"
