"""Float (numpy float64) model of a Gated MLA token mixer (issue 15), the hybrid's global
attention layer: multi-head latent attention (DeepSeek-V2, arXiv 2405.04434) without
positional encoding (NoPE, as Kimi Linear's MLA layers) and with a per-head sigmoid
output gate ("Gated Attention for Large Language Models").  Per token t, per head h:

    c_t  = RMSNorm(W_dkv x_t) * kv_norm_w        latent, kv_rank values: the only cache
    q_h  = W_q,h x_t                               (no query compression, as Kimi Linear)
    k_hj = W_uk,h c_j ;  v_hj = W_uv,h c_j         keys and values of every cached token j <= t
    o_h  = sum_j softmax_j(q_h . k_hj / sqrt(d_h)) v_hj
    y    = W_o [g_1 * o_1; ...; g_H * o_H],  g = sigmoid(W_g x_t)   (elementwise per head)

``mla_step`` computes it as a decoder does, with the up-projections absorbed:
q_h . k_hj = (W_uk,h^T q_h) . c_j and o_h = W_uv,h (sum_j a_hj c_j), so a token reads
each cached latent once per head for the score and once for the sum (2 * kv_rank MACs per
cached token and head: linear in the context), and the softmax runs in one pass over the
cache with a running maximum and sum (online softmax).  ``mla_reference`` is the textbook
form above (explicit keys and values, a two-pass softmax) for the tests.

x is the normalised layer input (RMSNorm(x) as for KDA); the layer's residual add and
channel mixer are float_layer's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from model.float_ops import rms_unit, sigmoid
from model.params import MLAParams


@dataclass
class MLACache:
    """The latents of the tokens of the sequence so far (kv_rank values each)."""
    latents: list = field(default_factory=list)

    def reset(self):
        self.latents.clear()


def random_mla_params(d: int, heads: int, head_dim: int, kv_rank: int, seed: int = 0) -> MLAParams:
    """Random parameters of the usual scales (1/sqrt(fan-in) projections, norm weight ~1)."""
    rng = np.random.default_rng(seed)
    dense = lambda *shape: rng.standard_normal(shape) / np.sqrt(shape[-1])
    hd = heads * head_dim
    return MLAParams(w_q=dense(hd, d), w_dkv=dense(kv_rank, d), kv_norm_w=1 + 0.1 * rng.standard_normal(kv_rank),
                     w_uk=dense(heads, head_dim, kv_rank), w_uv=dense(heads, head_dim, kv_rank),
                     w_g=dense(hd, d), w_o=dense(d, hd))


def latent(p: MLAParams, xn, eps: float) -> np.ndarray:
    """c_t = RMSNorm(W_dkv x_t): what the cache keeps for a token."""
    return rms_unit(p.w_dkv @ xn, eps) * p.kv_norm_w


def online_softmax_sum(scores_and_values):
    """sum_j softmax_j(s_j) c_j in one pass over (s_j, c_j): a running maximum m, a running
    sum l of exp(s_j - m) and a running vector acc of exp(s_j - m) c_j, both rescaled by
    exp(m_old - m_new) when the maximum grows."""
    m, l, acc = -np.inf, 0.0, None
    for s, c in scores_and_values:
        m_new = max(m, s)
        scale = np.exp(m - m_new) if np.isfinite(m) else 0.0
        w = np.exp(s - m_new)
        acc = w * c if acc is None else acc * scale + w * c
        l = l * scale + w
        m = m_new
    return acc / l


def mla_step(p: MLAParams, cache: MLACache, xn, eps: float, trace=None) -> np.ndarray:
    """One token (the decoder's form: absorbed up-projections, online softmax over the
    cache including this token's own latent, which is appended first)."""
    H, dh = p.heads, p.head_dim
    a = p.w_dkv @ xn
    cache.latents.append(rms_unit(a, eps) * p.kv_norm_w)
    q = (p.w_q @ xn).reshape(H, dh)
    qa = np.einsum("hdr,hd->hr", p.w_uk, q) / np.sqrt(dh)       # W_uk,h^T q_h, the 1/sqrt(d_h) folded in
    ctx = np.stack([online_softmax_sum((float(qa[h] @ c), c) for c in cache.latents) for h in range(H)])
    o = np.einsum("hdr,hr->hd", p.w_uv, ctx)                     # W_uv,h ctx_h
    g_logit = p.w_g @ xn
    g = sigmoid(g_logit)
    out = p.w_o @ (g * o.reshape(-1))
    if trace is not None:
        # mla_a, mla_c_unit: the latent before its norm and after it without its weight (the
        # integer model caches c_unit and folds the weight into W_uk and W_uv)
        trace.update(mla_a=a, mla_c_unit=rms_unit(a, eps), mla_q=q.reshape(-1), mla_qa=qa.reshape(-1),
                     mla_ctx=ctx.reshape(-1), mla_o=o.reshape(-1), mla_g_logit=g_logit, mla_gate=g,
                     mla_zo=g * o.reshape(-1), mla_out=out)
    return out


def mla_reference(p: MLAParams, xns, eps: float, resets=None) -> np.ndarray:
    """The textbook form over a whole sequence xns (T, d): explicit k and v of every cached
    token, scores, a softmax (maximum subtracted), the weighted sum of the values, the gate,
    W_o.  ``resets[t]`` starts a new sequence (an empty cache) at token t."""
    H, dh = p.heads, p.head_dim
    out, cs = [], []
    for t, xn in enumerate(np.asarray(xns, dtype=np.float64)):
        if t == 0 or (resets is not None and resets[t]):
            cs = []
        cs.append(latent(p, xn, eps))
        C = np.stack(cs)                                  # (j, r)
        K = np.einsum("hdr,jr->hjd", p.w_uk, C)           # (H, j, dh)
        V = np.einsum("hdr,jr->hjd", p.w_uv, C)
        q = (p.w_q @ xn).reshape(H, dh)
        s = np.einsum("hjd,hd->hj", K, q) / np.sqrt(dh)
        a = np.exp(s - s.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        o = np.einsum("hj,hjd->hd", a, V)
        out.append(p.w_o @ (sigmoid(p.w_g @ xn) * o.reshape(-1)))
    return np.stack(out)


def run_mla(p: MLAParams, xns, eps: float, resets=None) -> np.ndarray:
    """``mla_step`` over a sequence (T, d), the cache emptied where ``resets``."""
    cache = MLACache()
    out = []
    for t, xn in enumerate(np.asarray(xns, dtype=np.float64)):
        if t == 0 or (resets is not None and resets[t]):
            cache.reset()
        out.append(mla_step(p, cache, xn, eps))
    return np.stack(out)


def cache_bytes_per_token(kv_rank: int, bytes_per_value: int) -> int:
    """What the MLA cache grows by per token of context (one latent)."""
    return kv_rank * bytes_per_value
