"""The platform's LEFs with the rules of its own DRC deck that they leave out (made at set-up).

    python -m pdk.lef_patch [--kit DIR] [--out DIR] [--record] [--show CELL ...]

The KLayout deck ``drc/FreePDK45.lydrc`` checks two things the router and OpenROAD's
antenna checker cannot see in ORFS's Nangate45 LEFs, so a routed chip with 0 routing
violations could still fail the deck (the routed tiny chip did, once each):

* **metal1 wide-metal spacing** (METAL1.5-9: metal1 at least 90 nm wide with edges of
  300 nm or more needs 90 nm of space, and so on up to 1.5 um / 4 um / 1.5 um).  The tech
  LEF gives metal1 a single ``SPACING 0.065``; metal2 to metal10 carry the deck's rules as
  ``SPACINGTABLE PARALLELRUNLENGTH`` tables.  The patched tech LEF gives metal1 the table
  built from the deck's METAL1 rules the same way (row: the wider shape's width, column:
  the parallel run length; the deck's minimum spacing below the first rule), which is
  the form TritonRoute (OpenROAD's detailed router) reads for LEF 5.6 spacing.  Built the
  same way, metal2's and metal3's rules give exactly the kit's own tables (a test checks it).
* **antenna ratios** (METALn_ANTENNA, n = 1..10: ``antenna_check(gate, metaln, 300.0,
  diode)``).  KLayout's check divides the area of one metal layer (not cumulative, not side
  area) on a net by the area of gate (poly over active) on the net and exempts every net
  that reaches the diode layer (``nplus & active - nwell``: n-type diffusion, through a
  contact).  No via layer is checked.  The tech LEF has no ``ANTENNA*`` statement and the
  cell LEF no pin areas, so ``check_antennas`` and ``repair_antennas`` saw nothing.  The
  patched tech LEF gives every routing layer the deck checks ``ANTENNAAREARATIO`` = the
  deck's ratio x ANTENNA_MARGIN (300 x 0.9 = 270), and no ``ANTENNADIFFAREARATIO``: as in
  the deck, a net with diffusion is not limited (OpenROAD's checker compares a node with
  diffusion only against a DIFF ratio, and there is none).  The patched cell LEF gives each
  signal pin the areas the deck would count, measured from the kit's cell GDS with the
  KLayout Python module: ``ANTENNAGATEAREA`` = area of ``poly & active`` on the pin's net
  inside the cell, ``ANTENNADIFFAREA`` = area of the deck's diode layer less the gates
  (``nplus & active - nwell - poly``, the n-type source/drain regions) reached by a contact
  of the pin's net.  The net is followed from the pin's LEF shapes through the deck's own
  connections (metal1 - contact - poly, and metal1 - via1 - metal2 should a cell use it).

The kit's files are never changed: the patched copies are written beside them under new
names (``*.moekda.lef``), and ``pdk/nangate45.derived.sha256`` records their sha256 so that
the set-up checks what it made.  The output depends only on the kit's files and this
module (no dates, no paths), so the hashes hold on every machine.  ``--record`` rewrites
that file after an intended change here; ``--show CELL`` prints one cell's transistors as
measured (gate polygons with their width and length) to check against the GDS by hand.
"""
from __future__ import annotations

import argparse
import hashlib
import html
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PDK_DIR = Path(__file__).resolve().parent
KIT_DIR = PDK_DIR / "nangate45"    # = pdk.kit.DEFAULT_KIT_DIR (pdk.kit imports this module)
DERIVED_CHECKSUMS = PDK_DIR / "nangate45.derived.sha256"

# the derived files, relative to the kit directory, and the kit file each is made from
DERIVED_TECH_LEF = "lef/NangateOpenCellLibrary.tech.moekda.lef"
DERIVED_CELL_LEF = "lef/NangateOpenCellLibrary.macro.mod.moekda.lef"
SOURCE_TECH_LEF = "lef/NangateOpenCellLibrary.tech.lef"
SOURCE_CELL_LEF = "lef/NangateOpenCellLibrary.macro.mod.lef"
SOURCE_GDS = "gds/NangateOpenCellLibrary.gds"
SOURCE_DECK = "drc/FreePDK45.lydrc"
DERIVED = {DERIVED_TECH_LEF: SOURCE_TECH_LEF, DERIVED_CELL_LEF: SOURCE_CELL_LEF}

