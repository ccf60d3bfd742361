"""The layout as GDS and as a picture, with KLayout's Python module (`pip install .[pnr]`).

OpenROAD's DEF knows the cells only as LEF abstracts.  KLayout reads the DEF
with the kit's LEFs and takes each cell's real geometry from the kit's GDS
(the LEF's FOREIGN names the GDS cell), so the written GDS holds the full
mask layers of every cell plus the routing, on FreePDK45's GDS layer numbers
(pdk/kit.py Platform.gds_layer).
"""
from __future__ import annotations

from pathlib import Path

from moekda.errors import UserError
from pdk.kit import PLATFORM, Kit, Platform

# DEF shapes the reader produces per LEF layer: the wire itself, pin shapes, labels
_DEF_SUFFIXES = ("", ".PIN", ".LABEL")


def klayout_db():
    try:
        import klayout.db as db
    except ImportError:
        raise UserError("the GDS and the layout picture need KLayout's Python module: "
                        "`.venv/bin/pip install klayout==0.30.12` (the `pnr` extra of pyproject.toml)") from None
    return db


def lef_layers(tech_lef: Path) -> list[str]:
    """Routing and cut layer names of a technology LEF, in order."""
    names = []
    for line in tech_lef.read_text(errors="replace").splitlines():
        words = line.split()
        # a layer definition starts a line; `LAYER x ;` inside VIA and MACRO blocks is a reference
        if line.startswith("LAYER ") and len(words) == 2 and words[1].startswith(("metal", "via")):
            names.append(words[1])
    return names


def layer_map(db, kit: Kit, platform: Platform = PLATFORM):
    """DEF layer names -> GDS layer/datatype; the die outline on its own layer."""
    lmap = db.LayerMap()
    for index, name in enumerate(lef_layers(kit.tech_lef)):
        layer, datatype = platform.gds_layer(name)
        for suffix in _DEF_SUFFIXES:
            lmap.map(f"{name}{suffix} : {layer}/{datatype}", index)
    outline = platform.gds_outline_layer
    lmap.map(f"OUTLINE : {outline[0]}/{outline[1]}", len(lef_layers(kit.tech_lef)))
    return lmap


def read_def(def_path: Path, kit: Kit, platform: Platform = PLATFORM):
    """The DEF as a KLayout layout with the kit's cell GDS merged in; raises UserError on a missing cell."""
    db = klayout_db()
    options = db.LoadLayoutOptions()
    lefdef = options.lefdef_config
    lefdef.lef_files = [str(kit.tech_lef.resolve()), str(kit.cell_lef.resolve())]
    lefdef.macro_layout_files = [str(p.resolve()) for p in kit.gds]
    lefdef.dbu = 1.0 / _def_units(def_path)
    lefdef.layer_map = layer_map(db, kit, platform)
    lefdef.create_other_layers = False
    lefdef.produce_cell_outlines = True
    lefdef.cell_outline_layer = "OUTLINE"
    layout = db.Layout()
    layout.read(str(def_path), options)
    tops = [c for c in layout.each_cell() if c.is_top()]
    if len(tops) != 1:
        raise UserError(f"{def_path}: expected one top cell, found {len(tops)}")
    used = {layout.cell(i).name for i in tops[0].called_cells()}
    empty = sorted(name for name in used if layout.cell(name).is_empty() and not name.startswith("VIA"))
    if empty:
        raise UserError(f"{def_path}: no GDS geometry for cells {', '.join(empty[:5])} in {kit.gds[0]}")
    return layout


def _def_units(def_path: Path) -> int:
    if not def_path.is_file():
        raise UserError(f"{def_path}: no DEF (the final stage writes it)")
    with def_path.open(errors="replace") as stream:
        for line in stream:
            words = line.replace(";", " ").split()
            if words[:3] == ["UNITS", "DISTANCE", "MICRONS"]:
                return int(words[3])
    raise UserError(f"{def_path}: no UNITS DISTANCE MICRONS line")


def def_to_gds(def_path: Path, kit: Kit, gds_path: Path, platform: Platform = PLATFORM) -> Path:
    """Write the DEF merged with the kit's cell GDS as one GDS file."""
    layout = read_def(def_path, kit, platform)
    gds_path.parent.mkdir(parents=True, exist_ok=True)
    layout.write(str(gds_path))
    return gds_path


def gds_to_png(gds_path: Path, png_path: Path, kit: Kit, width: int = 1600,
               platform: Platform = PLATFORM) -> Path:
    """A picture of the die, all hierarchy levels, with the kit's layer colours."""
    klayout_db()
    import klayout.lay as lay
    view = lay.LayoutView()
    view.set_config("background-color", "#ffffff")
    # every cell's GDS carries pin labels (VDD, VSS, A1 ...): at die scale they cover the wires
    view.set_config("text-visible", "false")
    view.set_config("cell-box-visible", "false")
    view.load_layout(str(gds_path), True)
    if kit.klayout_layers and Path(kit.klayout_layers).is_file():
        view.load_layer_props(str(kit.klayout_layers), True)
    view.max_hier()
    # frame the die outline (else everything), whatever the view's own window size is
    layout = view.cellview(0).layout()
    top = layout.top_cell()
    outline = layout.find_layer(*platform.gds_outline_layer)
    box = top.dbbox_per_layer(outline) if outline is not None else top.dbbox()
    if box.empty():
        box = top.dbbox()
    height = max(100, round(width * box.height() / box.width())) if box.width() > 0 else width
    png_path.parent.mkdir(parents=True, exist_ok=True)
    view.save_image_with_options(str(png_path), width, height, 0, 0, 0, box, False)
    return png_path
