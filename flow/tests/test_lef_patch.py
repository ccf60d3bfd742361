"""The patched LEFs set-up makes (pdk/lef_patch.py): the deck's metal1 spacing and antenna
rules in the tech LEF, the pins' antenna areas measured from the cells' GDS in the cell LEF."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from pdk import lef_patch
from pdk.kit import DEFAULT_KIT_DIR, find_kit
from pdk.setup_kit import derived_mismatched, remove_strays

KIT = DEFAULT_KIT_DIR


@pytest.fixture(scope="module")
def kit():
    return find_kit(("tech_lef", "cell_lef", "gds", "drc_deck"))


@pytest.fixture(scope="module")
def deck(kit):
    return lef_patch.read_deck(kit.drc_deck)


def lef_layer(text: str, name: str) -> str:
    m = re.search(rf"^LAYER {name}\s*\n(.*?)^END {name}\s*$", text, re.M | re.S)
    assert m, f"no LAYER {name}"
    return m.group(1)


def lef_table(body: str) -> tuple[list[float], list[tuple[float, list[float]]]]:
    """A layer's PARALLELRUNLENGTH table as numbers."""
    m = re.search(r"SPACINGTABLE\s+PARALLELRUNLENGTH([^;]*);", body, re.S)
    assert m, "no SPACINGTABLE PARALLELRUNLENGTH"
    words = m.group(1).split()
    first = words.index("WIDTH")
    prls = [float(w) for w in words[:first]]
    rows, i = [], first
    while i < len(words):
        assert words[i] == "WIDTH"
        rows.append((float(words[i + 1]), [float(w) for w in words[i + 2:i + 2 + len(prls)]]))
        i += 2 + len(prls)
    return prls, rows


def lef_pin_areas(text: str) -> dict[tuple[str, str], dict[str, float]]:
    out = {}
    for m in re.finditer(r"^MACRO (\S+)\s*\n(.*?)^END \1", text, re.M | re.S):
        for p in re.finditer(r"^  PIN (\S+)\s*\n(.*?)^  END \1", m.group(2), re.M | re.S):
            out[(m.group(1), p.group(1))] = {k: float(v) for k, v in
                                             re.findall(r"ANTENNA(GATE|DIFF)AREA ([0-9.]+) ;", p.group(2))}
    return out


# ---- the tech LEF -------------------------------------------------------------------

def test_metal1_table_from_the_deck(deck):
    """METAL1.2 and .5-.9 give the table; metal2's and metal3's rules, translated the same
    way, give exactly the tables the kit's own tech LEF has (so the translation is the
    platform's own reading of the deck)."""
    prls, rows = lef_patch.spacing_table(lef_patch.deck_min_spacing(deck, "metal1"),
                                         lef_patch.deck_wide_rules(deck, "metal1"))
    assert prls == [0.0, 0.3, 0.9, 1.8, 2.7, 4.0]
    assert [w for w, _ in rows] == [0.0, 0.09, 0.27, 0.5, 0.9, 1.5]
    assert rows[0][1] == [0.065] * 6
    assert rows[1][1] == [0.065, 0.09, 0.09, 0.09, 0.09, 0.09]          # METAL1.5: the tiny violation
    assert rows[5][1] == [0.065, 0.09, 0.27, 0.5, 0.9, 1.5]
    source = (KIT / lef_patch.SOURCE_TECH_LEF).read_text()
    for layer in ("metal2", "metal3"):
        ours = lef_patch.spacing_table(lef_patch.deck_min_spacing(deck, layer),
                                       lef_patch.deck_wide_rules(deck, layer))
        assert ours == lef_table(lef_layer(source, layer)), layer