# the LEF antenna ratio is the deck's times this: repair works to 270:1 where KLayout checks
# 300:1, so rounding in OpenROAD's area sums or a shape KLayout merges differently does not
# bring a net back over the deck's line
ANTENNA_MARGIN = 0.9

# the deck's layers (drc/FreePDK45.lydrc "Layer definitions"), GDS layer/datatype
GDS_LAYERS = {"active": (1, 0), "nwell": (3, 0), "nplus": (4, 0), "poly": (9, 0),
              "cont": (10, 0), "metal1": (11, 0), "via1": (12, 0), "metal2": (13, 0)}
# what this module computes, in the deck's words; derive() refuses a deck that says otherwise
DECK_GATE = "gate = poly & active"
DECK_DIODE = "diode = nplus & active - nwell"
DECK_CONNECTIONS = ("connect(gate, poly)", "connect(poly, cont)", "connect(cont, metal1)",
                    "connect(metal1, via1)", "connect(via1, metal2)", "connect(diode, cont)")

AREA_DIGITS = 6   # um2: the GDS grid is 0.1 nm, so areas are exact to 1e-8 um2


class PatchError(RuntimeError):
    """The kit or the deck is not what this module knows how to translate."""


# ---- the deck ------------------------------------------------------------------------

def read_deck(path: Path) -> str:
    """The deck's Ruby text (the .lydrc is XML, its '&' written '&amp;')."""
    return html.unescape(Path(path).read_text())


def _um(value: str, unit: str) -> float:
    return float(value) * (1e-3 if unit == "nm" else 1.0)


_NUM = r"([0-9]+(?:\.[0-9]+)?)\.(nm|um)"


def deck_min_spacing(deck: str, layer: str) -> float:
    """The layer's minimum spacing, um (METALn.2: ``metaln.space(65.nm, euclidian)``)."""
    m = re.search(rf"^{layer}\.space\({_NUM}\s*,\s*euclidian\)", deck, re.M)
    if not m:
        raise PatchError(f"deck: no minimum spacing rule '{layer}.space(...)'")
    return _um(*m.groups())


@dataclass(frozen=True)
class WideRule:
    """Metal at least ``width`` wide, along an edge at least ``length`` long, needs ``space``."""
    width: float
    length: float
    space: float


def deck_wide_rules(deck: str, layer: str) -> list[WideRule]:
    """The layer's wide-metal spacing rules (METALn.5-9), in the deck's order."""
    m = re.search(rf"^((?:{layer}_gt\d+\s*,\s*)*{layer}_gt\d+)\s*=\s*classify_by_width\({layer}\s*,"
                  rf"([^)]*)\)", deck, re.M)
    if not m:
        return []
    names = [n.strip() for n in m.group(1).split(",")]
    dims = [_um(*d) for d in re.findall(_NUM, m.group(2))]
    if len(names) != len(dims):
        raise PatchError(f"deck: classify_by_width({layer}, ...) names {len(names)} layers for {len(dims)} widths")
    widths = dict(zip(names, dims))
    rules = []
    for name, length, lu, space, su in re.findall(
            rf"^({layer}_gt\d+)\.edges\.with_length\({_NUM}\s*,\s*nil\)\.space\({_NUM}\s*,\s*euclidian\)",
            deck, re.M):
        rules.append(WideRule(widths[name], _um(length, lu), _um(space, su)))
    if len(rules) != len(names):
        raise PatchError(f"deck: {len(names)} width classes of {layer} but {len(rules)} spacing rules read")
    return rules


