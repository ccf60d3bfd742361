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
# groups whose violations are placed in the cell under them: an antenna is a whole net's
# (the real run's one is a metal7 wire at the chip's edge; the cell under it says nothing)
PLACED_GROUPS = ("BEOL", "FEOL", "OFFGRID")
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


def _items(lyrdb: Path):
    """(rule, item element) for each violation in a KLayout report database."""
    if not lyrdb.is_file():
        raise UserError(f"{lyrdb}: KLayout wrote no report database")
    try:
        root = ET.parse(lyrdb).getroot()
    except ET.ParseError as e:
        raise UserError(f"{lyrdb}: not a KLayout report database ({e})") from None
    items = root.find("items")
    for item in (items if items is not None else []):
        yield (item.findtext("category") or "?").strip().strip("'"), item


def count_violations(lyrdb: Path) -> Counter:
    """Violations per rule (category) in a KLayout report database."""
    return Counter(rule for rule, _ in _items(lyrdb))


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE]-?\d+)?")
_SHAPES = ("polygon", "box", "edge-pair", "edge", "path")


def markers(lyrdb: Path) -> list[tuple[str, float, float]]:
    """Each violation's rule and the centre (um) of its marker's coordinates: edge pairs,
    polygons, boxes and edges alike are lists of points in a report database's values."""
    found = []
    for rule, item in _items(lyrdb):
        # geometry values only: an antenna item also carries `[#agate] float: 0.0205` and the like
        shapes = [v.text.split(":", 1)[1] for v in item.iter("value")
                  if (v.text or "").split(":", 1)[0].strip() in _SHAPES and ":" in v.text]
        nums = [float(x) for text in shapes for x in _NUMBER.findall(text)]
        xs, ys = nums[0::2], nums[1::2]
        if xs and len(xs) == len(ys):
            found.append((rule, (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2))
    return found


def masters_at(gds: Path, points: list[tuple[float, float]]) -> list[str]:
    """For each point, the library cell (master) of the top cell's instance over it: the
    smallest one where abutting cells share an edge; `(routing)` where no cell is."""
    from flow.gds import klayout_db
    db = klayout_db()
    layout = db.Layout()
    layout.read(str(gds))
    top = layout.top_cell()
    names = []
    for x, y in points:
        probe = db.DBox(x - 0.001, y - 0.001, x + 0.001, y + 0.001)
        insts = list(top.each_overlapping_inst(probe))
        if not insts:
            names.append("(routing)")
            continue
        best = min(insts, key=lambda i: i.dbbox().area())
        names.append(best.cell.name.split("$")[0])     # KLayout names a cell's variants NAME$n
    return names


def library_layout(lib_gds: tuple[Path, ...], out: Path, pitch_um: float = 5.0, row_um: float = 200.0) -> Path:
    """Every cell of the library GDS once, `pitch_um` apart: the cells' own layouts, to tell a
    chip's violations that come with the library from the ones placement and routing make."""
    from flow.gds import klayout_db
    db = klayout_db()
    src = db.Layout()
    for path in lib_gds:
        src.read(str(path))
    lay = db.Layout()
    lay.dbu = src.dbu
    top = lay.create_cell("LIBRARY")
    gap, width = round(pitch_um / src.dbu), round(row_um / src.dbu)
    x = y = row_h = 0
    for cell in sorted((c for c in src.each_cell() if c.is_top()), key=lambda c: c.name):
        box = cell.bbox()
        copy = lay.create_cell(cell.name)
        copy.copy_tree(cell)
        if x and x + box.width() > width:
            x, y, row_h = 0, y + row_h + gap, 0
        top.insert(db.CellInstArray(copy.cell_index(), db.Trans(x - box.left, y - box.bottom)))
        x, row_h = x + box.width() + gap, max(row_h, box.height())
    options = db.SaveLayoutOptions()
    options.add_cell(top.cell_index())
    lay.write(str(out), options)
    return out


def attribute(chip: GroupResult, gds: Path, library: GroupResult, library_chip: Path
              ) -> list[tuple[str, str, int, bool]]:
    """(rule, master, count, the master violates the rule on its own) for the chip's
    violations, most first.  `library` is the same group run on library_layout's GDS."""
    found = markers(chip.report)
    where = masters_at(gds, [(x, y) for _, x, y in found])
    lib_found = markers(library.report)
    own = {(rule, m) for (rule, _, _), m in zip(lib_found, masters_at(library_chip, [(x, y) for _, x, y in lib_found]))}
    counts = Counter((rule, m) for (rule, _, _), m in zip(found, where))
    return [(rule, m, n, (rule, m) in own) for (rule, m), n in counts.most_common()]


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


def drc_markdown(gds: Path, deck: Path, results: list[GroupResult],
                 where: dict[str, list[tuple[str, str, int, bool]]] | None = None) -> str:
    lines = ["## KLayout DRC", "", f"`{gds.name}` against the platform's deck `{deck.name}`, one rule group "
             "at a time (`moekda drc`).", "", "| group | violations | wall time s |", "|---|---|---|"]
    lines += [f"| {r.group} | {r.violations} | {r.seconds:.0f} |" for r in results]
    rules = sorted(((rule, n, r.group) for r in results for rule, n in r.by_rule.items()), key=lambda x: -x[1])
    if rules:
        lines += ["", "| rule | group | count |", "|---|---|---|"]
        lines += [f"| {rule} | {group} | {n} |" for rule, n, group in rules[:30]]
    rows = [(group, *row) for group, found in (where or {}).items() for row in found]
    if rows:
        lines += ["", "Where they are: the library cell under each marker (`(routing)`: none), and whether "
                  "that cell's own layout, placed alone (every cell of the library GDS once, 5 um apart), "
                  "breaks the same rule.", "",
                  "| group | rule | cell | count | in the cell's own layout |", "|---|---|---|---|---|"]
        rows.sort(key=lambda r: -r[3])
        lines += [f"| {g} | {rule} | {cell} | {n} | {'yes' if own else 'no'} |" for g, rule, cell, n, own in rows[:40]]
    return "\n".join(lines) + "\n"


def run_drc(gds: Path, deck: Path, workdir: Path, logs: Path, metrics_json: Path, report_md: Path,
            groups: tuple[str, ...] = GROUPS, klayout: str | None = None,
            progress: Callable[[str], None] = print, library_gds: tuple[Path, ...] = ()) -> dict[str, object]:
    """Runs `groups` one at a time; with `library_gds` (the kit's cell layouts) each group
    with violations is also run on library_layout's GDS and its violations attributed
    (attribute): the counts of the ones the cells bring with them go into the metrics as
    ``drc__klayout__<group>__in_cell_layouts``."""
    if not gds.is_file():
        raise UserError(f"drc: no GDS at {gds}; run `make pnr` first")
    if not deck.is_file():
        raise UserError(f"drc: no DRC deck at {deck}; run `make setup`")
    klayout = klayout or find_klayout()
    workdir.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    from flow.pnr import merge_metrics
    results, metrics, where = [], {}, {}
    library = None
    for i, group in enumerate(groups, 1):
        progress(f"drc [{i}/{len(groups)}] {group} ...")
        r = run_group(klayout, deck, gds, workdir, group, logs / f"drc_{group.lower()}.log")
        results.append(r)
        progress(f"drc [{i}/{len(groups)}] {group}: {r.violations} violations in {r.seconds:.0f} s")
        found = {f"drc__klayout__{group.lower()}__violations": r.violations,
                 f"drc__klayout__{group.lower()}__runtime__s": round(r.seconds, 1)}
        if library_gds and r.violations and group in PLACED_GROUPS:
            lib_dir = workdir / "library"
            lib_dir.mkdir(exist_ok=True)
            library = library or library_layout(library_gds, lib_dir / "library.gds")
            lib_r = run_group(klayout, deck, library, lib_dir, group, logs / f"drc_{group.lower()}_library.log")
            where[group] = attribute(r, gds, lib_r, library)
            own = sum(n for _, _, n, mine in where[group] if mine)
            found[f"drc__klayout__{group.lower()}__in_cell_layouts"] = own
            progress(f"drc [{i}/{len(groups)}] {group}: {own} of them where the cell's own layout has them "
                     f"({lib_r.violations} in the library's cells alone)")
        # each group's result is kept as soon as it is known: FEOL can take hours, and a
        # later group that fails must not lose the earlier ones
        merged = merge_metrics(metrics_json, found)
        # the total over every group checked so far on this GDS (a run may check some groups only)
        checked = [g for g in GROUPS if f"drc__klayout__{g.lower()}__violations" in merged]
        metrics = {"drc__klayout__violations": sum(merged[f"drc__klayout__{g.lower()}__violations"] for g in checked),
                   "drc__klayout__groups": ",".join(checked)}
        metrics = {k: v for k, v in merge_metrics(metrics_json, metrics).items() if k.startswith("drc__")}
        report_md.write_text(drc_markdown(gds, deck, results, where))
    return metrics
