"""OpenSTA on the synthesised netlist: the script, the run, and parsers that
turn its reports into numbers.

The installed OpenSTA (2.0.17, 2019) has report_checks/report_wns/report_tns/
report_power but no report_clock_min_period and no VCD/SAIF reader, so:

* Fmax comes from the worst register-to-register path: with an ideal clock
  that path needs ``period - slack`` ns, and Fmax = 1 / that.  Input and
  output paths carry 20 % external delays (flow/sdc.py) that scale with the
  period, so they are reported apart, with the period they would need:
  ``period - slack / f`` where f is the share of the cycle left to them
  (0.8 for input-to-register and register-to-output, 0.6 for input-to-output).
* Power is OpenSTA's report_power with one switching activity set on every
  net (``set_power_activity -global``), stated in the report; the default is
  0.1 transitions per clock cycle at 50 % duty.

SRAM macros (flow/synth.py): each macro the netlist instantiates has its own Liberty file
read next to the cell library, so its clock-to-output (rd_out) and its input setup and
hold checks time the paths into and out of it.  A macro is no register to OpenSTA (its
Liberty has no ff group), so the register-to-register class also runs from the macros'
clock pins and to their inputs: Fmax counts the paths through the macros.

Every raw report lands in the reports directory; the parsers below read
those files, so ``moekda report`` can rebuild numbers without rerunning STA.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field

from flow.errors import FlowError
from flow.paths import BuildPaths
from flow.sdc import Constraints
from pdk.kit import PLATFORM, Kit, Macro

STA_BINARY = "sta"
DEFAULT_ACTIVITY = 0.1
DEFAULT_DUTY = 0.5

# the raw reports, by role (file names under reports/)
REPORTS = {
    "setup": "timing.rpt",              # top N setup paths, full
    "hold": "timing_hold.rpt",          # top N hold paths, full
    "reg2reg": "timing_reg2reg.rpt",    # worst register-to-register path (Fmax)
    "in2reg": "timing_in2reg.rpt",
    "reg2out": "timing_reg2out.rpt",
    "in2out": "timing_in2out.rpt",
    "endpoints_setup": "endpoints_setup.rpt",  # every endpoint's worst setup slack
    "endpoints_hold": "endpoints_hold.rpt",
    "summary": "timing_summary.rpt",    # report_wns / report_tns / report_worst_slack
    "power": "power.rpt",
    "registers": "registers.txt",       # register instance -> the net its Q drives
    "macros": "timing_macros.rpt",      # SRAM macros only: worst path out of, and into, them
}
# the share of the cycle an IO path has once the external 20 % delays are taken
IO_SHARE = {"in2reg": 1 - PLATFORM.io_delay_fraction,
            "reg2out": 1 - PLATFORM.io_delay_fraction,
            "in2out": 1 - 2 * PLATFORM.io_delay_fraction}


def _lap(what: str) -> str:
    """A Tcl line that logs the wall time since the previous lap (the log's time per part)."""
    return ('set now [clock milliseconds]; '
            f'puts [format "time %6.1f s  {what}" [expr {{($now - $lap) / 1000.0}}]]; set lap $now')


def ideal_gated_clock_lines() -> list[str]:
    """Before clock-tree synthesis the clock is ideal: no slew at a register's clock pin.
    OpenSTA keeps that for the net the clock port drives, but computes the slew of a net a
    clock gate drives (flow/synth.py clock_gate_lines) from the gate and its load, and one
    gate drives a whole register (30,305 flip-flops of tiny's parameter bank): microseconds
    of slew, and report_power then gave each of those flip-flops 539 uW instead of 7.4
    (16.7 W for tiny at activity 0.1).  The gates' outputs get the ideal clock's slew, 0;
    after CTS (make pnr) the real tree's slews are timed."""
    pin = PLATFORM.clock_gate_out_pin
    return [f"set gated_clocks [get_pins -quiet -hierarchical */{pin}]",
            "if {[llength $gated_clocks]} { set_assigned_transition 0.0 $gated_clocks }",
            'puts "clock gates: [llength $gated_clocks]"']


def sta_script(kit: Kit, paths: BuildPaths, cons: Constraints, n_paths: int,
               activity: float = DEFAULT_ACTIVITY, duty: float = DEFAULT_DUTY,
               macros: tuple[Macro, ...] = ()) -> str:
    r = {k: paths.report(v) for k, v in REPORTS.items()}
    clk = cons.clock_port
    data_ins = f"[delete_from_list [all_inputs] [get_ports {{{clk}}}]]"
    regs_ck = "[all_registers -clock_pins]"
    regs_d = "[all_registers -data_pins]"
    macro_lines = []
    if macros:
        # the macro instances' clock pins and their other inputs, beside the registers'
        refs = " ".join(m.name for m in macros)
        macro_lines = [
            "set macro_cells {}",
            "foreach cell [get_cells -hierarchical *] {",
            f"  if {{[lsearch -exact {{{refs}}} [get_property $cell ref_name]] >= 0}} {{ lappend macro_cells $cell }}",
            "}",
            'puts "SRAM macros: [llength $macro_cells]"',
            f"set macro_ck [get_pins -of_objects $macro_cells -filter \"direction == input\"]",
            "set macro_ck_pins {}",
            "set macro_d_pins {}",
            "foreach pin $macro_ck {",
            "  if {[get_property $pin lib_pin_name] == \"clk\"} { lappend macro_ck_pins $pin } "
            "else { lappend macro_d_pins $pin }",
            "}",
        ]
        regs_ck = "[concat [all_registers -clock_pins] $macro_ck_pins]"
        regs_d = "[concat [all_registers -data_pins] $macro_d_pins]"
        macro_lines += [
            f"report_checks -path_delay max -digits 3 -no_line_splits -from $macro_ck_pins > {r['macros']}",
            f"report_checks -path_delay max -digits 3 -no_line_splits -to $macro_d_pins >> {r['macros']}",
        ]
    # -no_line_splits: long hierarchical pin names stay on their line, for the parsers
    check = "report_checks -path_delay max -digits 3 -no_line_splits"
    return "\n".join([
        "# generated by flow/sta.py",
        "set lap [clock milliseconds]",
        f"read_liberty {kit.liberty}",
        *(f"read_liberty {m.liberty}" for m in macros),
        f"read_verilog {paths.netlist}",
        f"link_design {paths.top}",
        f"read_sdc {paths.sdc}",
        *ideal_gated_clock_lines(),
        *macro_lines,
        'puts "design linked: [llength [get_cells -hierarchical *]] instances, '
        '[llength [all_registers -cells]] registers"',
        _lap("read and link"),
        f"{check} -group_count {n_paths} -endpoint_count 1 > {r['setup']}",
        _lap("setup paths (timing arrival, first query)"),
        f"report_checks -path_delay min -digits 3 -no_line_splits -group_count {n_paths} -endpoint_count 1"
        f" > {r['hold']}",
        _lap("hold paths"),
        f"{check} -from {regs_ck} -to {regs_d} > {r['reg2reg']}",
        f"{check} -from {data_ins} -to {regs_d} > {r['in2reg']}",
        f"{check} -from {regs_ck} -to [all_outputs] > {r['reg2out']}",
        f"{check} -from {data_ins} -to [all_outputs] > {r['in2out']}",
        _lap("path classes"),
        f"{check} -group_count 1000000 -endpoint_count 1 -format end > {r['endpoints_setup']}",
        _lap("setup endpoints"),
        "report_checks -path_delay min -digits 3 -no_line_splits -group_count 1000000 -endpoint_count 1"
        f" -format end > {r['endpoints_hold']}",
        _lap("hold endpoints"),
        'puts "path reports written"',
        f"sta::redirect_file_begin {r['summary']}",
        "report_wns -digits 3",
        "report_tns -digits 3",
        "report_worst_slack -digits 3",
        "sta::redirect_file_end",
        f"set_power_activity -global -activity {activity:g} -duty {duty:g}",
        f"report_power -digits 6 > {r['power']}",
        _lap("power"),
        'puts "power report written"',
        # name registers by the signal they hold, for readable critical paths
        f"set regs [open {r['registers']} w]",
        "foreach cell [all_registers -cells] {",
        "  foreach pin [get_pins -of_objects $cell -filter \"direction == output\"] {",
        "    puts $regs \"[get_full_name $cell] [get_full_name [get_nets -of_objects $pin]]\"",
        "  }",
        "}",
        "close $regs",
        _lap("register names"),
        'puts "register names written"',
        "",
    ])


def run_sta(kit: Kit, paths: BuildPaths, cons: Constraints, n_paths: int = 10,
            activity: float = DEFAULT_ACTIVITY, timeout_s: float = 1800.0) -> float:
    """Run OpenSTA; return wall seconds. Raises FlowError (naming the log) on failure."""
    binary = shutil.which(STA_BINARY)
    if not binary:
        raise FlowError("OpenSTA (`sta`) not found on PATH; `make setup` installs it (apt opensta)")
    paths.reports.mkdir(parents=True, exist_ok=True)
    from flow.synth import macros_used
    macros = macros_used([paths.netlist.read_text()], kit)
    paths.sta_script.write_text(sta_script(kit, paths, cons, n_paths, activity, macros=macros))
    log = paths.log("sta")
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "w") as out:
        out.write(f"# command: {binary} -no_init -no_splash -exit {paths.sta_script}\n")
        out.flush()
        try:
            proc = subprocess.run([binary, "-no_init", "-no_splash", "-exit", str(paths.sta_script)],
                                  stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  cwd=paths.synth_dir)
        except subprocess.TimeoutExpired:
            raise FlowError(f"sta ran longer than {timeout_s:.0f} s (log: {log})") from None
    errors = [ln for ln in log.read_text().splitlines() if ln.startswith("Error")]
    if proc.returncode != 0 or errors:
        why = errors[0] if errors else f"exit code {proc.returncode}"
        raise FlowError(f"sta failed: {why} (log: {log})")
    return time.monotonic() - start