def spacing_table(min_space: float, rules: list[WideRule]) -> tuple[list[float], list[tuple[float, list[float]]]]:
    """A LEF PARALLELRUNLENGTH table from the deck's rules: (run lengths, [(width, spacings)]).

    A pair of shapes whose wider one is at least ``width`` wide and which run in parallel for
    at least ``length`` needs the largest ``space`` of the rules they meet; below every rule,
    the minimum spacing."""
    prls = [0.0] + sorted({r.length for r in rules})
    widths = [0.0] + sorted({r.width for r in rules})
    rows = []
    for w in widths:
        row = []
        for p in prls:
            row.append(max([min_space] + [r.space for r in rules if r.width <= w and r.length <= p]))
        rows.append((w, row))
    return prls, rows


def lef_spacing_table(prls: list[float], rows: list[tuple[float, list[float]]]) -> str:
    """The table in the tech LEF's own layout (see its metal2)."""
    out = ["  SPACINGTABLE ",
           "    PARALLELRUNLENGTH    " + "".join(f"{p:<11.4f}" for p in prls)]
    for i, (w, row) in enumerate(rows):
        line = f"      WIDTH {w:<13.4f}" + "".join(f"{s:<11.4f}" for s in row)
        out.append(line + (" ;" if i == len(rows) - 1 else ""))
    return "\n".join(out)


def deck_antenna_rules(deck: str) -> dict[str, float]:
    """{metal layer: ratio} of the deck's antenna checks, after checking their form.

    Only the form this module translates is accepted: ``antenna_check(gate, <layer>,
    <ratio>, diode)``: area ratio of one layer's metal to the net's gate area, nets with
    the diode layer exempt."""
    block = re.search(r"^if ANTENNA\b(.*?)^end # ANTENNA", deck, re.M | re.S)
    if not block:
        raise PatchError("deck: no 'if ANTENNA ... end # ANTENNA' block")
    text = block.group(1)
    for stmt in (DECK_DIODE, *DECK_CONNECTIONS):
        if stmt not in text:
            raise PatchError(f"deck: the antenna block no longer says '{stmt}'")
    if DECK_GATE not in deck:
        raise PatchError(f"deck: no '{DECK_GATE}'")
    calls = re.findall(r"antenna_check\(([^)]*)\)", text)
    rules = {}
    for call in calls:
        args = [a.strip() for a in call.split(",")]
        if len(args) != 4 or args[0] != "gate" or args[3] != "diode" or not re.fullmatch(r"metal\d+", args[1]):
            raise PatchError(f"deck: antenna_check({call}) is not of the form (gate, metalN, ratio, diode)")
        rules[args[1]] = float(args[2])
    if not rules:
        raise PatchError("deck: no antenna_check")
    return rules


# ---- the tech LEF ---------------------------------------------------------------------

def _layer_blocks(text: str):
    """(name, start, end) of each ``LAYER name ... END name`` block of a tech LEF."""
    for m in re.finditer(r"^LAYER (\S+)\s*\n(.*?)^END \1\s*$", text, re.M | re.S):
        yield m.group(1), m.start(2), m.end(2), m.group(2)


def patch_tech_lef(text: str, deck: str, margin: float = ANTENNA_MARGIN) -> str:
    """The tech LEF with metal1's spacing table and every checked layer's antenna ratio."""
    antenna = deck_antenna_rules(deck)
    out, pos, seen = [], 0, set()
    for name, start, end, body in _layer_blocks(text):
        new = body
        if name == "metal1":
            rules = deck_wide_rules(deck, "metal1")
            if not rules:
                raise PatchError("deck: no wide-metal spacing rules for metal1")
            if "SPACINGTABLE" in body:
                raise PatchError("tech LEF: metal1 already has a SPACINGTABLE")
            table = lef_spacing_table(*spacing_table(deck_min_spacing(deck, "metal1"), rules))
            new, n = re.subn(r"^  SPACING [0-9.]+ ;\n", table + "\n", new, count=1, flags=re.M)
            if n != 1:
                raise PatchError("tech LEF: metal1 has no 'SPACING x ;' line to replace")
        if name in antenna:
            if "ANTENNA" in body:
                raise PatchError(f"tech LEF: {name} already has antenna rules")
            ratio = antenna[name] * margin
            new = new + (f"  ANTENNAMODEL OXIDE1 ;\n"
                         f"  ANTENNAAREARATIO {ratio:g} ;\n")
            seen.add(name)
        out.append(text[pos:start])
        out.append(new)
        pos = end
    out.append(text[pos:])
    if seen != set(antenna):
        raise PatchError(f"tech LEF: no layer block for {', '.join(sorted(set(antenna) - seen))}")
    header = (f"# Made by pdk/lef_patch.py from {SOURCE_TECH_LEF} and {SOURCE_DECK}: metal1's\n"
              f"# wide-metal spacing (deck METAL1.5-9) as a SPACINGTABLE, and ANTENNAAREARATIO =\n"
              f"# {margin:g} x the deck's antenna ratio on every metal layer it checks.\n")
    return header + "".join(out)


