"""moekda drc without KLayout's application: the deck is switched group by group, the
report database is counted per rule, and bad input gets one line."""
from __future__ import annotations

import pytest

from flow.drc import DEEP_GROUPS, FLAT_TILE_UM, GROUPS, count_violations, deck_for_group, find_klayout
import cli
from moekda.errors import UserError
from pdk.kit import find_kit

LYRDB = """<?xml version="1.0" encoding="utf-8"?>
<report-database>
 <categories><category><name>METAL1.1</name></category><category><name>VIA1.1</name></category></categories>
 <items>
  <item><category>'METAL1.1'</category><cell>top</cell><values><value>edge-pair: (0,0;1,1)/(2,2;3,3)</value></values></item>
  <item><category>'METAL1.1'</category><cell>top</cell><values><value>edge-pair: (5,0;6,1)/(7,2;8,3)</value></values></item>
  <item><category>VIA1.1</category><cell>top</cell><values><value>polygon: (0,0;0,1;1,1;1,0)</value></values></item>
 </items>
</report-database>
"""


def test_the_platform_deck_has_every_group_switch():
    deck = find_kit(("drc_deck",)).drc_deck.read_text()
    for group in GROUPS:
        variant = deck_for_group(deck, group)
        for other in GROUPS:
            state = "true" if other == group else "false"
            assert f"{other}" in variant and any(
                line.split("#")[0].replace(" ", "") == f"{other}={state}" for line in variant.splitlines()), other
        # nothing but the four switches and the engine mode changes (and, for ANTENNA, the
        # gate layer it needs)
        assert len(variant.splitlines()) == len(deck.splitlines()) + (group == "ANTENNA")
        modes = [line.strip() for line in variant.splitlines() if line.strip().startswith(("deep", "tiles("))]
        if group in DEEP_GROUPS:
            assert "deep" in modes
        else:   # FEOL deep did not finish a 4 % clip in 17 min; flat in 100 um tiles took 63 s
            assert "deep" not in modes and f"tiles({FLAT_TILE_UM}.um)" in modes
    antenna = deck_for_group(deck, "ANTENNA")
    assert antenna.index("gate = poly") < antenna.index("if ANTENNA") < antenna.index("connect(gate, poly)")


def test_a_deck_without_the_switch_is_refused():
    with pytest.raises(UserError, match="no `FEOL = true|false` switch"):
        deck_for_group("BEOL = true\n", "FEOL")


def test_violations_are_counted_per_rule(tmp_path):
    db = tmp_path / "r.lyrdb"
    db.write_text(LYRDB)
    assert count_violations(db) == {"METAL1.1": 2, "VIA1.1": 1}
    (tmp_path / "empty.lyrdb").write_text("<report-database><items/></report-database>")
    assert sum(count_violations(tmp_path / "empty.lyrdb").values()) == 0
    (tmp_path / "bad.lyrdb").write_text("<report-database><items>")
    with pytest.raises(UserError, match="not a KLayout report database"):
        count_violations(tmp_path / "bad.lyrdb")
    with pytest.raises(UserError, match="wrote no report database"):
        count_violations(tmp_path / "missing.lyrdb")


def test_without_klayout_the_message_says_how_to_get_it(tmp_path):
    with pytest.raises(UserError, match="apt-get install klayout"):
        find_klayout({"PATH": str(tmp_path)})
    with pytest.raises(UserError, match="KLAYOUT=/no/klayout: no such executable"):
        find_klayout({"PATH": str(tmp_path), "KLAYOUT": "/no/klayout"})


def test_cli_refuses_an_unknown_group(capsys):
    assert cli.main(["drc", "-c", "tiny", "--groups", "BEOL,METAL"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--groups BEOL,METAL: allowed are BEOL, FEOL, OFFGRID, ANTENNA" in err


def test_a_failing_group_keeps_the_groups_before_it(tmp_path):
    """A stand-in klayout: the BEOL copy of the deck reports two violations, FEOL crashes."""
    import json
    import stat
    import sys

    from flow.drc import run_drc
    fake = tmp_path / "klayout"
    fake.write_text(f"""#!{sys.executable}
import sys
args = dict(a.split("=", 1) for a in sys.argv if "=" in a)
deck = open(sys.argv[sys.argv.index("-r") + 1]).read()
if "FEOL    = true" in deck:
    print("ERROR: stand-in failure"); sys.exit(1)
open(args["report_file"], "w").write('''{LYRDB.replace("'METAL1.1'", "METAL2.1").replace("VIA1.1", "METAL2.1")}''')
""")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    gds = tmp_path / "chip.gds"
    gds.write_bytes(b"gds")
    deck = find_kit(("drc_deck",)).drc_deck
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"synth__x": 1}))
    with pytest.raises(UserError, match="drc FEOL failed"):
        run_drc(gds, deck, tmp_path / "work", tmp_path / "logs", metrics, tmp_path / "drc.md",
                groups=("BEOL", "FEOL"), klayout=str(fake), progress=lambda _: None)
    kept = json.loads(metrics.read_text())
    assert kept["drc__klayout__beol__violations"] == 3 and kept["drc__klayout__violations"] == 3
    assert kept["drc__klayout__groups"] == "BEOL" and kept["synth__x"] == 1
    assert "| BEOL | 3 |" in (tmp_path / "drc.md").read_text()


