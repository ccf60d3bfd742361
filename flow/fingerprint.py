"""Fingerprints: whether a cached build result still describes today's chip.

A synthesis result (metrics.json, a sweep point) is decided by three things and
nothing else: the Verilog it synthesised, the config (clock, I/O delay, the values
the flow reads) and the cell library (the kit's Liberty, its SRAM macros' Liberty
files and the platform facts of pdk/kit.py: dont-use cells, ABC driver and load).  Its fingerprint hashes exactly
those: ``synthesis_fingerprint(verilog_digest(text), cfg.hash(), kit)``.  So a
result is reused only when today's generator writes the same Verilog for the config
(any source change that alters the RTL is seen, whichever file it is in), and an
edit that leaves the Verilog as it was (a comment, a measurement script such as
hw/arith/delay_probes.py, the float model, which the RTL no longer depends on)
discards nothing.

Generating the chip's Verilog takes tens of seconds.  A result can also carry a
``generator_record()``: the repository files the generating process had loaded
(found in sys.modules, not listed by hand) and the versions of Python, Amaranth and
numpy.  While those are unchanged the generator, which is deterministic, writes the
same Verilog, and ``stale_reason`` trusts the stored digest; otherwise it generates
the Verilog and compares.
"""
from __future__ import annotations

import hashlib
import sys
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("amaranth", "numpy")     # the generator's dependencies whose versions are recorded
# the repository's own packages (pyproject.toml [tool.setuptools.packages.find]); the virtual
# environment inside the repository is not a source: its packages count by their versions
OWN_PACKAGES = ("moekda", "hw", "model", "sim", "run", "flow", "studies", "pdk")


def _sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())    # length-safe: each part hashed on its own
    return h.hexdigest()


def verilog_digest(texts: str | Iterable[str]) -> str:
    """sha256 of the Verilog source(s) a synthesis reads, in order."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    return _sha(*(t.encode() for t in texts))


@lru_cache(maxsize=8)
def _file_sha(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _bytes_sha(path: Path) -> bytes:
    st = Path(path).stat()
    return _file_sha(str(path), st.st_mtime_ns, st.st_size).encode()


def kit_fingerprint(kit) -> str:
    """The cell library a netlist is mapped to: the platform facts (pdk/kit.py) and the bytes
    of the standard-cell Liberty and of every SRAM macro's Liberty (an SRAM config maps to
    those too).  ``kit``: a pdk.kit.Kit, or the path of a Liberty file alone."""
    from pdk.kit import Platform
    if isinstance(kit, (str, Path)):
        return _sha(_bytes_sha(Path(kit)), repr(Platform()).encode())
    macros = [m.name.encode() + b"\0" + _bytes_sha(m.liberty) for m in sorted(kit.macros, key=lambda m: m.name)]
    return _sha(_bytes_sha(kit.liberty), repr(Platform()).encode(), kit.tapcell.encode(), *macros)


def synthesis_fingerprint(digest: str, config_hash: str, kit, clock_gate_min_flops: int | None = None) -> str:
    """16 hex digits over what decides a synthesis result (see the module's doc); ``kit`` as
    for ``kit_fingerprint``.  ``clock_gate_min_flops``: a run's own clock-gating setting
    (`moekda synth --clock-gate-min`) where it overrode the platform's, which the kit's
    fingerprint covers: such a result is never taken for a default one."""
    parts = [digest.encode(), config_hash.encode(), kit_fingerprint(kit).encode()]
    if clock_gate_min_flops is not None:
        parts.append(f"clock_gate_min_flops={clock_gate_min_flops}".encode())
    return _sha(*parts)[:16]


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": ".".join(map(str, sys.version_info[:3]))}
    for pkg in PACKAGES:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out


def _sources_hash(files: list[str], root: Path) -> str:
    parts = []
    for rel in sorted(files):
        p = root / rel
        parts += [rel.encode(), p.read_bytes() if p.is_file() else b"\0missing"]
    return _sha(*parts, repr(sorted(_versions().items())).encode())


def generator_record(root: Path = REPO_ROOT) -> dict:
    """The repository sources this process has loaded, and the package versions: recorded
    right after generating a Verilog file, they decide it (a superset: every loaded
    module of the repository counts, so nothing the generator imports is missed)."""
    files = set()
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f and Path(f).resolve().is_relative_to(root):
            rel = Path(f).resolve().relative_to(root)
            if rel.parts[0] in OWN_PACKAGES and "tests" not in rel.parts:   # a test writes no RTL
                files.add(rel.as_posix())
    files = sorted(files)
    return {"files": files, "hash": _sources_hash(files, root)}


def generator_unchanged(record: dict | None, root: Path = REPO_ROOT) -> bool:
    return bool(record and record.get("files")) and _sources_hash(record["files"], root) == record.get("hash")


def stale_reason(stored: dict, config_hash: str, kit, generate: Callable[[], str],
                 root: Path = REPO_ROOT) -> str | None:
    """None when a result still describes today's chip; else why not, in words.

    ``stored``: the result's ``rtl__fingerprint``, ``rtl__verilog_digest`` and (optional)
    ``rtl__generator``; ``generate()`` returns today's Verilog of the result's config and top,
    called only when the generator's sources changed since the record."""
    fp = stored.get("rtl__fingerprint")
    if not fp:
        return "it has no RTL fingerprint (made before they were recorded)"
    digest = stored.get("rtl__verilog_digest")
    if not (digest and generator_unchanged(stored.get("rtl__generator"), root)):
        digest = verilog_digest(generate())
    if synthesis_fingerprint(digest, config_hash, kit) != fp:
        return "its Verilog, config or cell library differs from today's"
    return None
