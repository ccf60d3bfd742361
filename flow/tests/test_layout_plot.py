"""The layout pictures (flow/layout_plot.py) on a hand-written DEF: what is read, where each
cell's area lands, and one-line errors for what is not a placement."""
from __future__ import annotations

import numpy as np
import pytest

from flow.layout_plot import bin_placement, draw_pictures, instance_category, lef_sizes, read_def_placement
from moekda.errors import UserError

LEF = """VERSION 5.7 ;
MACRO NAND2_X1
  CLASS CORE ;
  SIZE 0.76 BY 1.4 ;
END NAND2_X1
MACRO DFF_X1
  CLASS CORE ;
  SIZE 3.42 BY 1.4 ;
END DFF_X1
MACRO TAPCELL_X1
  SIZE 0.19 BY 1.4 ;
END TAPCELL_X1
MACRO ram_a
  CLASS BLOCK ;
  SIZE 20.0 BY 60.0 ;
END ram_a
"""

DEF = """VERSION 5.8 ;
DESIGN layer ;
UNITS DISTANCE MICRONS 2000 ;
DIEAREA ( 0 0 ) ( 200000 200000 ) ;
COMPONENTS 6 ;
    - datapath/kda/_1_ NAND2_X1 + PLACED ( 20000 20000 ) N ;
    - datapath/kda/_2_ DFF_X1 + PLACED ( 22000 20000 ) FS ;
    - datapath/moe/engine/_3_ NAND2_X1 + PLACED ( 180000 180000 ) N ;
    - loader/_4_ DFF_X1 + SOURCE TIMING + PLACED ( 100000 100000 ) N ;
    - TAP_1 TAPCELL_X1 + SOURCE DIST + FIXED ( 0 0 ) N ;
    - datapath/kda/delta/mem/bank0 ram_a + FIXED ( 100000 2000 ) R90 ;
END COMPONENTS
END DESIGN
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "a.lef").write_text(LEF)
    (tmp_path / "a.def").write_text(DEF)
    return tmp_path


def test_placement_and_sizes_are_read_in_microns(files):
    p = read_def_placement(files / "a.def")
    assert p.die == (0, 0, 100.0, 100.0)
    assert p.names[0] == "datapath/kda/_1_" and p.cells[3] == "DFF_X1"
    assert (p.x[3], p.y[3]) == (50.0, 50.0)           # "+ SOURCE TIMING" before the placement is skipped
    sizes = lef_sizes([files / "a.lef"])
    assert sizes["DFF_X1"] == (3.42, 1.4) and sizes["ram_a"] == (20.0, 60.0)


def test_each_cell_lands_in_its_blocks_bin_and_macros_stand_apart(files):
    p = read_def_placement(files / "a.def")
    b = bin_placement(p, lef_sizes([files / "a.lef"]), {"ram_a"}, {"TAPCELL_X1"}, bins=10)
    assert b.bin_um == 10.0 and b.area.shape == (len(b.keys), 10, 10)
    kda, engine, params = (b.keys.index(k) for k in ("kda_datapath", "engine", "params"))
    assert b.area[kda, 1, 1] == pytest.approx(0.76 * 1.4 + 3.42 * 1.4)
    assert b.area[engine, 9, 9] == pytest.approx(0.76 * 1.4)
    assert b.area[params, 5, 5] == pytest.approx(3.42 * 1.4)
    # the tap cell is left out, the macro is a rectangle (rotated: 60 wide, 20 high), not cell area
    assert b.area.sum() == pytest.approx((2 * 0.76 + 2 * 3.42) * 1.4)
    assert b.macros == [("datapath/kda/delta/mem/bank0", "ram_a", 50.0, 1.0, 60.0, 20.0)]


def test_pictures_are_written(files, tmp_path):
    p = read_def_placement(files / "a.def")
    b = bin_placement(p, lef_sizes([files / "a.lef"]), {"ram_a"}, {"TAPCELL_X1"}, bins=10)
    out = draw_pictures(b, "t", tmp_path / "b.png", tmp_path / "d.png", 0.6)
    assert [q.stat().st_size > 10_000 for q in out] == [True, True]


def test_instance_category_is_the_parents():
    assert instance_category("datapath/kda/engine/_9_") == "engine"
    assert instance_category("_9_") == "residual"                # the top's own cells
    assert instance_category("datapath/norm/rsqrt/_1_") == "norms"


def test_what_is_not_a_placement_is_one_error(files):
    bad = files / "bad.def"
    bad.write_text("VERSION 5.8 ;\nCOMPONENTS 0 ;\nEND COMPONENTS\n")
    with pytest.raises(UserError, match="no UNITS DISTANCE MICRONS or DIEAREA"):
        read_def_placement(bad)
    p = read_def_placement(files / "a.def")
    with pytest.raises(UserError, match=r"no LEF size for 2 cell type\(s\), e.g. \[.DFF_X1., .ram_a.\]"):
        bin_placement(p, {"NAND2_X1": (0.76, 1.4)}, {"ram_a"}, {"TAPCELL_X1"})
    assert np.isfinite(p.x).all()
