"""Multi-query associative recall (MQAR), the Zoology benchmark's task, as seeded numpy data.

One example of ``seq_len`` tokens over a vocabulary 0 .. vocab-1, after Zoology's
``multiquery_ar`` (Arora et al. 2023, "Zoology: measuring and improving recall in
efficient language models"):

* keys are drawn from 1 .. vocab//2 - 1 and values from vocab//2 .. vocab-1, ``n_pairs``
  distinct keys and ``n_pairs`` distinct values per example (token 0 is never either);
* the context is the pairs, ``k_1 v_1 k_2 v_2 ... k_n v_n`` (positions 0 .. 2n-1);
* the rest, ``seq_len - 2n`` positions, holds every key once more as a query, at an even
  offset ``2 * gap`` from the context's end; the n gaps are distinct, drawn without
  replacement from 0 .. (seq_len - 2n)/2 - 1 with probability proportional to
  (gap + 1)^(power_a - 1) (Zoology's power law, power_a = 0.01: mostly short gaps);
* every other position of the rest is a uniform random token of the whole vocabulary
  (Zoology's ``random_non_queries``), which may by chance be a key: only the queries
  are asked;
* the target at a query's position is its key's value (next-token prediction: the model
  reads the key and must say the value); the loss mask is true there and nowhere else,
  exactly n positions per example.

Splits: ``split("train", ...)`` and ``split("heldout", ...)`` draw from two different
numpy seed streams, ``SeedSequence([seed, 0])`` and ``SeedSequence([seed, 1])``, so the
held-out examples are independent of the training ones for the same ``seed``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SPLITS = {"train": 0, "heldout": 1}
POWER_A = 0.01   # Zoology's default


@dataclass
class MQAR:
    """``n`` examples: inputs (n, seq_len) int64 token ids, targets (n, seq_len) int64 (the
    value at a query, 0 elsewhere), mask (n, seq_len) bool (true at the queries only)."""
    inputs: np.ndarray
    targets: np.ndarray
    mask: np.ndarray


def check_sizes(vocab: int, n_pairs: int, seq_len: int, names=("vocab", "pairs", "seq_len")) -> None:
    """ValueError, one line naming the argument (``names``: what the caller calls vocab,
    n_pairs and seq_len) and what is allowed, unless the sizes make an MQAR example:
    distinct keys and values fit their halves of the vocabulary, and the query region has a
    slot (two positions) per pair."""
    v, p, t = names
    if vocab < 4:
        raise ValueError(f"{v} {vocab}: allowed is 4 or more (keys and values take half each)")
    if not 1 <= n_pairs <= vocab // 2 - 1:
        raise ValueError(f"{p} {n_pairs}: allowed is 1 to {vocab // 2 - 1} for vocab {vocab} "
                         f"(distinct keys from 1 to {vocab // 2 - 1})")
    if seq_len < 4 * n_pairs:
        raise ValueError(f"{t} {seq_len}: allowed is {4 * n_pairs} or more for {n_pairs} pairs "
                         f"(2 per pair of context, a 2-position slot per query)")


def mqar(n: int, vocab: int, n_pairs: int, seq_len: int, rng: np.random.Generator,
         power_a: float = POWER_A) -> MQAR:
    """``n`` examples drawn from ``rng`` (see the module doc)."""
    check_sizes(vocab, n_pairs, seq_len)
    half, ctx = vocab // 2, 2 * n_pairs
    slots = (seq_len - ctx) // 2
    # n distinct of m without replacement, per example: the first n of a random permutation
    keys = 1 + np.argsort(rng.random((n, half - 1)), axis=1)[:, :n_pairs]
    values = half + np.argsort(rng.random((n, vocab - half)), axis=1)[:, :n_pairs]
    # weighted sampling without replacement (Gumbel top-k): the n largest log p + Gumbel noise
    # are distributed as n sequential draws of numpy's choice(replace=False, p=p)
    logp = (power_a - 1.0) * np.log(np.arange(1, slots + 1))
    gaps = np.argsort(-(logp + rng.gumbel(size=(n, slots))), axis=1)[:, :n_pairs]
    inputs = rng.integers(0, vocab, size=(n, seq_len))
    inputs[:, 0:ctx:2], inputs[:, 1:ctx:2] = keys, values
    rows = np.arange(n)[:, None]
    pos = ctx + 2 * gaps
    inputs[rows, pos] = keys
    targets = np.zeros((n, seq_len), np.int64)
    targets[rows, pos] = values
    mask = np.zeros((n, seq_len), bool)
    mask[rows, pos] = True
    return MQAR(inputs.astype(np.int64), targets, mask)


def split(name: str, n: int, vocab: int, n_pairs: int, seq_len: int, seed: int = 0,
          power_a: float = POWER_A) -> MQAR:
    """The ``name`` split ("train" or "heldout") of data set ``seed``: deterministic, and the
    two splits from different seed streams."""
    if name not in SPLITS:
        raise ValueError(f"split {name!r}: allowed are {', '.join(SPLITS)}")
    return mqar(n, vocab, n_pairs, seq_len, np.random.default_rng([seed, SPLITS[name]]), power_a)
