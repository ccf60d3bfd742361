"""Character-level language modelling on the Python standard library's own source files:
text that is on every machine with Python and is never downloaded.

The corpus: the standard library's top-level public modules (``<stdlib>/*.py`` whose name
does not start with ``_``: the private ones are platform and build specific), read as
bytes; a token is a byte (vocabulary 256: model-small's).  Files are held out, not lines:
a file is held out when the first 8 hex digits of sha256(its name), as an integer, are 0
modulo ``HELDOUT_MOD`` (about one file in ten, and a file's split never depends on which
other files exist).

An example is a window of ``seq_len`` consecutive bytes of one split's text (its files
concatenated in name order), each window a sequence of its own (the model starts from a
zero state): the input is bytes i .. i+T-1, the target at every position the byte after,
and every position is scored (``mask`` all true).  Training windows start at seeded random
offsets; held-out windows at offsets spread evenly over the held-out text, so the first n
of them are always the same.  ``corpus_record`` lists every file with its size and sha256:
a run stores it, and a demo on another Python sees which files differ.
"""
from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VOCAB = 256
HELDOUT_MOD = 10
SPLITS = {"train": 0, "heldout": 1}
GOLDEN = (np.sqrt(5.0) - 1) / 2


@dataclass
class CharData:
    inputs: np.ndarray      # (n, T) int64 byte values
    targets: np.ndarray     # (n, T) the next byte
    mask: np.ndarray        # (n, T) bool, all true


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(name: str) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % HELDOUT_MOD == 0


def corpus_files(root: Path | None = None) -> list[Path]:
    root = stdlib_dir() if root is None else Path(root)
    return sorted(p for p in root.glob("*.py") if not p.name.startswith("_") and p.is_file())


def split_text(name: str, root: Path | None = None) -> bytes:
    """The bytes of split ``name``'s files, concatenated in name order."""
    if name not in SPLITS:
        raise ValueError(f"split {name!r}: allowed are {', '.join(SPLITS)}")
    want_held = name == "heldout"
    return b"".join(p.read_bytes() for p in corpus_files(root) if is_heldout(p.name) == want_held)


def corpus_record(root: Path | None = None) -> dict:
    """The corpus as a run records it: the Python, and every file's split, size and sha256."""
    files = corpus_files(root)
    return {"python": sys.version.split()[0], "stdlib": str(stdlib_dir() if root is None else root),
            "heldout_rule": f"int(sha256(name)[:8], 16) % {HELDOUT_MOD} == 0",
            "files": [{"name": p.name, "split": "heldout" if is_heldout(p.name) else "train",
                       "bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                      for p in files]}


def corpus_differences(recorded: dict, root: Path | None = None) -> list[str]:
    """Files of a recorded corpus that this machine's standard library lacks or holds
    differently (one line each); empty when the text is the same."""
    here = {f["name"]: f for f in corpus_record(root)["files"]}
    out = []
    for f in recorded["files"]:
        h = here.pop(f["name"], None)
        if h is None:
            out.append(f"{f['name']}: missing here")
        elif h["sha256"] != f["sha256"]:
            out.append(f"{f['name']}: differs ({f['bytes']} bytes recorded, {h['bytes']} here)")
    out += [f"{name}: only here" for name in sorted(here)]
    return out


def split(name: str, n: int, seq_len: int, seed: int = 0, root: Path | None = None) -> CharData:
    """``n`` windows of ``seq_len`` bytes of split ``name`` (module doc): seeded random
    offsets for "train" (seed stream [seed, 0]), the golden-ratio offsets for "heldout"."""
    if seq_len < 2:
        raise ValueError(f"seq_len {seq_len}: allowed is 2 or more")
    text = split_text(name, root)
    buf = np.frombuffer(text, np.uint8).astype(np.int64)
    room = len(buf) - seq_len - 1
    if room < 1 or n < 1:
        raise ValueError(f"split {name!r}: {len(buf)} bytes hold no {n} windows of {seq_len + 1}")
    if name == "train":
        starts = np.random.default_rng([seed, SPLITS[name]]).integers(0, room, size=n)
    else:   # a golden-ratio sequence: spread over the whole text, and the first n never change
        starts = np.floor(np.mod(np.arange(n) * GOLDEN, 1.0) * room).astype(np.int64)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    win = buf[idx]
    return CharData(win[:, :-1].copy(), win[:, 1:].copy(), np.ones((n, seq_len), bool))


def text_of(ids) -> str:
    """Bytes as text for printing (undecodable bytes shown as U+FFFD)."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
