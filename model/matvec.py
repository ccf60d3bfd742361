"""Integer model of the int8 matrix-vector engine (hw/arith/matvec.py).

This is the specification the RTL is compared against, bit for bit.

A dot product of length C is fed to the engine L lanes per beat: beat j
carries weights w[j*L:(j+1)*L] and activations x[j*L:(j+1)*L]; the last beat
of a row is zero-padded when L does not divide C (zeros add nothing).

Each beat carries two framing flags, independent of each other:

* ``first``: the accumulator restarts from zero before this beat is added;
* ``last``: after adding this beat the engine emits one result, made from
  the accumulator and the (mult, shift) pair carried by this same beat.

A result is the wide accumulator ``acc`` (int, ``acc_bits`` two's complement,
wrapping modulo 2**acc_bits exactly like the hardware register) and
``y = requantize(acc, mult, shift)`` from moekda.numerics (int8).

An engine built with several output widths saturates each row to
``out_widths[out_sel]`` of its ``last`` beat instead of int8 (the MoE's
table codes, int8 activations and 16-bit expert outputs share one engine);
an engine with a tag hands the ``last`` beat's ``tag`` back with the result.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moekda.numerics import requantize


@dataclass(frozen=True)
class Beat:
    """One input beat of the engine: L weights, L activations and framing."""
    w: tuple[int, ...]
    x: tuple[int, ...]
    first: bool
    last: bool
    mult: int = 0
    shift: int = 0
    out_sel: int = 0
    tag: int = 0


@dataclass(frozen=True)
class Result:
    """One output of the engine: requantised int8 and the raw accumulator."""
    y: int
    acc: int
    tag: int = 0


def wrap(value: int, bits: int) -> int:
    """Two's-complement wrap of a Python int to ``bits`` bits (what a register holds)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def beats_per_row(length: int, lanes: int) -> int:
    return max(1, -(-length // lanes))


def row_beats(w_row, x, lanes: int, mult: int, shift: int) -> list[Beat]:
    """Split one dot product into beats of ``lanes``, zero-padding the last."""
    w_row = np.asarray(w_row, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64)
    if w_row.shape != x.shape or w_row.ndim != 1:
        raise ValueError(f"weight row {w_row.shape} and activations {x.shape} must be equal-length vectors")
    n = beats_per_row(len(x), lanes)
    pad = n * lanes - len(x)
    wp = np.concatenate([w_row, np.zeros(pad, np.int64)])
    xp = np.concatenate([x, np.zeros(pad, np.int64)])
    return [Beat(w=tuple(int(v) for v in wp[j * lanes:(j + 1) * lanes]),
                 x=tuple(int(v) for v in xp[j * lanes:(j + 1) * lanes]),
                 first=(j == 0), last=(j == n - 1),
                 mult=int(mult) if j == n - 1 else 0,
                 shift=int(shift) if j == n - 1 else 0)
            for j in range(n)]


def matrix_beats(W, x, lanes: int, mult, shift) -> list[Beat]:
    """All beats of y = W @ x, row after row; ``mult``/``shift`` scalar or one per row."""
    W = np.asarray(W)
    rows = W.shape[0]
    mult = np.broadcast_to(np.asarray(mult), (rows,))
    shift = np.broadcast_to(np.asarray(shift), (rows,))
    beats = []
    for r in range(rows):
        beats += row_beats(W[r], x, lanes, int(mult[r]), int(shift[r]))
    return beats


def run_beats(beats, acc_bits: int = 32, out_bits: int = 8, out_widths=None) -> list[Result]:
    """What the engine emits for a stream of beats (the cycle-free behaviour).

    ``out_widths``: the engine's output widths, indexed by each row's ``out_sel``
    (default: every row saturates to ``out_bits``)."""
    acc = 0  # the register after reset
    out = []
    for b in beats:
        if len(b.w) != len(b.x):
            raise ValueError("a beat needs as many weights as activations")
        dot = sum(int(wi) * int(xi) for wi, xi in zip(b.w, b.x))
        acc = wrap((0 if b.first else acc) + dot, acc_bits)
        if b.last:
            bits = out_widths[b.out_sel] if out_widths else out_bits
            y = int(requantize(acc, b.mult, b.shift, bits))
            out.append(Result(y=y, acc=acc, tag=b.tag))
    return out


def matvec(W, x, mult, shift, acc_bits: int = 32, out_bits: int = 8):
    """Vectorised y = requantize(W @ x) and the int32 accumulators, one per row.

    Lane count does not change the result (zero padding adds nothing), so the
    model needs no ``lanes`` here; ``run_beats(matrix_beats(...))`` is the
    beat-level form of the same computation.
    """
    W = np.asarray(W, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64)
    acc = W @ x
    acc = ((acc + (1 << (acc_bits - 1))) & ((1 << acc_bits) - 1)) - (1 << (acc_bits - 1))
    mult = np.broadcast_to(np.asarray(mult, dtype=np.int64), acc.shape)
    shift = np.broadcast_to(np.asarray(shift, dtype=np.int64), acc.shape)
    y = np.array([int(requantize(a, m, s, out_bits)) for a, m, s in zip(acc, mult, shift)], dtype=np.int64)
    return y, acc
