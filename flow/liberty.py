"""What the reports need from the liberty file: each cell's area, whether it holds
state, and its output pins.  Read from the kit's file, so no cell list is written twice."""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_CELL = re.compile(r"^\s*cell\s*\(\s*\"?([\w]+)\"?\s*\)\s*\{", re.M)
_AREA = re.compile(r"^\s*area\s*:\s*([0-9.eE+-]+)\s*;", re.M)
# a cell holds state if it has a flip-flop or latch group, or is an integrated clock gate
# (its latch is written as a statetable with clock_gating_integrated_cell)
_STATE = re.compile(r"^\s*((ff|latch|ff_bank|latch_bank)\s*\(|clock_gating_integrated_cell\s*:)", re.M)
_PIN = re.compile(r"^\s*pin\s*\(\s*\"?(\w+)\"?\s*\)\s*\{", re.M)
_OUTPUT = re.compile(r"^\s*direction\s*:\s*\"?output\"?\s*;", re.M)


@dataclass(frozen=True)
class LibCell:
    name: str
    area: float
    sequential: bool
    outputs: frozenset[str] = frozenset()   # its (single-bit) output pins


@lru_cache(maxsize=4)
def read_cells(liberty: Path) -> dict[str, LibCell]:
    text = Path(liberty).read_text(errors="replace")
    starts = [(m.start(), m.group(1)) for m in _CELL.finditer(text)]
    cells = {}
    for i, (pos, name) in enumerate(starts):
        body = text[pos: starts[i + 1][0] if i + 1 < len(starts) else len(text)]
        area = _AREA.search(body)
        pins = [(m.start(), m.group(1)) for m in _PIN.finditer(body)]
        outputs = frozenset(pin for j, (at, pin) in enumerate(pins)
                            if _OUTPUT.search(body[at: pins[j + 1][0] if j + 1 < len(pins) else len(body)]))
        cells[name] = LibCell(name, float(area.group(1)) if area else 0.0, bool(_STATE.search(body)), outputs)
    return cells
