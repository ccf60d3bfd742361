"""The OpenROAD commands the stage scripts may call, with the options OpenROAD accepts.

The options come from the real tool: openroad-help.txt holds OpenROAD's own
``help <command>`` output (recorded by ``python -m flow.openroad.capture_help
OPENROAD``; the version is in its first line), and ``parse_help`` reads each
command's options, flags and plain arguments from it.  The table below adds
only what help cannot say: which argument is a file read or written, what a
stand-in returns, options help shows without their value, and options help
lists but the tool rejects when run (measured).  A few internal functions the
metrics call (sta::worst_slack ...) have no help; their options are typed
here from their declarations, with the source named.

The static check (flow/openroad/check.py) turns the table into stand-in procs
for tclsh, so a script that calls a command missing here, or passes an option
its command does not declare, fails the check.  Only commands the scripts use
are listed; add one here (and re-run capture_help) when a script needs it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

HELP_FILE = Path(__file__).resolve().parent / "openroad-help.txt"
MARK = "#### "


@dataclass(frozen=True)
class Command:
    keys: frozenset[str] = frozenset()     # options that take a value
    flags: frozenset[str] = frozenset()    # options without a value
    positionals: tuple[int, int] = (0, 0)  # allowed count of plain arguments, min and max
    reads: str | None = None               # "positional" or an option: a file that must exist
    writes: tuple[str, ...] = ()           # "positional" and/or options: files written
    returns: str = ""                      # what the stand-in returns (a fake object or value)
    source: str = ""                       # where the options come from
    rejected: dict[str, str] = field(default_factory=dict)   # option -> why the real tool refuses it


def _c(keys="", flags="", positionals=(0, 0), reads=None, writes=(), returns="", source=""):
    """A command typed by hand (no help text): internal functions only."""
    return Command(frozenset(keys.split()), frozenset(flags.split()), positionals, reads,
                   tuple(writes), returns, source)


@dataclass(frozen=True)
class Note:
    """What help cannot say about a command."""
    reads: str | None = None
    writes: tuple[str, ...] = ()
    returns: str = ""
    positionals: tuple[int, int] | None = None   # when help's argument names mislead
    valued: str = ""                             # options help shows bare but that take a value
    rejected: tuple[tuple[str, str], ...] = ()


def read_help(path: Path = HELP_FILE) -> tuple[str, dict[str, str]]:
    """(OpenROAD version, {command: its help text}) from the recorded file."""
    version, sections, name = "", {}, None
    for line in path.read_text().splitlines():
        if line.startswith(MARK + "version"):
            version = line[len(MARK + "version"):].strip()
        elif line.startswith(MARK):
            name = line[len(MARK):].strip()
            sections[name] = ""
        elif name is not None:
            sections[name] += line + "\n"
    return version, sections


def _groups(text: str) -> list[tuple[bool, str]]:
    """Top-level [bracketed] groups and bare words of a usage line, in order: (optional, text)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            if depth == 0 and cur.strip():
                out += [(False, w) for w in cur.split()]
                cur = ""
            elif depth > 0:
                cur += ch
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                out.append((True, cur.strip()))
                cur = ""
            else:
                cur += ch
        else:
            cur += ch
    out += [(False, w) for w in cur.split()]
    return out


def _top_level_parens_as_brackets(usage: str) -> str:
    """`(-origin xy | -location xy)`, a choice of one required option (place_inst), read as
    the bracketed alternatives it lists; parentheses inside [...] are left as they are."""
    out, depth = [], 0
    for ch in usage:
        depth += (ch == "[") - (ch == "]")
        out.append({"(": "[", ")": "]"}.get(ch, ch) if depth == 0 else ch)
    return "".join(out)


