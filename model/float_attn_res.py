"""Float (numpy float64) model of Attention Residuals (issue 15; "Attention Residuals",
arXiv 2603.15031): a sub-layer's input is a softmax-weighted mix over depth instead of the
plain residual sum.

The stack is a chain of sub-layers n = 1 .. N (each layer's token mixer, then its channel
mixer: N = 2 L), each f_n taking its input h_n and giving an output f_n(h_n) (before any
residual add).  With v_0 = the embedding and v_n = f_n(h_n):

    plain residual:   h_n = v_0 + v_1 + ... + v_{n-1}
    full AttnRes:     h_n = sum_{i<n} a_{n,i} v_i,   a_n = softmax_i(w_n . RMSNorm(v_i))
    block AttnRes:    sub-layers are grouped into blocks of ``block`` consecutive ones; a
                      block's outputs are summed plainly into its summary b_k, and
                      h_n = sum_j a_{n,j} u_j over u = [v_0, b_1, .., b_{k-1}, partial_k]
                      (the finished blocks' summaries, then the current block's partial
                      sum if it has one), a_n = softmax_j(w_n . RMSNorm(u_j))

w_n is sub-layer n's learned pseudo-query (d_model), the keys are the RMS-normalised
values with no learned norm weight and no 1/sqrt(d) scale, as the reference states.  The
stack's output (into the final norm) is mixed the same way with its own query w_{N+1}.
With every w_n = 0 the weights are uniform, so full AttnRes starts as the mean of the
values (the paper initialises the queries to zero); the plain residual is the same sum
unnormalised.

What the hardware keeps per sequence: full AttnRes every v_i (N + 1 vectors of d_model, or
their keys' norms with them), block AttnRes the finished summaries and one partial sum
(N / block + 2): ``kept_vectors``.  A sub-layer's input costs one dot product of d per kept
vector for the logits and one scaled add of d per kept vector for the sum.
"""
from __future__ import annotations

import numpy as np

from hw.attnres.kept import kept_vectors  # noqa: F401 (the buffer count, one copy: the hardware's)
from model.float_layer import rms_unit

MODES = ("none", "full", "block")


def depth_mix(query, values, eps: float, trace=None) -> np.ndarray:
    """sum_i softmax_i(query . RMSNorm(values_i)) values_i for values (n, d)."""
    V = np.asarray(values, dtype=np.float64)
    keys = np.stack([rms_unit(v, eps) for v in V])
    logits = keys @ np.asarray(query, dtype=np.float64)
    a = np.exp(logits - logits.max())
    a /= a.sum()
    if trace is not None:
        trace.update(res_logits=logits, res_weights=a)
    return a @ V


class DepthResidual:
    """The values a token carries down the stack, and the input each sub-layer gets.

    ``DepthResidual(mode, x0, queries, eps, block)``; then for each sub-layer n = 1 .. N:
    ``h = r.input(n)`` gives its input, ``r.add(v)`` records its output; ``r.output()`` is
    the stack's output.  ``queries`` is (N + 1, d): one pseudo-query per sub-layer and one
    for the output (unused by ``none``)."""

    def __init__(self, mode: str, x0, queries, eps: float, block: int = 2):
        if mode not in MODES:
            raise ValueError(f"attn_res {mode!r}: allowed are {', '.join(MODES)}")
        if mode == "block" and block < 1:
            raise ValueError(f"attn_res block {block}: allowed is 1 or more sub-layers per block")
        self.mode, self.eps, self.block = mode, eps, block
        self.queries = None if queries is None else np.asarray(queries, dtype=np.float64)
        x0 = np.asarray(x0, dtype=np.float64)
        self.values = [x0]              # full: v_0 .. v_{n-1}; block: v_0 and the finished summaries
        self.partial = None             # block: the current block's running sum
        self.in_block = 0               # block: sub-layers already in the current block
        self.sum = x0.copy()            # none: the plain residual stream
        self.n = 0

    def _mix(self, q_index: int, trace=None) -> np.ndarray:
        if self.mode == "none":
            return self.sum.copy()
        vals = self.values if self.mode == "full" or self.partial is None else self.values + [self.partial]
        return depth_mix(self.queries[q_index], vals, self.eps, trace)

    def input(self, n: int, trace=None) -> np.ndarray:
        if n != self.n + 1:
            raise ValueError(f"sub-layer {n} asked for its input after {self.n} outputs")
        return self._mix(n - 1, trace)

    def add(self, v) -> None:
        v = np.asarray(v, dtype=np.float64)
        self.n += 1
        if self.mode == "none":
            self.sum = self.sum + v
        elif self.mode == "full":
            self.values.append(v)
        else:
            self.partial = v.copy() if self.partial is None else self.partial + v
            self.in_block += 1
            if self.in_block == self.block:
                self.values.append(self.partial)
                self.partial, self.in_block = None, 0

    def output(self, trace=None) -> np.ndarray:
        return self._mix(self.n, trace)

    @property
    def kept(self) -> int:
        """Vectors of d_model held right now."""
        if self.mode == "none":
            return 1
        return len(self.values) + (self.partial is not None)


def run_stack(mode: str, x0, sublayers, queries, eps: float, block: int = 2, trace=None) -> np.ndarray:
    """x0 (d,) through ``sublayers`` (callables h -> f(h)) with the given residual mixing;
    returns the stack's output.  ``trace`` gets ``inputs`` (each h_n) and ``kept`` (the
    vectors held after each sub-layer)."""
    r = DepthResidual(mode, x0, queries, eps, block)
    inputs, kept = [], []
    for n, f in enumerate(sublayers, start=1):
        h = r.input(n)
        inputs.append(h)
        r.add(f(h))
        kept.append(r.kept)
    if trace is not None:
        trace.update(inputs=inputs, kept=kept)
    return r.output()
