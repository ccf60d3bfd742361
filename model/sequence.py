"""Driving a model over a sequence, one step per token: the loop the float and the
integer model stacks share (model/float_model.py, int_model.py).

A ``step(state, item, trace) -> (state, output)`` and a ``zeros() -> state`` are all a
model gives; the loops here add the sequence rules once: ``resets[t]`` true starts a
new sequence at item t (the state zeroed before it), one trace dict per item, and
greedy decoding that feeds each chosen id back."""
from __future__ import annotations

from typing import Callable


def reset_flags(n: int, resets) -> list[bool]:
    """One flag per item; none given: no resets."""
    if resets is None:
        return [False] * n
    if len(resets) != n:
        raise ValueError(f"resets: {len(resets)} flags for {n} tokens")
    return [bool(r) for r in resets]


def run_sequence(step: Callable, zeros: Callable, items, out, resets=None, traces: list | None = None):
    """Fill ``out[t]`` with step's output for items[t], state carried and reset as asked;
    appends one trace dict per item to ``traces``.  Returns ``out``."""
    state = zeros()
    for i, (item, r) in enumerate(zip(items, reset_flags(len(items), resets))):
        if r:
            state = zeros()
        tr = {} if traces is not None else None
        state, out[i] = step(state, item, tr)
        if traces is not None:
            traces.append(tr)
    return out


def greedy(step: Callable, zeros: Callable, choose: Callable, prompt, n_new: int, name: str) -> list[int]:
    """The prompt as a new sequence, then ``n_new`` ids, each ``choose(logits)`` fed back."""
    state, logits = zeros(), None
    for tok in prompt:
        state, logits = step(state, tok, None)
    if logits is None:
        raise ValueError(f"{name}: the prompt is empty")
    out = []
    for _ in range(n_new):
        out.append(choose(logits))
        state, logits = step(state, out[-1], None)
    return out