def test_patched_tech_lef_has_the_rules(kit):
    assert kit.tech_lef.name == "NangateOpenCellLibrary.tech.moekda.lef"
    text = kit.tech_lef.read_text()
    source = kit.source_tech_lef.read_text()
    m1 = lef_layer(text, "metal1")
    assert "SPACING 0.065 ;" in lef_layer(source, "metal1") and not re.search(r"^\s*SPACING ", m1, re.M)
    prls, rows = lef_table(m1)
    assert rows[1] == (0.09, [0.065, 0.09, 0.09, 0.09, 0.09, 0.09]) and prls[1] == 0.3
    for n in range(1, 11):
        body = lef_layer(text, f"metal{n}")
        assert re.search(r"^\s*ANTENNAAREARATIO 270 ;", body, re.M), f"metal{n}"
        assert "DIFF" not in body     # the deck exempts nets with diffusion
    for n in range(1, 10):
        assert "ANTENNA" not in lef_layer(text, f"via{n}")     # the deck checks no cut layer
    # nothing else changed: the kit's text with the added lines taken out again
    stripped = re.sub(r"^#.*\n", "", text, flags=re.M)
    stripped = re.sub(r"^  ANTENNA(MODEL|AREARATIO) .*\n", "", stripped, flags=re.M)
    stripped = stripped.replace(lef_patch.lef_spacing_table(prls, rows) + "\n", "  SPACING 0.065 ;\n")
    assert stripped == re.sub(r"^#.*\n", "", source, flags=re.M)


def test_antenna_rules_read_from_the_deck(deck):
    assert lef_patch.deck_antenna_rules(deck) == {f"metal{n}": 300.0 for n in range(1, 11)}
    # a deck whose check this module would translate wrongly is refused, not guessed
    for old, new in (("300.0, diode)", "300.0, [diode, 50.0])"),
                     ("diode = nplus & active - nwell", "diode = (nplus | pplus) & active"),
                     ("antenna_check(gate, metal7,", "antenna_check(gate, 0.5, metal7, 0.1,")):
        changed = deck.replace(old, new, 1)
        assert changed != deck
        with pytest.raises(lef_patch.PatchError):
            lef_patch.deck_antenna_rules(changed)


def test_openroad_reads_the_patched_lefs(kit, tmp_path):
    """OpenROAD parses both files: metal1's table, every layer's ratio, a pin's antenna model."""
    openroad = shutil.which("openroad") or "/root/openroad/bin/openroad"
    if not shutil.which(openroad):
        pytest.skip("no openroad")
    script = tmp_path / "read.tcl"
    script.write_text(
        f"read_lef {kit.tech_lef}\nread_lef {kit.cell_lef}\n"
        "set tech [[ord::get_db] getTech]\n"
        "foreach n {1 4 7 10} { set l [$tech findLayer metal$n]\n"
        "  puts \"metal$n [$l hasV55SpacingRules] [[$l getDefaultAntennaRule] getPAR]\" }\n"
        "set lib [[ord::get_db] findLib NangateOpenCellLibrary.macro.mod.moekda]\n"
        "puts \"INV_X1/A [[[$lib findMaster INV_X1] findMTerm A] hasDefaultAntennaModel]\"\n")
    out = subprocess.run([openroad, "-exit", "-no_init", "-threads", "1", str(script)],
                         capture_output=True, text=True, timeout=120).stdout
    assert "created 135 library cells" in out, out
    for n in (1, 4, 7, 10):
        assert f"metal{n} 1 270.0" in out, out
    assert "INV_X1/A 1" in out, out


# ---- the cell LEF -----------------------------------------------------------------------

# by hand from the transistors in the GDS (`python -m pdk.lef_patch --show CELL` lists each
# gate's width and length; the CDL netlist gives the same W and L): all L = 0.05 um
BY_HAND = {
    ("INV_X1", "A"): 0.05 * (0.415 + 0.630),                  # one NMOS, one PMOS
    ("NAND2_X1", "A1"): 0.05 * (0.415 + 0.630),
    ("NAND2_X1", "A2"): 0.05 * (0.415 + 0.630),
    ("DFF_X1", "D"): 0.05 * (0.275 + 0.420),                  # MN3, MP3
    ("DFF_X1", "CK"): 0.05 * (0.210 + 0.315),                 # MN1, MP1
    ("BUF_X1", "A"): 0.05 * (0.210 + 0.315),
}