# ---------------------------------------------------------------- parsers

@dataclass
class TimingPath:
    startpoint: str
    start_kind: str        # the parenthesised text after the name, e.g. "input port clocked by clk"
    endpoint: str
    end_kind: str
    path_type: str         # "max" (setup) or "min" (hold)
    arrival: float
    required: float
    slack: float
    cells: list[tuple[str, str, float]] = field(default_factory=list)  # (pin, cell type, time)


_START = re.compile(r"^Startpoint: (\S+) \((.*)\)\s*$")
_END = re.compile(r"^Endpoint: (\S+) \((.*)\)\s*$")
_TYPE = re.compile(r"^Path Type: (\w+)")
_ARRIVAL = re.compile(r"^\s+(-?[\d.]+)\s+data arrival time")
_REQUIRED = re.compile(r"^\s+(-?[\d.]+)\s+data required time")
_SLACK = re.compile(r"^\s+(-?[\d.]+)\s+slack \((MET|VIOLATED)\)")
_STEP = re.compile(r"^\s+(-?[\d.]+)\s+(-?[\d.]+) [\^v] (\S+) \((\w+)\)")


def parse_paths(text: str) -> list[TimingPath]:
    """Full-format report_checks paths, in report order."""
    paths, cur = [], None
    for line in text.splitlines():
        if m := _START.match(line):
            cur = dict(start=m.group(1), start_kind=m.group(2), cells=[], required=None)
        elif cur is None:
            continue
        elif m := _END.match(line):
            cur.update(end=m.group(1), end_kind=m.group(2))
        elif m := _TYPE.match(line):
            cur["type"] = m.group(1)
        elif (m := _STEP.match(line)) and "arrival" not in cur:
            cur["cells"].append((m.group(3), m.group(4), float(m.group(2))))
        elif m := _ARRIVAL.match(line):
            cur.setdefault("arrival", float(m.group(1)))
        elif m := _REQUIRED.match(line):
            cur["required"] = float(m.group(1))
        elif m := _SLACK.match(line):
            paths.append(TimingPath(cur["start"], cur["start_kind"], cur["end"], cur["end_kind"],
                                    cur.get("type", ""), cur["arrival"], cur["required"],
                                    float(m.group(1)), cur["cells"]))
            cur = None
    return paths


