"""Pictures of a placed or routed layout that a person can read (issue 46 item 5).

The GDS picture (flow/gds.py) shows every shape, so a block, a macro or a crowded spot
cannot be told apart in it.  These two are drawn from the DEF's placement instead:

* **blocks**: each grid bin of the core takes the colour of the category (flow/categories.py,
  the same table as the area and energy reports) with the most cell area in it, darker where
  the bin is fuller; the SRAM macros are outlined and named.  Where the KDA, the MoE, the
  norms or the bank sit, and whether a block spreads over the die, shows at a glance.
* **density**: cell area per bin area (the placement density the global placer aims at
  ``pnr.place_density``), macros outlined: hot spots and empty channels.

Standard cells come from the DEF's COMPONENTS (their instance paths, ``datapath/kda/_123_``,
name their block), their sizes from the LEFs' SIZE lines.  Tap and fill cells are left out.
Any stage's database gives a DEF (``moekda pnr --pictures STAGE`` writes it with OpenROAD).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flow.categories import CATEGORIES, MACROS, TOP, UNMAPPED, category_of, titles
from moekda.errors import UserError

_COMPONENT = re.compile(r"^\s*-\s+(\S+)\s+(\S+)\s.*?\+\s+(PLACED|FIXED|COVER)\s+\(\s*(-?\d+)\s+(-?\d+)\s*\)\s+(\S+)")
_SIZE = re.compile(r"^MACRO\s+(\S+)(.*?)^\s*SIZE\s+([\d.]+)\s+BY\s+([\d.]+)\s*;", re.M | re.S)


@dataclass
class Placement:
    """The placed components of a DEF, in um."""
    die: tuple[float, float, float, float]        # x0, y0, x1, y1
    names: list[str]
    cells: list[str]
    x: np.ndarray                                  # lower-left corners
    y: np.ndarray
    orient: list[str]


def read_def_placement(def_path: Path) -> Placement:
    """Die area and every placed component (PLACED, FIXED or COVER) of a DEF."""
    units = die = None
    names, cells, xs, ys, orient = [], [], [], [], []
    in_components = False
    with open(def_path, errors="replace") as f:
        for line in f:
            if in_components:
                if line.startswith("END COMPONENTS"):
                    break
                hit = _COMPONENT.match(line)
                if hit:
                    names.append(hit.group(1).replace("\\", ""))
                    cells.append(hit.group(2))
                    xs.append(int(hit.group(4)))
                    ys.append(int(hit.group(5)))
                    orient.append(hit.group(6))
            elif line.startswith("UNITS DISTANCE MICRONS"):
                units = int(line.split()[3])
            elif line.startswith("DIEAREA"):
                nums = [int(v) for v in re.findall(r"-?\d+", line)]
                die = (min(nums[0::2]), min(nums[1::2]), max(nums[0::2]), max(nums[1::2]))
            elif line.startswith("COMPONENTS"):
                in_components = True
    if units is None or die is None:
        raise UserError(f"{def_path}: no UNITS DISTANCE MICRONS or DIEAREA line: not a DEF of a floorplan")
    if not names:
        raise UserError(f"{def_path}: no placed component")
    return Placement(tuple(v / units for v in die), names, cells, np.array(xs) / units, np.array(ys) / units, orient)


def lef_sizes(lefs: list[Path]) -> dict[str, tuple[float, float]]:
    """Cell name -> (width, height) um from the LEFs' MACRO ... SIZE w BY h lines."""
    out = {}
    for lef in lefs:
        for hit in _SIZE.finditer(Path(lef).read_text(errors="replace")):
            if "END " + hit.group(1) not in hit.group(2):      # the SIZE of this MACRO, not a later one
                out[hit.group(1)] = (float(hit.group(3)), float(hit.group(4)))
    return out


def instance_category(name: str) -> str:
    """The category of a placed cell: its parent instance's (``datapath/kda/_1_`` -> kda)."""
    parent = name.rsplit("/", 1)[0] if "/" in name else TOP
    return category_of(parent)


@dataclass
class Binned:
    extent: tuple[float, float, float, float]
    bin_um: float
    area: np.ndarray                 # [category, row, col] cell area um2
    keys: list[str]                  # category keys, the first axis of ``area``
    macros: list[tuple[str, str, float, float, float, float]]   # name, cell, x, y, w, h


def bin_placement(p: Placement, sizes: dict[str, tuple[float, float]], macro_cells: set[str],
                  skip_cells: set[str], bins: int = 160) -> Binned:
    """Cell area per category per square bin of the die (``bins`` along the longer side); the
    macros apart, as rectangles.  A cell counts at its centre bin (cells are far smaller
    than a bin)."""
    x0, y0, x1, y1 = p.die
    bin_um = max(x1 - x0, y1 - y0) / bins
    nx, ny = int(np.ceil((x1 - x0) / bin_um)), int(np.ceil((y1 - y0) / bin_um))
    keys = [c.key for c in CATEGORIES if c.key != MACROS] + [UNMAPPED]
    index = {k: i for i, k in enumerate(keys)}
    area = np.zeros((len(keys), ny, nx))
    macros = []
    missing = set()
    cat_i, col, row, a = [], [], [], []
    for name, cell, x, y, o in zip(p.names, p.cells, p.x, p.y, p.orient):
        if cell in skip_cells:
            continue
        size = sizes.get(cell)
        if size is None:
            missing.add(cell)
            continue
        w, h = size if o in ("N", "S", "FN", "FS") else size[::-1]
        if cell in macro_cells:
            macros.append((name, cell, x, y, w, h))
            continue
        cat_i.append(index[instance_category(name)])
        col.append(min(nx - 1, int((x + w / 2 - x0) / bin_um)))
        row.append(min(ny - 1, int((y + h / 2 - y0) / bin_um)))
        a.append(w * h)
    if missing:
        raise UserError(f"layout picture: no LEF size for {len(missing)} cell type(s), e.g. {sorted(missing)[:3]}")
    np.add.at(area, (np.array(cat_i, int), np.array(row, int), np.array(col, int)), np.array(a))
    return Binned((x0, x0 + nx * bin_um, y0, y0 + ny * bin_um), bin_um, area, keys, macros)


