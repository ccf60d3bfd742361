"""The generator fingerprint changes with the RTL generator's sources and nothing else."""
from __future__ import annotations

import shutil

from moekda.fingerprint import GENERATOR_SOURCES, REPO_ROOT, generator_hash


def _copy_sources(dst):
    for pattern in GENERATOR_SOURCES:
        for p in REPO_ROOT.glob(pattern):
            out = dst / p.relative_to(REPO_ROOT)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(p, out)


def test_same_sources_same_hash(tmp_path):
    _copy_sources(tmp_path)
    assert generator_hash(tmp_path) == generator_hash(REPO_ROOT)


def test_an_edit_in_hw_changes_the_hash_and_a_doc_does_not(tmp_path):
    _copy_sources(tmp_path)
    before = generator_hash(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text("not a generator source\n")
    generator_hash.cache_clear()
    assert generator_hash(tmp_path) == before
    with open(tmp_path / "hw" / "layer.py", "a") as f:
        f.write("# one more line\n")
    generator_hash.cache_clear()
    assert generator_hash(tmp_path) != before


def test_a_new_generator_module_changes_the_hash(tmp_path):
    _copy_sources(tmp_path)
    before = generator_hash(tmp_path)
    (tmp_path / "hw" / "new_block.py").write_text("X = 1\n")
    generator_hash.cache_clear()
    assert generator_hash(tmp_path) != before