def _item(rule: str, *values: str) -> str:
    inner = "".join(f"<value>{v}</value>" for v in values)
    return f"<item><category>'{rule}'</category><cell>top</cell><values>{inner}</values></item>"


def test_violations_are_placed_in_the_cells_under_them(tmp_path):
    """A chip of two cells (NAND at x 0..2 twice, INV at x 10..11) and a library run in which
    only NAND breaks POLY.1 on its own: the chip's POLY.1 in a NAND is the library's, its
    POLY.1 in the INV and the CONTACT.1 between the cells are not."""
    db = pytest.importorskip("klayout.db", reason="KLayout Python module not installed (pip install klayout==0.30.12)")
    from pathlib import Path

    from flow.drc import GroupResult, attribute, markers

    def chip(path: Path, placements: list[tuple[str, int]]) -> Path:
        lay = db.Layout()
        top = lay.create_cell("TOP")
        for name, x in placements:
            cell = lay.cell(name) or lay.create_cell(name)
            if cell.bbox().empty():
                cell.shapes(lay.layer(1, 0)).insert(db.Box(0, 0, 2000 if name == "NAND" else 1000, 1400))
            top.insert(db.CellInstArray(cell.cell_index(), db.Trans(x * 1000, 0)))
        lay.write(str(path))
        return path

    def report(path: Path, items: list[str]) -> GroupResult:
        path.write_text(LYRDB.split("<items>")[0] + "<items>" + "".join(items) + "</items></report-database>")
        return GroupResult("FEOL", len(items), {}, 0.0, path)

    gds = chip(tmp_path / "chip.gds", [("NAND", 0), ("NAND", 3), ("INV", 10)])
    found = report(tmp_path / "chip.lyrdb", [_item("POLY.1", "edge-pair: (0.5,0.2;0.5,0.6)/(0.55,0.2;0.55,0.6)"),
                                             _item("POLY.1", "polygon: (3.9,1;3.9,1.1;4.1,1.1;4.1,1)"),
                                             _item("POLY.1", "box: (10.2,0.1;10.4,0.3)"),
                                             # an antenna-style item: its ratio values are no coordinates
                                             _item("CONTACT.1", "edge-pair: (7,5;7.1,5)|(7,5.2;7.1,5.2)",
                                                   "[#agate] float: 0.0205", "[#ametal] float: 7.328")])
    assert [rule for rule, _, _ in markers(found.report)] == ["POLY.1"] * 3 + ["CONTACT.1"]
    assert markers(found.report)[1][1:] == pytest.approx((4.0, 1.05))
    assert markers(found.report)[3][1:] == pytest.approx((7.05, 5.1))
    lib_gds = chip(tmp_path / "lib.gds", [("INV", 0), ("NAND", 5)])
    lib = report(tmp_path / "lib.lyrdb", [_item("POLY.1", "box: (5.2,0.1;5.4,0.3)")])
    rows = attribute(found, gds, lib, lib_gds)
    assert sorted(rows) == [("CONTACT.1", "(routing)", 1, False), ("POLY.1", "INV", 1, False),
                            ("POLY.1", "NAND", 2, True)]


def test_the_library_layout_holds_every_cell_once(tmp_path):
    db = pytest.importorskip("klayout.db", reason="KLayout Python module not installed (pip install klayout==0.30.12)")
    from flow.drc import library_layout
    kit = find_kit(("gds",))
    out = library_layout(kit.gds, tmp_path / "library.gds")
    lay = db.Layout()
    lay.read(str(out))
    src = db.Layout()
    src.read(str(kit.gds[0]))
    placed = sorted(i.cell.name for i in lay.top_cell().each_inst())
    assert placed == sorted(c.name for c in src.each_cell() if c.is_top()) and len(placed) > 100
    boxes = [i.bbox() for i in lay.top_cell().each_inst()]
    assert not any(a.overlaps(b) for n, a in enumerate(boxes) for b in boxes[n + 1:])  # 5 um apart
