"""flow/gds.py: a DEF with a few placed kit cells and a routed wire, merged
with the kit's cell GDS by KLayout, and drawn as a PNG."""
from __future__ import annotations

import struct

import pytest

db = pytest.importorskip("klayout.db", reason="KLayout Python module not installed (pip install klayout==0.30.12)")

from flow.gds import def_to_gds, gds_to_png, lef_layers  # noqa: E402
from cli import UserError  # noqa: E402
from pdk.kit import PLATFORM, find_kit  # noqa: E402

CELLS = {"tap": "TAPCELL_X1", "u_inv": "INV_X1", "u_nand": "NAND2_X1", "u_ff": "DFF_X1"}


def _def(cells: dict[str, str]) -> str:
    comps = "".join(f"- {name} {master} + PLACED ( {i * 2280} 0 ) N ;\n" for i, (name, master) in enumerate(cells.items()))
    return f"""VERSION 5.8 ;
DIVIDERCHAR "/" ;
BUSBITCHARS "[]" ;
DESIGN demo ;
UNITS DISTANCE MICRONS 2000 ;
DIEAREA ( 0 0 ) ( 20000 5600 ) ;
COMPONENTS {len(cells)} ;
{comps}END COMPONENTS
NETS 1 ;
- n1 ( u_inv ZN ) ( u_nand A1 ) + ROUTED metal2 ( 3000 700 ) ( * 4900 ) via2_8
    NEW metal3 ( 3000 4900 ) ( 9000 * ) ;
END NETS
END DESIGN
"""


@pytest.fixture(scope="module")
def kit():
    return find_kit(("tech_lef", "cell_lef", "gds"))


@pytest.fixture(scope="module")
def merged(tmp_path_factory, kit):
    tmp = tmp_path_factory.mktemp("gds")
    (tmp / "demo.def").write_text(_def(CELLS))
    gds = def_to_gds(tmp / "demo.def", kit, tmp / "demo.gds")
    layout = db.Layout()
    layout.read(str(gds))
    return tmp, gds, layout


def test_every_placed_cell_carries_the_kits_geometry(merged, kit):
    _, _, layout = merged
    top = layout.top_cell()
    assert top.name == "demo"
    placed = sorted(layout.cell(i.cell_index).name for i in top.each_inst())
    assert [p for p in placed if not p.startswith("VIA")] == sorted(CELLS.values())
    assert [p for p in placed if p.startswith("VIA")] == ["VIA_via2_8"]   # the routed net's via
    ref = db.Layout()
    ref.read(str(kit.gds[0]))
    for master in CELLS.values():
        ours, theirs = layout.cell(master), ref.cell(master)
        # same mask shapes as the kit's cell, in microns
        assert ours.dbbox() == theirs.dbbox(), master
        n = lambda ly, c: sum(c.shapes(li).size() for li in ly.layer_indexes())  # noqa: E731
        assert n(layout, ours) == n(ref, theirs) > 0, master


def test_routing_lands_on_freepdk45_layer_numbers(merged):
    _, _, layout = merged
    top = layout.top_cell()
    on = {(layout.get_info(li).layer, layout.get_info(li).datatype): top.shapes(li).size()
          for li in layout.layer_indexes()}
    assert on.get(PLATFORM.gds_layer("metal2"), 0) > 0 and on.get(PLATFORM.gds_layer("metal3"), 0) > 0
    assert PLATFORM.gds_layer("metal2") == (13, 0) and PLATFORM.gds_layer("via9") == (28, 0)
    assert on.get(PLATFORM.gds_outline_layer, 0) == 1           # the die outline
    # the metal2 segment ( 3000 700 ) ( * 4900 ) at 2000 dbu/um, 0.07 um wide, half-width end extensions
    wire = db.Region(top.shapes(layout.find_layer(13, 0))).bbox().to_dtype(layout.dbu)
    assert (wire.left, wire.bottom, wire.right, wire.top) == pytest.approx((1.465, 0.315, 1.535, 2.485))


def test_picture_of_the_layout(merged, kit):
    tmp, gds, _ = merged
    png = gds_to_png(gds, tmp / "demo.png", kit, width=800)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width == 800 and height == pytest.approx(800 * 5600 / 20000, abs=2)   # the die's aspect


def test_a_cell_missing_from_the_kit_is_an_error(tmp_path, kit):
    (tmp_path / "bad.def").write_text(_def({"u_x": "NOT_A_CELL_X1", "u_inv": "INV_X1", "u_nand": "NAND2_X1"}))
    with pytest.raises(UserError, match="no GDS geometry for cells NOT_A_CELL_X1"):
        def_to_gds(tmp_path / "bad.def", kit, tmp_path / "bad.gds")


def test_every_lef_layer_has_a_gds_number(kit):
    names = lef_layers(kit.tech_lef)
    assert names[:3] == ["metal1", "via1", "metal2"] and len(names) == 19
    assert len({PLATFORM.gds_layer(n) for n in names}) == len(names)