# ---- the cell LEF and the cells' layouts --------------------------------------------------

@dataclass(frozen=True)
class LefPin:
    name: str
    direction: str
    use: str
    rects: tuple[tuple[str, float, float, float, float], ...]   # (layer, x0, y0, x1, y1) um


def lef_macros(text: str) -> dict[str, list[LefPin]]:
    """{cell: its pins} with each pin's port rectangles (the cell LEF writes RECTs)."""
    macros = {}
    for m in re.finditer(r"^MACRO (\S+)\s*\n(.*?)^END \1\s*$", text, re.M | re.S):
        pins = []
        for p in re.finditer(r"^  PIN (\S+)\s*\n(.*?)^  END \1\s*$", m.group(2), re.M | re.S):
            body = p.group(2)
            direction = re.search(r"DIRECTION (\S+) ;", body)
            use = re.search(r"USE (\S+) ;", body)
            rects, layer = [], None
            for line in body.splitlines():
                words = line.split()
                if words[:1] == ["LAYER"]:
                    layer = words[1]
                elif words[:1] == ["RECT"]:
                    rects.append((layer, *map(float, words[1:5])))
                elif words[:1] == ["POLYGON"]:
                    raise PatchError(f"cell LEF: {m.group(1)}/{p.group(1)} has a POLYGON port (RECTs expected)")
            pins.append(LefPin(p.group(1), direction.group(1) if direction else "",
                               use.group(1).upper() if use else "SIGNAL", tuple(rects)))
        macros[m.group(1)] = pins
    return macros


@dataclass(frozen=True)
class PinAreas:
    gate: float   # um2 of poly over active on the pin's net (ANTENNAGATEAREA)
    diff: float   # um2 of n-diffusion source/drain reached by the net (ANTENNADIFFAREA)


def _regions(layout, cell):
    import klayout.db as kdb
    regions = {}
    for name, (layer, datatype) in GDS_LAYERS.items():
        index = layout.find_layer(layer, datatype)
        regions[name] = (kdb.Region(cell.begin_shapes_rec(index)) if index is not None
                         else kdb.Region()).merged()
    regions["gate"] = regions["poly"] & regions["active"]
    regions["sd_n"] = ((regions["nplus"] & regions["active"]) - regions["nwell"]) - regions["poly"]
    return regions


def pin_net(regions: dict, seed):
    """The pin's net inside the cell, followed from its metal1 through the deck's connections
    (metal1 - cont - poly, metal1 - via1 - metal2): the net's (metal1, poly, cont) regions."""
    import klayout.db as kdb
    m1 = regions["metal1"].interacting(seed)
    m2, poly, cont = kdb.Region(), kdb.Region(), kdb.Region()
    while True:
        size = (m1.count(), m2.count(), poly.count(), cont.count())
        via = regions["via1"].interacting(m1) + regions["via1"].interacting(m2)
        m2 = regions["metal2"].interacting(via)
        cont = regions["cont"].interacting(m1)
        poly = regions["poly"].interacting(cont)
        cont = cont + regions["cont"].interacting(poly)
        m1 = regions["metal1"].interacting(cont) + regions["metal1"].interacting(via) + m1
        m1, cont = m1.merged(), cont.merged()
        if (m1.count(), m2.count(), poly.count(), cont.count()) == size:
            return m1, poly, cont


def _area_um2(region, dbu: float) -> float:
    return round(region.area() * dbu * dbu, AREA_DIGITS)


