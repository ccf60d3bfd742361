"""model/tasks/chars.py: the standard-library corpus splits by file, windows are the text with
its next bytes, the held-out windows are prefix-stable, the record sees a changed file.
numpy only: runs without the training extra."""
import numpy as np
import pytest

from model.tasks import chars


@pytest.fixture()
def corpus(tmp_path):
    names = [f"mod{i}.py" for i in range(40)] + ["_private.py"]
    for i, n in enumerate(names):
        (tmp_path / n).write_bytes((f"# {n}\n" + "x = %d\n" % i * 20).encode())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner.py").write_text("no\n")
    return tmp_path


def test_files_split_by_name_not_by_line(corpus):
    files = chars.corpus_files(corpus)
    assert [p.name for p in files] == sorted(f"mod{i}.py" for i in range(40))    # public, top level
    held = [p.name for p in files if chars.is_heldout(p.name)]
    assert 0 < len(held) < len(files)
    text_h, text_t = chars.split_text("heldout", corpus), chars.split_text("train", corpus)
    assert len(text_h) + len(text_t) == sum(p.stat().st_size for p in files)
    for p in files:       # each file whole in exactly one split
        assert (p.read_bytes() in text_h) == (p.name in held) and (p.read_bytes() in text_t) != (p.name in held)


def test_windows_are_text_and_next_bytes(corpus):
    text = chars.split_text("train", corpus)
    d = chars.split("train", 50, 16, seed=3, root=corpus)
    assert d.inputs.shape == d.targets.shape == d.mask.shape == (50, 16) and d.mask.all()
    assert np.array_equal(d.inputs[:, 1:], d.targets[:, :-1])
    for x, y in zip(d.inputs[:5], d.targets[:5]):
        assert bytes(x.tolist()) + bytes([int(y[-1])]) in text
    assert np.array_equal(d.inputs, chars.split("train", 50, 16, seed=3, root=corpus).inputs)
    assert not np.array_equal(d.inputs, chars.split("train", 50, 16, seed=4, root=corpus).inputs)


def test_heldout_windows_prefix_stable(corpus):
    a, b = chars.split("heldout", 5, 8, root=corpus), chars.split("heldout", 9, 8, root=corpus)
    assert np.array_equal(a.inputs, b.inputs[:5])


def test_record_sees_changed_and_missing_files(corpus):
    rec = chars.corpus_record(corpus)
    assert chars.corpus_differences(rec, corpus) == []
    (corpus / "mod3.py").write_text("changed\n")
    (corpus / "mod4.py").unlink()
    (corpus / "new.py").write_text("n\n")
    diff = chars.corpus_differences(rec, corpus)
    assert any(d.startswith("mod3.py: differs") for d in diff) and "mod4.py: missing here" in diff
    assert "new.py: only here" in diff


def test_bad_sizes_refused(corpus):
    with pytest.raises(ValueError, match="seq_len 1"):
        chars.split("train", 2, 1, root=corpus)
    with pytest.raises(ValueError, match="allowed are train, heldout"):
        chars.split_text("test", corpus)
    with pytest.raises(ValueError, match="hold no"):
        chars.split("heldout", 2, 10 ** 6, root=corpus)
