"""The generator's fingerprint: which source code a build result came from.

A result (synthesis metrics, a sweep point) is valid for one config *and* one
version of the code that turns the config into RTL.  The config hash alone
says nothing when the RTL generator changes, so a cached sweep point or a
bench's synthesis metrics would silently describe an older chip.  The
fingerprint hashes every file that decides the generated Verilog: the
generator (hw/), the config and number formats (moekda/), and the seeded
model whose constants the RTL bakes in (sim/models/).  Tests, docs and the
flow scripts are not part of it: they do not change the RTL.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# the files whose contents decide the generated RTL (globs relative to the repository)
GENERATOR_SOURCES = ("hw/**/*.py", "moekda/config.py", "moekda/formats.py", "moekda/numerics.py",
                     "sim/models/params.py", "sim/models/quantize.py", "sim/models/qparams.py",
                     "sim/models/int_ops.py")


@lru_cache(maxsize=None)
def generator_hash(root: Path = REPO_ROOT) -> str:
    """12 hex digits over the path and contents of every generator source, in a fixed order."""
    h = hashlib.sha256()
    files = sorted({p for pattern in GENERATOR_SOURCES for p in root.glob(pattern) if p.is_file()})
    if not files:
        raise FileNotFoundError(f"no generator sources under {root}")
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()[:12]
