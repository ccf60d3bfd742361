"""`moekda drc`: KLayout DRC of the routed chip's GDS with the platform's deck.

The deck is ORFS's ``drc/FreePDK45.lydrc`` (pdk/nangate45/, from the kit).  It
needs the KLayout *application* (Debian's ``klayout`` package): the PyPI
module reads layouts but has no DRC engine.  The deck switches its rule groups
on with four lines (``FEOL = true``, ``BEOL``, ``OFFGRID``, ``ANTENNA``); this
module runs the groups one at a time, back end first, each from a copy of the
deck with only that group on (written under build/, never committed), so a
group that takes long does not hide the others' results and each group's wall
time is measured.  The deck asks for hierarchical (``deep``) mode; only the BEOL copy
keeps it.  The others run flat in 100 um tiles (``FLAT_TILE_UM``), measured on a 200 x 200
um clip of the routed tiny (one thread): FEOL deep had not finished after 17 min (it was
stuck in CONTACT.3's ``active.or(poly.or(metal1))``: the routed metal1 merged with every
cell's active and poly across the hierarchy; on the whole chip, 2 h reached 12 of 27
checks), flat in 100 um tiles 63 s (93 s in the deck's 1000 um tiles); ANTENNA deep 95 s,
flat 27 s, same count; OFFGRID 5.5 s against 3.1 s.  BEOL is the other way round: deep 72 s,
flat 304 s (the whole chip's BEOL deep: 845 s).

Each group's report database (.lyrdb, KLayout's XML) is counted per rule; the
counts go into metrics.json as ``drc__klayout__violations`` (all groups) and
``drc__klayout__<group>__violations``, with each group's wall time, and a
table into reports/drc.md.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from moekda.errors import UserError

GROUPS = ("BEOL", "FEOL", "OFFGRID", "ANTENNA")    # in run order: metals and vias first
KLAYOUT_HELP = ("KLayout DRC needs the KLayout application: apt-get install klayout "
                "(Debian/Ubuntu; the PyPI module cannot run DRC decks), or KLAYOUT=/path/to/klayout")
DEEP_GROUPS = ("BEOL",)     # the rest run flat and tiled: see the module's text
FLAT_TILE_UM = 100
_SWITCH = re.compile(r"^(?P<name>FEOL|BEOL|OFFGRID|ANTENNA)(?P<pad>\s*)=\s*(true|false)", re.M)


@dataclass(frozen=True)
class GroupResult:
    group: str
    violations: int
    by_rule: dict[str, int]
    seconds: float
    report: Path


def find_klayout(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    named = env.get("KLAYOUT")
    found = shutil.which(named or "klayout", path=env.get("PATH"))
    if not found:
        raise UserError((f"KLAYOUT={named}: no such executable. " if named else "") + KLAYOUT_HELP)
    return found


_GATE = re.compile(r"^gate\s*=.*$", re.M)
_DEEP = re.compile(r"^deep[ \t]*$", re.M)
_TILES = re.compile(r"^tiles\([^)]*\)", re.M)


def deck_for_group(deck_text: str, group: str) -> str:
    """The deck with only `group` switched on; fails if the deck has no such switch.
    Groups outside DEEP_GROUPS lose the deck's `deep` line and run flat in FLAT_TILE_UM tiles.

    The platform's deck defines the `gate` layer (poly and active) inside its FEOL
    block and its antenna rules connect from it, so the ANTENNA-only copy repeats
    that one definition (the deck's own line) just before the ANTENNA block."""
    names = {m.group("name") for m in _SWITCH.finditer(deck_text)}
    if group not in names:
        raise UserError(f"DRC deck: no `{group} = true|false` switch (has {', '.join(sorted(names)) or 'none'})")
    text = _SWITCH.sub(lambda m: f"{m.group('name')}{m.group('pad')}= {'true' if m.group('name') == group else 'false'}",
                       deck_text)
    if group == "ANTENNA":
        gate = _GATE.search(text)
        block = re.search(r"^if ANTENNA\b", text, re.M)
        if gate is None or block is None:
            raise UserError("DRC deck: its antenna rules need the FEOL block's `gate = ...` definition, "
                            "which this deck does not have")
        text = text[:block.start()] + gate.group(0) + "\n" + text[block.start():]
    if group not in DEEP_GROUPS:
        text = _DEEP.sub(f"# deep: off for {group} (flow/drc.py runs it flat, tiled)", text)
        text = _TILES.sub(f"tiles({FLAT_TILE_UM}.um)", text)
    return text


def count_violations(lyrdb: Path) -> Counter:
    """Violations per rule (category) in a KLayout report database."""
    if not lyrdb.is_file():
        raise UserError(f"{lyrdb}: KLayout wrote no report database")
    try:
        root = ET.parse(lyrdb).getroot()
    except ET.ParseError as e:
        raise UserError(f"{lyrdb}: not a KLayout report database ({e})") from None
    counts: Counter = Counter()
    items = root.find("items")
    for item in (items if items is not None else []):
        category = (item.findtext("category") or "?").strip().strip("'")
        counts[category] += 1
    return counts


def run_group(klayout: str, deck: Path, gds: Path, workdir: Path, group: str, log: Path) -> GroupResult:
    variant = workdir / f"drc_{group.lower()}.lydrc"
    variant.write_text(deck_for_group(deck.read_text(), group))
    report = workdir / f"drc_{group.lower()}.lyrdb"
    report.unlink(missing_ok=True)
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run([klayout, "-zz", "-rd", f"in_gds={gds}", "-rd", f"report_file={report}",
                               "-r", str(variant)], stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-2:]
        raise UserError(f"drc {group} failed (exit {proc.returncode}); see {log}: " + " | ".join(tail))
    counts = count_violations(report)
    return GroupResult(group, sum(counts.values()), dict(counts), seconds, report)


def drc_markdown(gds: Path, deck: Path, results: list[GroupResult]) -> str:
    lines = ["## KLayout DRC", "", f"`{gds.name}` against the platform's deck `{deck.name}`, one rule group "
             "at a time (`moekda drc`).", "", "| group | violations | wall time s |", "|---|---|---|"]
    lines += [f"| {r.group} | {r.violations} | {r.seconds:.0f} |" for r in results]
    rules = sorted(((rule, n, r.group) for r in results for rule, n in r.by_rule.items()), key=lambda x: -x[1])
    if rules:
        lines += ["", "| rule | group | count |", "|---|---|---|"]
        lines += [f"| {rule} | {group} | {n} |" for rule, n, group in rules[:30]]
    return "\n".join(lines) + "\n"


def run_drc(gds: Path, deck: Path, workdir: Path, logs: Path, metrics_json: Path, report_md: Path,
            groups: tuple[str, ...] = GROUPS, klayout: str | None = None,
            progress: Callable[[str], None] = print) -> dict[str, object]:
    if not gds.is_file():
        raise UserError(f"drc: no GDS at {gds}; run `make pnr` first")
    if not deck.is_file():
        raise UserError(f"drc: no DRC deck at {deck}; run `make setup`")
    klayout = klayout or find_klayout()
    workdir.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    from flow.pnr import merge_metrics
    results, metrics = [], {}
    for i, group in enumerate(groups, 1):
        progress(f"drc [{i}/{len(groups)}] {group} ...")
        r = run_group(klayout, deck, gds, workdir, group, logs / f"drc_{group.lower()}.log")
        results.append(r)
        progress(f"drc [{i}/{len(groups)}] {group}: {r.violations} violations in {r.seconds:.0f} s")
        # each group's result is kept as soon as it is known: FEOL can take hours, and a
        # later group that fails must not lose the earlier ones
        merged = merge_metrics(metrics_json, {f"drc__klayout__{group.lower()}__violations": r.violations,
                                              f"drc__klayout__{group.lower()}__runtime__s": round(r.seconds, 1)})
        # the total over every group checked so far on this GDS (a run may check some groups only)
        checked = [g for g in GROUPS if f"drc__klayout__{g.lower()}__violations" in merged]
        metrics = {"drc__klayout__violations": sum(merged[f"drc__klayout__{g.lower()}__violations"] for g in checked),
                   "drc__klayout__groups": ",".join(checked)}
        metrics = {k: v for k, v in merge_metrics(metrics_json, metrics).items() if k.startswith("drc__")}
        report_md.write_text(drc_markdown(gds, deck, results))
    return metrics