def parse_help(name: str, text: str) -> tuple[frozenset[str], frozenset[str], tuple[int, int]]:
    """Options taking a value, flags, and (min, max) plain arguments from `help name`'s usage."""
    usage = _top_level_parens_as_brackets(" ".join(text.split()))
    if not usage.startswith(name):
        raise ValueError(f"help {name}: usage does not start with the command: {usage[:80]!r}")
    keys, flags, required, optional = set(), set(), 0, 0
    items = _groups(usage[len(name):])
    i = 0
    while i < len(items):
        opt, body = items[i]
        if opt:
            # [-a x|-b y] are alternatives; in [-fields slew|cap] the later words are values
            for n, alt in enumerate(body.replace("(", " ").replace(")", " ").split("|")):
                words = alt.split()
                if not words or words[0] in (">", ">>"):
                    continue
                if words[0].startswith("-"):
                    (keys if len(words) > 1 else flags).add(words[0])
                elif n == 0:
                    optional += 1
                    break
        elif body.startswith("-"):
            alts = body.split("|")
            nxt = items[i + 1] if i + 1 < len(items) else None
            if len(alts) == 1 and nxt and not nxt[0] and not nxt[1].startswith("-"):
                keys.add(body)       # a required option with its value
                i += 1
            else:
                flags.update(a for a in alts if a.startswith("-"))
        elif re.fullmatch(r"[A-Za-z_][\w.]*", body):
            required += 1
        i += 1
    return frozenset(keys), frozenset(flags), (required, required + optional)


def _from_help(name: str, note: Note, sections: dict[str, str], version: str) -> Command:
    if name not in sections or sections[name].strip() in ("", "(no help)"):
        raise KeyError(f"{HELP_FILE.name}: no help for {name}; re-run "
                       "`python -m flow.openroad.capture_help OPENROAD`")
    keys, flags, positionals = parse_help(name, sections[name])
    valued = frozenset(note.valued.split())
    return Command(keys | valued, flags - valued, note.positionals or positionals, note.reads,
                   note.writes, note.returns, f"help {name}, OpenROAD {version}", dict(note.rejected))


# What help cannot say, per command the scripts use (every other fact comes from help).
NOTES: dict[str, Note] = {
    # database and files
    "read_lef": Note(reads="positional"),
    "read_liberty": Note(reads="positional"),
    "read_verilog": Note(reads="positional"),
    "link_design": Note(),
    "read_sdc": Note(reads="positional"),
    "read_db": Note(reads="positional"),
    "write_db": Note(writes=("positional",)),
    "write_def": Note(writes=("positional",)),
    "write_verilog": Note(writes=("positional",)),
    "write_sdc": Note(writes=("positional",)),
    "write_spef": Note(writes=("positional",)),
    "read_spef": Note(reads="positional"),
    "log_begin": Note(writes=("positional",)),
    "log_end": Note(),
    "set_dont_use": Note(),
    # floorplan, taps, power grid
    "initialize_floorplan": Note(),
    "place_macro": Note(),
    "place_inst": Note(),
    "rtl_macro_placer": Note(),
    "make_tracks": Note(),
    "tapcell": Note(),
    "add_global_connection": Note(),
    "global_connect": Note(),
    "set_voltage_domain": Note(),
    "define_pdn_grid": Note(),
    "add_pdn_stripe": Note(),
    "add_pdn_connect": Note(),
    "pdngen": Note(),
    # placement
    "global_placement": Note(),
    "place_pins": Note(),
    "detailed_placement": Note(),
    "optimize_mirroring": Note(),
    "improve_placement": Note(),
    "check_placement": Note(),
    "filler_placement": Note(),
    "buffer_ports": Note(),
    # parasitics and repair
    "set_layer_rc": Note(),
    "set_wire_rc": Note(),
    "estimate_parasitics": Note(writes=("-spef_file",)),
    "repair_design": Note(),
    "repair_tie_fanout": Note(),
    "repair_clock_inverters": Note(),
    "repair_clock_nets": Note(),
    "repair_timing": Note(),
    "report_design_area": Note(),
    # clock tree: help shows these tuning options bare, but each takes a number
    "clock_tree_synthesis": Note(valued="-distance_between_buffers -branching_point_buffers_distance "
                                        "-clustering_exponent -clustering_unbalance_ratio -sink_clustering_size "
                                        "-sink_clustering_max_diameter -macro_clustering_size "
                                        "-macro_clustering_max_diameter -num_static_layers -sink_buffer_max_cap_derate "
                                        "-delay_buffer_derate -library"),
    # routing and extraction
    "set_global_routing_layer_adjustment": Note(positionals=(2, 2)),
    "set_routing_layers": Note(),
    "pin_access": Note(),
    "global_route": Note(writes=("-congestion_report_file", "-guide_file")),
    "detailed_route": Note(writes=("-output_drc", "-output_maze"), rejected=(
        ("-bottom_routing_layer", "[ERROR DRT-0509] -bottom_routing_layer is deprecated. "
                                  "Use set_routing_layers command instead (measured, OpenROAD 26Q3)"),
        ("-top_routing_layer", "[ERROR DRT-0509]-style refusal: the layers come from set_routing_layers"))),
    "check_antennas": Note(writes=("-report_file",), returns="0"),
    "repair_antennas": Note(positionals=(0, 1)),   # the diode cell is found in the LEF when not given
    "define_process_corner": Note(),
    "extract_parasitics": Note(reads="-ext_model_file"),
    # timing and power reports: OpenSTA defines these with proc_redirect, so each takes a
    # trailing `> file` / `>> file` (recorded as the pseudo-file "redirect")
    "report_checks": Note(writes=("redirect",)),
    "report_tns": Note(writes=("redirect",)),
    "report_wns": Note(writes=("redirect",)),
    "report_worst_slack": Note(writes=("redirect",)),
    "report_check_types": Note(writes=("redirect",)),
    "report_clock_skew": Note(writes=("redirect",)),
    "report_power": Note(writes=("redirect",)),
    "set_power_activity": Note(),
    "report_activity_annotation": Note(writes=("redirect",)),
    "get_cells": Note(returns="cell"),
    "get_full_name": Note(returns="datapath/kda/_1_"),
    "set_propagated_clock": Note(),
    "all_clocks": Note(returns="clk"),
    "get_lib_pins": Note(returns="lib_pin"),
    "get_property": Note(returns="1.25"),
}

