"""ORFS's published Nangate45 results, for context in the report.

The figures live in the repository as data (flow/data/orfs_nangate45_results.toml,
with their source: ORFS repository, files and version), so every user's report has
them; nothing outside the repository is read.  A damaged data file is an error of
the repository, not of the user's run: it raises ValueError naming the file.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

ORFS_DATA = Path(__file__).resolve().parent / "data" / "orfs_nangate45_results.toml"


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


def read_orfs_data(path: Path = ORFS_DATA) -> tuple[dict, list[OrfsDesign]]:
    """(source table, designs) of the data file."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: cannot read the ORFS results: {e}") from None
    source = raw.get("source")
    if not isinstance(source, dict) or not source.get("repository"):
        raise ValueError(f"{path}: no [source] with the repository the figures come from")
    names = [f.name for f in fields(OrfsDesign)]
    designs = []
    for n, row in enumerate(raw.get("design", [])):
        if not isinstance(row, dict) or sorted(row) != sorted(names):
            raise ValueError(f"{path}: design {n + 1}: fields must be exactly {', '.join(names)}")
        try:
            designs.append(OrfsDesign(str(row["name"]), *(float(row[k]) for k in names[1:4]),
                                      int(row["final_cells"]), *(float(row[k]) for k in names[5:])))
        except (TypeError, ValueError):
            raise ValueError(f"{path}: design {row.get('name', n + 1)}: a value is not a number") from None
    if not designs:
        raise ValueError(f"{path}: no [[design]] rows")
    return source, designs


def read_orfs_designs(path: Path = ORFS_DATA) -> list[OrfsDesign]:
    return read_orfs_data(path)[1]


def orfs_source(path: Path = ORFS_DATA) -> str:
    """One line naming where the figures come from, for the report."""
    s = read_orfs_data(path)[0]
    return "; ".join(f"{v}" for k, v in s.items() if k in ("repository", "files", "version"))