@dataclass
class Endpoint:
    name: str
    kind: str
    required: float
    actual: float
    slack: float


_ENDPOINT = re.compile(r"^(\S+) \(([^)]*)\)\s+(-?[\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+) \((MET|VIOLATED)\)")


def parse_endpoints(text: str) -> list[Endpoint]:
    """report_checks -format end: one line per endpoint with its worst slack."""
    return [Endpoint(m.group(1), m.group(2), float(m.group(3)), float(m.group(4)), float(m.group(5)))
            for line in text.splitlines() if (m := _ENDPOINT.match(line))]


# OpenSTA 2019 prints "wns -0.012"; newer ones (OpenROAD's sta) name the path group's
# delay kind, "wns max -0.012": both are read, the setup (max) value is the summary's
_SUMMARY = re.compile(r"^(wns|tns|worst slack)(?: max)? (-?[\d.]+|INF|-INF)\s*$")


def parse_summary(text: str) -> dict[str, float]:
    """report_wns / report_tns / report_worst_slack lines -> {'wns':..,'tns':..,'worst slack':..}."""
    return {m.group(1): float(m.group(2).replace("INF", "inf"))
            for line in text.splitlines() if (m := _SUMMARY.match(line))}


_POWER = re.compile(r"^(Sequential|Combinational|Macro|Pad|Total)\s+([-\d.e+]+)\s+([-\d.e+]+)"
                    r"\s+([-\d.e+]+)\s+([-\d.e+]+)")


def parse_power(text: str) -> dict[str, dict[str, float]]:
    """report_power's table -> {group: {internal, switching, leakage, total}} in watts."""
    out = {}
    for line in text.splitlines():
        if m := _POWER.match(line):
            out[m.group(1).lower()] = dict(zip(("internal", "switching", "leakage", "total"),
                                               map(float, m.groups()[1:])))
    return out


def parse_registers(text: str) -> dict[str, str]:
    """registers.txt -> {register instance: name of the public net its outputs drive}.

    Yosys names mapped flip-flops _123_; the net on Q keeps the RTL signal's name
    (acc[3]).  A register whose outputs only drive internal nets (_45_) keeps its
    instance name."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        cell, net = parts
        leaf = net.rsplit("/", 1)[-1]
        if not leaf.startswith("_") and cell not in out:
            out[cell] = net
    return out


def block_of(instance_path: str) -> str:
    """The block a pin or instance belongs to: its first hierarchy level (a port: 'io')."""
    if "/" in instance_path:
        return instance_path.split("/", 1)[0]
    return "(top)"
