"""The platform deck's antenna rule, measured in KLayout: what flow/openroad/diodes.tcl relies on.

The deck (drc/FreePDK45.lydrc) checks `antenna_check(gate, metalN, 300.0, diode)` with every
layer connected at once and `diode = nplus & active - nwell`: a net that reaches n-diffusion
through a contact is skipped whatever its metal and whatever the diode's size.  Three
synthetic nets: one NMOS gate (0.02 um2) under a 100 x 1 um metal5 plate (ratio 5,000); the
same with a 0.09 x 0.09 um n-diffusion (ANTENNA_X1's 0.0081 um2) contacted to the net's
metal1; the diode beside the net but not contacted.  Needs KLayout's application (`make drc`).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from flow.drc import find_klayout, run_group
from moekda.errors import UserError
from pdk.kit import find_kit

pytestmark = pytest.mark.slow


def _net(db, path: Path, diode: bool, contacted: bool) -> Path:
    lay = db.Layout()
    lay.dbu = 0.0005
    top = lay.create_cell("TOP")

    def box(layer, x1, y1, x2, y2):
        top.shapes(lay.layer(layer, 0)).insert(db.DBox(x1, y1, x2, y2))

    box(1, 0, 0, 1.0, 0.4)                 # active
    box(4, -0.2, -0.2, 1.2, 0.6)           # nplus: an NMOS
    box(9, 0.4, -0.3, 0.45, 1.2)           # poly across the active: gate 0.05 x 0.4 um
    box(9, 0.3, 1.2, 0.55, 1.45)           # poly pad
    box(10, 0.39, 1.29, 0.455, 1.355)      # contact poly - metal1
    box(11, 0.3, 1.2, 4.0, 1.45)           # metal1, over to the diode
    for via, metal in ((12, 13), (14, 15), (16, 17), (18, 19)):   # via stack up to metal5
        box(via, 2.6, 1.29, 2.67, 1.36)
        box(metal, 2.5, 1.2, 2.8, 1.45)
    box(19, 2.5, 1.2, 102.5, 2.2)          # metal5 plate, 100 um2
    if diode:
        box(1, 3.5, 0, 3.59, 0.09)         # n-diffusion, 0.0081 um2, outside any nwell
        box(4, 3.3, -0.2, 4.0, 0.5)
        box(11, 3.4, 0.0, 3.9, 1.45 if contacted else 0.25)   # its metal1, joined to the net or not
        box(10, 3.5125, 0.0125, 3.5775, 0.0775)               # contact diffusion - metal1
    lay.write(str(path))
    return path


def test_the_deck_skips_a_net_with_a_contacted_diode_whatever_its_metal(tmp_path):
    db = pytest.importorskip("klayout.db", reason="KLayout Python module not installed")
    try:
        klayout = find_klayout()
    except UserError as e:
        pytest.skip(str(e))
    kit = find_kit()
    if kit.drc_deck is None:
        pytest.skip("the kit has no DRC deck")
    found = {}
    for name, diode, contacted in (("plain", False, False), ("diode", True, True), ("loose", True, False)):
        gds = _net(db, tmp_path / f"{name}.gds", diode, contacted)
        work = tmp_path / name
        work.mkdir()
        found[name] = run_group(klayout, kit.drc_deck, gds, work, "ANTENNA", work / "antenna.log").by_rule
    assert found == {"plain": {"METAL5_ANTENNA": 1}, "diode": {}, "loose": {"METAL5_ANTENNA": 1}}