def measure_cell(layout, cell, pins: list[LefPin]) -> dict[str, PinAreas]:
    """Each signal pin's gate and diffusion areas in one cell's layout."""
    import klayout.db as kdb
    dbu = layout.dbu
    regions = _regions(layout, cell)
    out = {}
    for pin in pins:
        if pin.use in ("POWER", "GROUND"):
            continue
        seed = kdb.Region()
        for layer, x0, y0, x1, y1 in pin.rects:
            if layer != "metal1":
                raise PatchError(f"{cell.name}/{pin.name}: a port on {layer} (metal1 expected)")
            seed.insert(kdb.Box(round(x0 / dbu), round(y0 / dbu), round(x1 / dbu), round(y1 / dbu)))
        if seed.is_empty():
            raise PatchError(f"{cell.name}/{pin.name}: no port shapes")
        m1, poly, cont = pin_net(regions, seed)
        if m1.is_empty():
            raise PatchError(f"{cell.name}/{pin.name}: the LEF port touches no metal1 of the GDS")
        gate = regions["gate"] & poly
        diff = regions["sd_n"].interacting(cont)
        out[pin.name] = PinAreas(_area_um2(gate, dbu), _area_um2(diff, dbu))
    return out


def measure_library(gds: Path, cell_lef_text: str) -> dict[str, dict[str, PinAreas]]:
    """{cell: {pin: areas}} for every cell of the cell LEF, from the kit's GDS."""
    import klayout.db as kdb
    layout = kdb.Layout()
    layout.read(str(gds))
    out = {}
    for name, pins in lef_macros(cell_lef_text).items():
        index = layout.cell_by_name(name) if layout.has_cell(name) else None
        if index is None:
            raise PatchError(f"{gds.name}: no layout of {name}")
        out[name] = measure_cell(layout, layout.cell(index), pins)
    return out


def _fmt_area(a: float) -> str:
    return f"{a:.{AREA_DIGITS}f}".rstrip("0").rstrip(".")


def patch_cell_lef(text: str, areas: dict[str, dict[str, PinAreas]]) -> str:
    """The cell LEF with each signal pin's measured ANTENNAGATEAREA / ANTENNADIFFAREA
    (after its USE line; a value the LEF had, ANTENNA_X1's 'unknown' 0.0, is replaced)."""
    def macro(m):
        cell = m.group(1)

        def pin(p):
            a = areas.get(cell, {}).get(p.group(1))
            body = p.group(2)
            if a is None:
                return p.group(0)
            body = re.sub(r"^    # unknown\n", "", body, flags=re.M)
            body = re.sub(r"^    ANTENNA(GATE|DIFF)AREA .*\n", "", body, flags=re.M)
            lines = ([f"    ANTENNAGATEAREA {_fmt_area(a.gate)} ;\n"] if a.gate > 0 else []) + \
                    ([f"    ANTENNADIFFAREA {_fmt_area(a.diff)} ;\n"] if a.diff > 0 else [])
            body, n = re.subn(r"^(    USE \S+ ;\n)", lambda u: u.group(1) + "".join(lines), body,
                              count=1, flags=re.M)
            if n != 1:
                raise PatchError(f"cell LEF: {cell}/{p.group(1)} has no USE line")
            return f"  PIN {p.group(1)}\n{body}  END {p.group(1)}\n"
        body = re.sub(r"^  PIN (\S+)[ \t]*\n(.*?)^  END \1[ \t]*\n", pin, m.group(2), flags=re.M | re.S)
        return f"MACRO {cell}\n{body}END {cell}\n"
    header = (f"# Made by pdk/lef_patch.py from {SOURCE_CELL_LEF}: every signal pin's ANTENNAGATEAREA\n"
              f"# (poly over active on its net) and ANTENNADIFFAREA (n-diffusion, the antenna deck's\n"
              f"# diode) measured from {SOURCE_GDS} with KLayout.\n")
    return header + re.sub(r"^MACRO (\S+)[ \t]*\n(.*?)^END \1[ \t]*\n", macro, text, flags=re.M | re.S)


# ---- making and checking the files ----------------------------------------------------