# one colour per category, in the table's order, fixed so pictures of different runs compare;
# unmapped grey (no category colour is grey)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
           "#17becf", "#393b79", "#e7ba52", "#637939", "#7b4173")


def _colours(keys: list[str]):
    from matplotlib.colors import to_rgb
    return {k: (0.55, 0.55, 0.55) if k == UNMAPPED else to_rgb(PALETTE[i % len(PALETTE)]) for i, k in enumerate(keys)}


MACRO_FACE = (0.92, 0.92, 0.92)


def _outline_macros(ax, b: Binned, label: bool):
    from matplotlib.patches import Rectangle
    for name, cell, x, y, w, h in b.macros:
        ax.add_patch(Rectangle((x, y), w, h, fill=True, facecolor=MACRO_FACE, edgecolor="black",
                               linewidth=0.8, zorder=3))
        if label:
            ax.text(x + w / 2, y + h / 2, name.rsplit("/", 1)[-1], rotation=90, ha="center", va="center",
                    fontsize=5, zorder=4)


def draw_pictures(b: Binned, title: str, blocks_png: Path, density_png: Path,
                  place_density: float | None = None) -> list[Path]:
    """The blocks picture and the density heatmap (module docstring)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    bin_area = b.bin_um ** 2
    total = b.area.sum(axis=0)
    density = total / bin_area
    colours = _colours(b.keys)
    rgb = np.ones(total.shape + (3,))
    top = b.area.argmax(axis=0)
    shade = np.clip(density / max(place_density or density.max() or 1.0, 1e-9), 0.25, 1.0)
    for i, k in enumerate(b.keys):
        sel = (top == i) & (total > 0)
        c = np.array(colours[k])
        # fuller bins darker: mix the colour with white by the fill
        rgb[sel] = 1 - (1 - c) * shade[sel, None]
    per_key = b.area.sum(axis=(1, 2))
    names = titles()
    written = []
    fig, ax = plt.subplots(figsize=(12, 7.5))
    ax.imshow(rgb, origin="lower", extent=b.extent, interpolation="nearest")
    _outline_macros(ax, b, label=len(b.macros) <= 40)
    handles = [Patch(color=colours[k], label=f"{names[k]} ({a:,.0f} um2)")
               for k, a in zip(b.keys, per_key) if a > 0]
    if b.macros:
        handles.append(Patch(facecolor=MACRO_FACE, edgecolor="black",
                             label=f"SRAM macros ({len(b.macros)}, {sum(w * h for *_, w, h in b.macros):,.0f} um2)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    ax.set_title(f"{title}: cells by block\n(per {b.bin_um:.1f} um bin the category with the most cell area; "
                 "darker = fuller)", fontsize=9)
    ax.set_xlabel("um"), ax.set_ylabel("um")
    fig.tight_layout()
    fig.savefig(blocks_png, dpi=150)
    plt.close(fig)
    written.append(blocks_png)

    # the heatmap on bins twice as wide: a bin of a few cell widths is mostly the noise of
    # which cells' centres fall in it
    ny, nx = (d // 2 * 2 for d in density.shape)
    coarse = total[:ny, :nx].reshape(ny // 2, 2, nx // 2, 2).sum(axis=(1, 3)) / (4 * bin_area)
    extent = (b.extent[0], b.extent[0] + nx * b.bin_um, b.extent[2], b.extent[2] + ny * b.bin_um)
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    im = ax.imshow(coarse, origin="lower", extent=extent, interpolation="nearest", cmap="inferno",
                   vmin=0, vmax=max(1.0, float(coarse.max())))
    _outline_macros(ax, b, label=False)
    fig.colorbar(im, ax=ax, label="cell area / bin area")
    note = f"; target {place_density:g}" if place_density else ""
    ax.set_title(f"{title}: placement density per {2 * b.bin_um:.1f} um bin (max {coarse.max():.2f}{note})",
                 fontsize=9)
    ax.set_xlabel("um"), ax.set_ylabel("um")
    fig.tight_layout()
    fig.savefig(density_png, dpi=150)
    plt.close(fig)
    written.append(density_png)
    return written


def layout_pictures(def_path: Path, lefs: list[Path], macro_cells: set[str], skip_cells: set[str],
                    title: str, out_stem: Path, place_density: float | None = None) -> list[Path]:
    """``<out_stem>-blocks.png`` and ``<out_stem>-density.png`` of the DEF's placement."""
    p = read_def_placement(def_path)
    b = bin_placement(p, lef_sizes(lefs), macro_cells, skip_cells)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    return draw_pictures(b, title, out_stem.with_name(out_stem.name + "-blocks.png"),
                         out_stem.with_name(out_stem.name + "-density.png"), place_density)