HELP_COMMANDS = frozenset(NOTES)

# Internal functions the metrics call: no `help`, so typed from their declarations.
INTERNAL: dict[str, Command] = {
    "sta::worst_slack": _c(keys="-corner -scene", flags="-min -max", returns="0.0", source="OpenSTA tcl/Search.tcl"),
    "sta::total_negative_slack": _c(keys="-corner -scene", flags="-min -max", returns="0.0",
                                    source="OpenSTA tcl/Search.tcl"),
    "sta::design_power": _c(positionals=(1, 1), returns="0.0 0.0 0.0 0.0", source="OpenSTA tcl/Power.tcl"),
    "sta::instance_power": _c(positionals=(2, 2), returns="0.0 0.0 0.0 0.0", source="OpenSTA power/Power.i"),
    "sta::find_pin": _c(positionals=(1, 1), returns="pin", source="OpenSTA network/Network.i"),
    "sta::set_power_pin_activity": _c(positionals=(3, 3), returns="", source="OpenSTA power/Power.i"),
    "sta::cmd_corner": _c(returns="corner", source="OpenSTA tcl/Sta.tcl"),
    "ord::get_db_block": _c(returns="block", source="src/OpenRoad.tcl"),
}

# A command without recorded help is left out of the table (so a script calling it fails
# the check) and named in MISSING_HELP (a test insists it is empty); capture_help imports
# this module to learn the names, so the import must work before the help is recorded.
OPENROAD_VERSION, _SECTIONS = read_help() if HELP_FILE.is_file() else ("", {})
MISSING_HELP = tuple(sorted(n for n in NOTES if _SECTIONS.get(n, "(no help)").strip() in ("", "(no help)")))
COMMANDS: dict[str, Command] = {
    **{name: _from_help(name, note, _SECTIONS, OPENROAD_VERSION) for name, note in NOTES.items()
       if name not in MISSING_HELP},
    **INTERNAL,
}

# Object methods the scripts call on odb objects (dbBlock, dbInst, dbMaster, dbBTerm, dbITerm,
# dbNet, Rect): the metrics procs, the antenna diodes (diodes.tcl).  Each is in 26Q3's
# odb/db.h (Rect in odb/geom.h).
ODB_METHODS: frozenset[str] = frozenset(
    "getDbUnitsPerMicron getInsts getMaster getName getWidth getHeight getCoreArea getDieArea dx dy xMin yMin "
    "xMax yMax getBTerms getIoType getNet getSigType getBBox isBlock getITerms getInst findInst findITerm "
    "connect".split())
