"""model/tasks/mqar.py: every query's target is its key's value from the context, the mask marks
the queries and nothing else, the data are deterministic per seed and the splits differ.
numpy only: runs without the training extra."""
import numpy as np
import pytest

from model.tasks.mqar import check_sizes, mqar, split


@pytest.mark.parametrize("vocab,n_pairs,seq_len", [(64, 4, 64), (64, 8, 32), (16, 7, 30), (64, 1, 4), (64, 4, 17)])
def test_answers_are_the_context_values(vocab, n_pairs, seq_len):
    d = split("train", 200, vocab, n_pairs, seq_len, seed=3)
    ctx, half = 2 * n_pairs, vocab // 2
    assert d.inputs.shape == d.targets.shape == d.mask.shape == (200, seq_len)
    assert d.inputs.min() >= 0 and d.inputs.max() < vocab
    for inp, tgt, msk in zip(d.inputs, d.targets, d.mask):
        keys, values = inp[0:ctx:2], inp[1:ctx:2]
        assert len(set(keys)) == n_pairs and len(set(values)) == n_pairs
        assert keys.min() >= 1 and keys.max() < half and values.min() >= half
        q = np.nonzero(msk)[0]
        assert len(q) == n_pairs and q.min() >= ctx and np.all((q - ctx) % 2 == 0)
        assert sorted(inp[q]) == sorted(keys)             # every key asked once
        answer = dict(zip(keys, values))
        assert [answer[k] for k in inp[q]] == list(tgt[q])
        assert not tgt[~msk].any()


def test_deterministic_and_splits_differ():
    a = split("train", 64, 64, 4, 64, seed=0)
    b = split("train", 64, 64, 4, 64, seed=0)
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("inputs", "targets", "mask"))
    held = split("heldout", 64, 64, 4, 64, seed=0)
    other = split("train", 64, 64, 4, 64, seed=1)
    for x in (held, other):
        assert not (a.inputs[:, None, :] == x.inputs[None, :, :]).all(axis=2).any()   # no shared example
    # the held-out stream of seed 0 is not the training stream of any small seed either
    assert not any(np.array_equal(held.inputs, split("train", 64, 64, 4, 64, seed=s).inputs) for s in range(4))


def test_gaps_follow_the_power_law():
    """Short gaps are the most frequent (p ~ (gap+1)^-0.99), yet every slot is used."""
    d = split("train", 2000, 64, 4, 128, seed=5)
    gaps = (np.nonzero(d.mask)[1] - 8) // 2
    counts = np.bincount(gaps, minlength=60)
    assert counts[0] > counts[10] > counts[59] > 0


def test_fillers_are_random_tokens():
    d = mqar(500, 64, 4, 64, np.random.default_rng(0))
    fill = d.inputs[:, 8:][~d.mask[:, 8:]]
    assert len(np.unique(fill)) == 64             # the whole vocabulary, token 0 included


@pytest.mark.parametrize("args,word", [((3, 1, 8), "vocab"), ((64, 32, 256), "pairs"), ((64, 0, 8), "pairs"),
                                       ((64, 4, 15), "seq_len")])
def test_bad_sizes_named(args, word):
    with pytest.raises(ValueError, match=f"^{word} "):
        check_sizes(*args)
    with pytest.raises(ValueError, match="split 'test'"):
        split("test", 1, 64, 4, 64)
