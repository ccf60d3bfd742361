"""Integer Attention Residuals (issue 15): the contract of the stack's depth mixing when
model.attn_res is "full" or "block".  Float model: model/float_attn_res.py
(DepthResidual); formats in docs/numerics.md section 9.

Every value a sub-layer's input can mix (x_0, the sub-layers' outputs, block AttnRes'
summaries and its partial sum) is kept as resid_bits at one depth scale s_v:

  v_0    = requantize(x_0, emb_m, emb_s, resid_bits)          the embedding entry
  v_n    = requantize(f_n(h_n), out_m[n], out_s[n], resid_bits)   sub-layer n's output
  block  : b = sat(b + v_n) within a block; a full block's b becomes a kept value
  key_i  = int_normalize(v_i)                                int8 unit RMS, no weight (the reference's)
  u_i    = requantize(queries[n] . key_i, u_m[n], u_s[n], mla_u_bits)   base 2, as the MLA scores
  h_n    = online_softmax(u, kept values)                    resid_bits at s_v: a weighted mean

The softmax is int_mla.online_softmax, the same arithmetic as an MLA layer's over its cache.
The layers' own residual adds are not used; each sub-layer's input is h_n, normalised by the
layer's RMSNorm as in the plain stack.
"""
from __future__ import annotations

import numpy as np

from moekda.config import Config
from moekda.formats import derived_widths, formats_for
from moekda.numerics import requantize, saturate
from model.int_mla import online_softmax
from model.int_ops import check_width, int_normalize
from model.qparams import QAttnRes


class IntDepthResidual:
    """The kept values of one token (or of a batch of tokens, leading axes) on its way down
    the stack.  ``input(n)`` is sub-layer n's input (n = 1 .. N), ``add(n, out)`` records its
    output, ``output()`` is the stack's output (the mix with the last query)."""

    def __init__(self, q: QAttnRes, cfg: Config, x0):
        self.q, self.cfg, self.fm = q, cfg, formats_for(cfg)
        self.mode, self.block = cfg.model.attn_res, cfg.model.attn_res_block
        w = derived_widths(cfg)
        self.sum_bits, self.acc_bits = w["attn_res_sum"], w["attn_res_acc"]
        self.values = [requantize(x0, q.emb_m, q.emb_s, self.fm.resid_bits)]
        self.partial, self.in_block, self.n = None, 0, 0

    def _kept(self) -> list:
        if self.mode == "block" and self.partial is not None:
            return self.values + [self.partial]
        return self.values

    def _mix(self, qi: int, trace=None):
        fm, q = self.fm, self.q
        V = np.stack(self._kept(), axis=-2)                          # (..., k, d)
        keys = int_normalize(V, q.key_norm, fm, fm.act_bits)
        acc = check_width(keys @ q.queries[qi], fm.acc_bits, "attn_res logit accumulator")
        u = requantize(acc, int(q.u_m[qi]), int(q.u_s[qi]), fm.mla_u_bits)   # (..., k)
        out = np.zeros(V.shape[:-2] + V.shape[-1:], dtype=np.int64)
        for i in np.ndindex(*V.shape[:-2]):
            out[i] = online_softmax(u[i], V[i], fm, self.sum_bits, self.acc_bits, fm.resid_bits)
        if trace is not None:
            trace["res_u"] = u
        return out

    def input(self, n: int, trace=None):
        if n != self.n + 1:
            raise ValueError(f"sub-layer {n} asked for its input after {self.n} outputs")
        return self._mix(n - 1, trace)

    def add(self, n: int, out) -> None:
        """Sub-layer n's output, at that sub-layer's own scale."""
        fm = self.fm
        v = requantize(out, int(self.q.out_m[n - 1]), int(self.q.out_s[n - 1]), fm.resid_bits)
        self.n = n
        if self.mode == "full":
            self.values.append(v)
            return
        self.partial = v if self.partial is None else saturate(self.partial + v, fm.resid_bits)
        self.in_block += 1
        if self.in_block == self.block:
            self.values.append(self.partial)
            self.partial, self.in_block = None, 0

    def output(self, trace=None):
        return self._mix(self.n, trace)
