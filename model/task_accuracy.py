"""A trained model on its task, at every step from float to the chip (issue 16).

The same held-out examples go through model/ float model (float64), through the
integer model of the same parameters quantised on the task's *training* examples, and
(``ModelDriver.run_sequences``) through the chip's RTL; each is scored where the task
asks (``data.mask``: MQAR's queries, every position of a text):

* ``accuracy``: the next-token id (argmax, the lowest id on a tie, as the chip's argmax)
  equals the target;
* ``bits_per_token``: the mean of -log2 softmax(logits)[target] (float logits, or the
  integer logits dequantised by their scale): bits per character for a character model.

``data`` is anything with ``inputs``, ``targets`` and ``mask`` arrays of shape (n, T)
(model/tasks: ``mqar.MQAR``).  numpy only: no training framework.
"""
from __future__ import annotations

import numpy as np

from moekda.config import Config
from model import float_model
from model.int_model import dequantize_logits, int_next_tokens, int_run_model
from model.params import ModelParams
from model.qparams import QModel
from model.quantize import quantize_model


def calibrate(mp: ModelParams, cfg: Config, train_inputs) -> QModel:
    """The integer model of ``mp``, its activation ranges calibrated on the float model's
    activations over the given training examples (never held-out ones)."""
    return quantize_model(mp, cfg, token_seqs=[np.asarray(t, np.int64) for t in train_inputs])


def bits(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log2 of the softmax probability of each target: logits (T, V), targets (T,)."""
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(targets)), targets] / np.log(2.0)


def score(pred: np.ndarray, logits: list | None, data, n: int) -> dict:
    """Scores of the first ``n`` examples from their predictions (n, T) and, when given,
    their logits (n arrays (T, V)) for the bits."""
    mask, tgt = data.mask[:n], data.targets[:n]
    hits = int(((pred == tgt) & mask).sum())
    scored = int(mask.sum())
    out = {"examples": n, "scored": scored, "hits": hits, "accuracy": hits / max(1, scored)}
    if logits is not None:
        b = np.stack([bits(lg, t) for lg, t in zip(logits, tgt)])      # (n, T)
        out["bits_per_token"] = float(b[mask].mean()) if scored else None
        # by position in the sequence (context length): mean over the examples scored there
        per = mask.sum(axis=0)
        out["bits_by_position"] = [float(b[mask[:, t], t].mean()) if per[t] else None for t in range(b.shape[1])]
    return out


def float_scores(mp: ModelParams, cfg: Config, data, n: int) -> tuple[dict, np.ndarray]:
    """model/ float model (float64) on the first n examples; also its predictions (n, T)."""
    logits = [float_model.run_model(mp, cfg, x) for x in data.inputs[:n]]
    pred = np.stack([float_model.next_tokens(lg) for lg in logits])
    return score(pred, logits, data, n), pred


def int_scores(q: QModel, cfg: Config, data, n: int) -> tuple[dict, np.ndarray]:
    """The integer model on the first n examples; also its predictions (n, T), which the
    chip's must equal."""
    # the examples side by side (a batch): the same integers as one at a time, ~20x faster
    ilog = np.concatenate([int_run_model(q, cfg, data.inputs[i:min(n, i + BATCH)]) for i in range(0, n, BATCH)])
    pred = int_next_tokens(ilog)
    return score(pred, list(dequantize_logits(q, ilog)), data, n), pred


BATCH = 64      # examples per integer-model batch: the state of 64 sequences stays small