def derive_texts(kit: Path) -> dict[str, str]:
    """{derived path: its text} from the kit directory's files."""
    deck = read_deck(kit / SOURCE_DECK)
    cell_text = (kit / SOURCE_CELL_LEF).read_text()
    areas = measure_library(kit / SOURCE_GDS, cell_text)
    return {DERIVED_TECH_LEF: patch_tech_lef((kit / SOURCE_TECH_LEF).read_text(), deck),
            DERIVED_CELL_LEF: patch_cell_lef(cell_text, areas)}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def recorded() -> dict[str, str]:
    """{derived path: sha256} from pdk/nangate45.derived.sha256."""
    out = {}
    for n, line in enumerate(DERIVED_CHECKSUMS.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            digest, path, source = line.split()
        except ValueError:
            raise PatchError(f"{DERIVED_CHECKSUMS}:{n}: expected 'sha256  path  derived:source'") from None
        out[path] = digest
    return out


def write_derived(kit: Path, out: Path, check: bool = True) -> list[Path]:
    """Write the derived LEFs under ``out`` (their kit-relative paths); with ``check``, each
    must match its recorded sha256 (else nothing is written)."""
    texts = derive_texts(kit)
    if check:
        want = recorded()
        bad = [p for p, t in texts.items() if want.get(p) != sha256_text(t)]
        if bad:
            raise PatchError(f"derived {', '.join(bad)} differ from {DERIVED_CHECKSUMS.name} "
                             f"(after an intended change to pdk/lef_patch.py: python -m pdk.lef_patch --record)")
    written = []
    for path, text in texts.items():
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        tmp.write_text(text)
        tmp.replace(target)
        written.append(target)
    return written


def record(kit: Path) -> str:
    texts = derive_texts(kit)
    lines = ["# Nangate45 kit, derived files (pdk/lef_patch.py): sha256  path-in-pdk/nangate45  derived:source.",
             "# Made at set-up from the kit's files; rewrite with `python -m pdk.lef_patch --record`."]
    for path, text in texts.items():
        lines.append(f"{sha256_text(text)}  {path}  derived:{DERIVED[path]}")
    DERIVED_CHECKSUMS.write_text("\n".join(lines) + "\n")
    return DERIVED_CHECKSUMS.read_text()


def show_cell(kit: Path, name: str) -> str:
    """One cell's gate polygons (width x length) and each pin's measured areas, for checking by hand."""
    import klayout.db as kdb
    layout = kdb.Layout()
    layout.read(str(kit / SOURCE_GDS))
    cell = layout.cell(layout.cell_by_name(name))
    pins = lef_macros((kit / SOURCE_CELL_LEF).read_text())[name]
    regions = _regions(layout, cell)
    dbu = layout.dbu
    lines = [f"{name}: gates (poly over active), um"]
    for poly in regions["gate"].each():
        box = poly.bbox()
        lines.append(f"  gate at ({box.left * dbu:.3f}, {box.bottom * dbu:.3f}) {box.width() * dbu:.3f} x "
                     f"{box.height() * dbu:.3f} = {poly.area() * dbu * dbu:.6f} um2")
    for pin, a in measure_cell(layout, cell, pins).items():
        lines.append(f"  pin {pin}: ANTENNAGATEAREA {_fmt_area(a.gate)}  ANTENNADIFFAREA {_fmt_area(a.diff)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", type=Path, default=KIT_DIR, help="the kit directory (default pdk/nangate45)")
    ap.add_argument("--out", type=Path, help="write the derived files here (default: the kit directory)")
    ap.add_argument("--record", action="store_true", help=f"rewrite {DERIVED_CHECKSUMS.name} from the kit")
    ap.add_argument("--show", nargs="*", default=[], metavar="CELL", help="print a cell's gates and pin areas")
    args = ap.parse_args(argv)
    try:
        for name in args.show:
            print(show_cell(args.kit, name))
        if args.record:
            print(record(args.kit), end="")
        elif not args.show:
            for p in write_derived(args.kit, args.out or args.kit):
                print(p)
        return 0
    except PatchError as e:
        print(f"lef_patch: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