def test_gate_areas_by_hand(kit):
    areas = lef_pin_areas(kit.cell_lef.read_text())
    for (cell, pin), want in BY_HAND.items():
        assert areas[(cell, pin)]["GATE"] == pytest.approx(want, rel=1e-6), (cell, pin)
        assert "DIFF" not in areas[(cell, pin)]
    # outputs carry the deck's diode (n-diffusion) area; INV_X1's drain 0.415 um wide
    assert areas[("INV_X1", "ZN")] == {"DIFF": pytest.approx(0.043575, rel=1e-6)}
    assert areas[("ANTENNA_X1", "A")] == {"DIFF": pytest.approx(0.0081, rel=1e-6)}   # the repair diode
    assert areas[("LOGIC1_X1", "Z")] == {}      # a PMOS drain only: the deck gives it no diode


def test_every_input_pin_matches_the_netlist(kit):
    """Each input pin's area measured from the GDS equals the CDL's sum of W x L over the
    transistors whose gate the pin drives, and every output but the tie-high's has diffusion."""
    cdl, cell = {}, None
    for line in (KIT / "cdl" / "NangateOpenCellLibrary.cdl").read_text().splitlines():
        if line.startswith(".SUBCKT"):
            cell = line.split()[1]
            cdl[cell] = {}
        elif line.startswith("M") and cell:
            gate = line.split()[2]
            w = float(re.search(r"W=([0-9.]+)U", line).group(1))
            length = float(re.search(r"L=([0-9.]+)U", line).group(1))
            cdl[cell][gate] = cdl[cell].get(gate, 0.0) + w * length
    areas = lef_pin_areas(kit.cell_lef.read_text())
    directions = {(c, p.name): p.direction for c, pins in lef_patch.lef_macros(kit.cell_lef.read_text()).items()
                  for p in pins}
    inputs = [k for k, d in directions.items() if d == "INPUT" and k[0] != "ANTENNA_X1"]
    assert len(inputs) == 387
    for cell, pin in inputs:
        assert areas[(cell, pin)].get("GATE", 0.0) == pytest.approx(cdl[cell][pin], abs=1e-6), (cell, pin)
    outputs = [k for k, d in directions.items() if d == "OUTPUT"]
    assert [k for k in outputs if "DIFF" not in areas[k]] == [("LOGIC1_X1", "Z")]


def test_patched_cell_lef_only_adds_areas(kit):
    text = re.sub(r"^#.*\n", "", kit.cell_lef.read_text(), flags=re.M)
    text = re.sub(r"^    ANTENNA(GATE|DIFF)AREA .*\n", "", text, flags=re.M)
    source = re.sub(r"^#.*\n", "", kit.source_cell_lef.read_text(), flags=re.M)
    source = re.sub(r"^    # unknown\n    ANTENNADIFFAREA  0.0 ;\n", "", source, flags=re.M)   # ANTENNA_X1's
    assert text == source


# ---- made at set-up, reproducibly ------------------------------------------------------

def test_derived_files_are_the_recorded_ones(kit):
    """What set-up wrote is what the generator makes now and what the record says."""
    want = lef_patch.recorded()
    assert set(want) == {lef_patch.DERIVED_TECH_LEF, lef_patch.DERIVED_CELL_LEF}
    texts = lef_patch.derive_texts(KIT)
    for path, text in texts.items():
        assert lef_patch.sha256_text(text) == want[path], f"{path}: python -m pdk.lef_patch --record"
        assert (KIT / path).read_text() == text
    assert derived_mismatched(KIT) == []


def test_setup_makes_and_keeps_the_derived_files(tmp_path):
    """A kit directory without them is missing both; write_derived makes them (checked
    against the record); the stray sweep keeps them; a changed one is found."""
    assert sorted(derived_mismatched(tmp_path)) == sorted(lef_patch.recorded())
    made = lef_patch.write_derived(KIT, tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in made) == sorted(lef_patch.recorded())
    assert derived_mismatched(tmp_path) == []
    (tmp_path / "lef" / "old.lef").write_text("an older kit's file\n")
    assert remove_strays(tmp_path, []) == ["lef/old.lef"]
    assert derived_mismatched(tmp_path) == []
    target = tmp_path / lef_patch.DERIVED_TECH_LEF
    target.write_text(target.read_text().replace("ANTENNAAREARATIO 270", "ANTENNAAREARATIO 300", 1))
    assert derived_mismatched(tmp_path) == [lef_patch.DERIVED_TECH_LEF]
