"""The ORFS Nangate45 results table, read at run time from the shared notes
(../shared/reference/orfs-nangate45.md next to the repo), for context in the
report.  The file is not part of the repo; when it is missing the report
says so instead of failing."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from moekda.config import REPO_ROOT

ORFS_NOTES = REPO_ROOT.parent / "shared" / "reference" / "orfs-nangate45.md"
TABLE_HEADING = "Published results of ORFS designs on Nangate45"


@dataclass(frozen=True)
class OrfsDesign:
    name: str
    clock_ns: float
    synth_area_um2: float
    final_area_um2: float
    final_cells: int
    util: float
    wns_ns: float
    power_w: float


def _num(cell: str) -> float:
    return float(cell.replace(",", "").replace("+", "").strip())


def read_orfs_designs(path: Path = ORFS_NOTES) -> list[OrfsDesign]:
    """Rows of the published-results table; [] if the section is absent. OSError if no file."""
    text = Path(path).read_text()
    start = text.find(TABLE_HEADING)
    if start < 0:
        return []
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not re.match(r"^-?[\d.,+]+$", cells[1]):
            continue  # header, separator or prose
        rows.append(OrfsDesign(cells[0], _num(cells[1]), _num(cells[2]), _num(cells[3]),
                               int(_num(cells[4])), _num(cells[5]), _num(cells[6]), _num(cells[7])))
    return rows
