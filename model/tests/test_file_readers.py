"""Damaged weight files get one line naming the file and exit 2, never a traceback.

The readers (model/params.py: .npz and .safetensors checkpoints; model/vectors.py:
a `moekda vectors` directory) raise ValueError, one line naming the file and what is
wrong; `moekda accuracy --params` and `moekda run --vectors` print it and exit 2.  A
fuzz test mutates good files with a fixed list of seeds (bounded: a few seconds) and
holds the readers to that contract.
"""
from __future__ import annotations

import json
import random
import shutil
import struct

import numpy as np
import pytest

from cli import main
from moekda.config import load_config
from model.params import load_params, random_params, save_params
from model.vectors import export_vectors, load_vectors
from model.tests.test_quantize import _write_safetensors

FUZZ_SEEDS = range(120)       # per file kind; ~2 s in all on the loaded 2-core machine


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A good tiny checkpoint as .npz and .safetensors, and a good vectors directory."""
    d = tmp_path_factory.mktemp("good")
    cfg = load_config("tiny")
    p = random_params(cfg, 0)
    save_params(p, d / "p.npz")
    _write_safetensors(d / "p.safetensors", p.to_flat())
    export_vectors(cfg, 4, d / "vec")
    return cfg, d, p.to_flat()


def _one_line_naming(e: Exception, path) -> None:
    msg = str(e)
    assert "\n" not in msg and str(path) in msg, msg


def _mutate(data: bytes, rng: random.Random) -> bytes:
    """One of the damages a file meets: cut short, bytes flipped, a range zeroed, bytes
    inserted, or replaced by noise."""
    b = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0:
        return bytes(b[:rng.randrange(len(b))])
    if kind == 1:
        for _ in range(rng.randrange(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 2:
        lo = rng.randrange(len(b))
        b[lo:lo + rng.randrange(1, 256)] = bytes(min(len(b) - lo, 255))
    elif kind == 3:
        at = rng.randrange(len(b))
        b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
    else:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
    return bytes(b)


@pytest.mark.parametrize("name", ["p.npz", "p.safetensors"])
def test_checkpoint_reader_fuzz(good, tmp_path, name):
    cfg, d, _ = good
    data = (d / name).read_bytes()
    loaded = refused = 0
    for seed in FUZZ_SEEDS:
        f = tmp_path / f"s{seed}{(d / name).suffix}"
        f.write_bytes(_mutate(data, random.Random(seed)))
        try:
            load_params(f, cfg)
            loaded += 1
        except ValueError as e:
            _one_line_naming(e, f)
            refused += 1
    assert refused > len(FUZZ_SEEDS) // 2, (loaded, refused)   # the mutations do damage


def test_vectors_reader_fuzz(good, tmp_path):
    _, d, _ = good
    names = ["params.npz", "layer.npz", "norm.npz", "kda.npz", "moe.npz"]
    refused = 0
    for seed in FUZZ_SEEDS:
        rng = random.Random(seed)
        vec = tmp_path / f"v{seed}"
        shutil.copytree(d / "vec", vec)
        hit = vec / rng.choice(names)
        hit.write_bytes(_mutate(hit.read_bytes(), rng))
        try:
            load_vectors(vec)
        except ValueError as e:
            _one_line_naming(e, hit)
            refused += 1
        shutil.rmtree(vec)
    assert refused > len(FUZZ_SEEDS) // 2


def _npz(path, flat):
    np.savez(path, **flat)
    return path


def _safetensors_with(path, flat, edit):
    """A safetensors file of ``flat`` whose header entry of the first tensor is edited."""
    _write_safetensors(path, flat)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header[next(iter(flat))])
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    return path


def _damaged(kind, good, tmp_path):
    cfg, d, flat = good
    first = next(iter(flat))
    if kind == "truncated npz":
        f = tmp_path / "cut.npz"
        f.write_bytes((d / "p.npz").read_bytes()[:5000])
    elif kind == "not a zip":
        f = tmp_path / "text.npz"
        f.write_text("these are not weights\n")
    elif kind == "wrong dtype npz":
        f = _npz(tmp_path / "str.npz", flat | {first: np.array(["a", "b"])})
    elif kind == "NaN in npz":
        f = _npz(tmp_path / "nan.npz", flat | {first: np.full(flat[first].shape, np.nan)})
    elif kind == "missing key":
        f = _npz(tmp_path / "less.npz", {k: v for k, v in flat.items() if k != first})
    elif kind == "truncated safetensors":
        f = tmp_path / "cut.safetensors"
        f.write_bytes((d / "p.safetensors").read_bytes()[:-100])
    elif kind == "wrong dtype safetensors":
        f = _safetensors_with(tmp_path / "i8.safetensors", flat, lambda e: e.update(dtype="I8"))
    elif kind == "header size past the end":
        f = tmp_path / "big.safetensors"
        f.write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    else:
        raise AssertionError(kind)
    return f


KINDS = {"truncated npz": "not a readable .npz", "not a zip": "not a readable .npz",
         "wrong dtype npz": "not a real number type", "NaN in npz": "NaN or infinite",
         "missing key": "missing", "truncated safetensors": "does not fit its data offsets",
         "wrong dtype safetensors": "unsupported dtype I8", "header size past the end": "not a safetensors file"}


@pytest.mark.parametrize("kind", KINDS)
def test_accuracy_params_damaged_file_is_one_line_exit_2(good, tmp_path, capsys, kind):
    f = _damaged(kind, good, tmp_path)
    assert main(["accuracy", "-c", "tiny", "-n", "4", "--params", str(f), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moekda accuracy: error: --params") and err.count("\n") == 1, err
    assert str(f) in err and KINDS[kind] in err, err


@pytest.mark.parametrize("kind", ["truncated params", "not a zip layer", "layer without x", "float x"])
def test_run_vectors_damaged_file_is_one_line_exit_2(good, tmp_path, capsys, kind):
    _, d, _ = good
    vec = tmp_path / "vec"
    shutil.copytree(d / "vec", vec)
    if kind == "truncated params":
        hit, needle = vec / "params.npz", "not a readable .npz"
        hit.write_bytes(hit.read_bytes()[:3000])
    elif kind == "not a zip layer":
        hit, needle = vec / "layer.npz", "not a readable .npz"
        hit.write_bytes(b"\x00" * 100)
    else:
        hit = vec / "layer.npz"
        with np.load(hit) as z:
            layer = {k: z[k] for k in z.files}
        if kind == "layer without x":
            del layer["x"]
            needle = "needs arrays x and resets"
        else:
            layer["x"] = layer["x"].astype(np.float64) + 0.5
            needle = "x is float64"
        np.savez(hit, **layer)
    assert main(["run", "-c", "tiny", "-n", "2", "--sim", "icarus", "--vectors", str(vec)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moekda run: error: --vectors") and err.count("\n") == 1, err
    assert str(hit) in err and needle in err, err
