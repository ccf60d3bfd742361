"""Integer Gated MLA token mixer (issue 15): the contract of the MLA layer's hardware.
Float model: model/float_mla.py (``mla_step``, the decoder's absorbed form); formats in
docs/numerics.md, section 9.  Per token, xn (d,) int8:

  a      = engine(W_dkv' xn)                           resid_bits, into the latent's RMSNorm
  c      = int_normalize(a)                            int8 c_unit: appended to the cache (r bytes)
  q      = engine(W_q' xn)                             int8
  qa_h   = engine(W_uk,h'^T q_h)                       int8 (r) per head; 1/sqrt(dh), kv_norm_w folded in
  u_hj   = requantize(qa_h . c_j, u_m, u_s, u_bits)    the score in base 2: score * log2(e) * 2**F
  ctx_h  = online softmax of u_h over the cache, applied to the latents c_j (below)   int8 (r)
  o_h    = engine(W_uv,h' ctx_h)                       int8 (dh) per head; kv_norm_w folded in
  gate   = sigmoid table(engine(W_g' xn))              U0.unit_frac per channel
  zo     = round_shift(o * gate, unit_frac)            int8
  out    = engine(W_o zo)                              int8, into the residual add

The online softmax, in one pass over the cache j = 0 .. T-1 (F = mla_exp_frac, P = mla_p_frac):

  M_j    = max(M_j-1, ceil(u_j / 2**F))                the running maximum, in whole powers of 2
  l, acc = floor(l / 2**D), floor(acc / 2**D)          D = M_j - M_j-1 (a shift, when the maximum grows)
  n, f   = divmod(M_j * 2**F - u_j, 2**F)              u_j's distance below the maximum
  p_j    = table2[f] >> n                              2**(-n - f/2**F) as U1.P; table2 = Formats.mla_exp2_table
  l     += p_j;  acc += p_j * c_j                      mla_sum, mla_acc bits (derived_widths)
  ctx    = sign(acc) * floor((2|acc| + l) / (2 l))     rounded to the nearest, half away from zero

The maximum moves in whole powers of two, so rescaling the running sums is a shift, and
p of the current maximum's token is at least 2**(P-1) (l > 0).  Within a run of tokens that
does not raise the maximum the sums are plain sums, which is how ``online_softmax`` computes
them (segment by segment; the integers are those of the token-by-token recurrence).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moekda.config import Config
from moekda.formats import Formats, derived_widths
from moekda.numerics import requantize, round_shift, saturate
from model.int_ops import check_width, int_linear, int_lut, int_normalize
from model.qparams import QMLA


@dataclass
class IntMLACache:
    """The int8 latents c_unit of the sequence's tokens so far, oldest first: (..., T, r)."""
    latents: list = field(default_factory=list)

    def stacked(self) -> np.ndarray:
        return np.stack(self.latents, axis=-2)


def online_softmax(u, c, fm: Formats, sum_bits: int, acc_bits: int, out_bits: int) -> np.ndarray:
    """The softmax of scores u (T,) (base 2, F fractional bits) applied to values c (T, r):
    (r,) out_bits, as the module docstring's recurrence.  ``sum_bits``, ``acc_bits``: the
    widths the running sums must fit (an MLA layer's latents: derived_widths mla_sum,
    mla_acc; Attention Residuals' values: attn_res_sum, attn_res_acc)."""
    F, T = fm.mla_exp_frac, len(u)
    table = fm.mla_exp2_table
    whole = -((-u) >> F)                                       # ceil(u / 2**F)
    M = np.maximum.accumulate(whole)
    delta = (M << F) - u
    n, f = delta >> F, delta & ((1 << F) - 1)
    p = table[f] >> np.minimum(n, 62)
    # segments: each starts where the maximum grows (the first token starts one)
    starts = np.concatenate([[0], np.nonzero(np.diff(M))[0] + 1])
    ends = np.concatenate([starts[1:], [T]])
    l, acc = np.int64(0), np.zeros(c.shape[-1], dtype=np.int64)
    prev = M[0]
    for a, b in zip(starts, ends):
        D = min(int(M[a] - prev), 62)
        l, acc = l >> D, acc >> D                               # floor, as the hardware's shift
        l = l + p[a:b].sum()
        acc = acc + p[a:b] @ c[a:b]
        prev = M[a]
        check_width(np.array([l]), sum_bits, "online softmax sum")
        check_width(acc, acc_bits, "online softmax accumulator")
    mag = (2 * np.abs(acc) + l) // (2 * l)
    return saturate(np.sign(acc) * mag, out_bits)


def int_mla_latent(q: QMLA, fm: Formats, xn):
    """(a, c_unit): the token's latent before and after its RMSNorm, what it appends to the
    cache (a bench restoring a cache needs only this part of the step)."""
    a = int_linear(q.dkv, xn, fm, "mla dkv")
    return a, int_normalize(a[..., None, :], q.kv_norm, fm, fm.act_bits)[..., 0, :]


def int_mla_step(q: QMLA, cfg: Config, fm: Formats, cache: IntMLACache, xn, trace=None):
    """One token through the MLA block. xn: (d,) int8 (or (..., d): a batch of sequences, the
    cache batched alike). Returns (new cache, out (d,) int8); the cache passed in is unchanged."""
    m = cfg.model
    H, dh = m.n_heads, m.head_dim
    xn = check_width(np.asarray(xn, dtype=np.int64), fm.act_bits, "mla input")
    t = trace if trace is not None else {}
    t["mla_a"], c = int_mla_latent(q, fm, xn)
    t["mla_c_unit"] = c
    cache = IntMLACache(cache.latents + [c])
    t["mla_q"] = int_linear(q.q_proj, xn, fm, "mla q_proj")
    qh = t["mla_q"].reshape(*xn.shape[:-1], H, dh)
    acc = check_width(np.einsum("hrd,...hd->...hr", q.uk.w, qh), fm.acc_bits, "mla uk accumulator")
    qa = requantize(acc, q.uk.m, q.uk.s, q.uk.out_bits)        # (..., H, r)
    t["mla_qa"] = qa.reshape(*xn.shape[:-1], -1)
    C = cache.stacked()                                         # (..., T, r)
    s_acc = check_width(np.einsum("...tr,...hr->...ht", C, qa), fm.acc_bits, "mla score accumulator")
    u = requantize(s_acc, q.u_m, q.u_s, fm.mla_u_bits)         # (..., H, T)
    widths = derived_widths(cfg)
    lead = xn.shape[:-1]
    ctx = np.zeros((*lead, H, C.shape[-1]), dtype=np.int64)
    for i in np.ndindex(*lead, H):
        ctx[i] = online_softmax(u[i], C[i[:-1]], fm, widths["mla_sum"], widths["mla_acc"], fm.act_bits)
    t["mla_ctx"] = ctx.reshape(*lead, -1)
    acc = check_width(np.einsum("hdr,...hr->...hd", q.uv.w, ctx), fm.acc_bits, "mla uv accumulator")
    o = requantize(acc, q.uv.m, q.uv.s, q.uv.out_bits).reshape(*lead, H * dh)
    t["mla_o"] = o
    t["mla_g_logit"] = int_linear(q.g_proj, xn, fm, "mla g_proj")
    t["mla_gate"] = int_lut(q.gate, t["mla_g_logit"])
    t["mla_zo"] = round_shift(o * t["mla_gate"], fm.unit_frac)
    out = int_linear(q.o_proj, t["mla_zo"], fm, "mla o_proj")
    t["mla_out"] = out
    return cache, out
