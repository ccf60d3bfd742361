"""Float (numpy float64) model of one Kimi-style layer: the ground truth.

    h = x + KDA(RMSNorm(x))
    y = h + MoE(RMSNorm(h))

exactly as in the reference math (kimi-layer-math.md).  One token at a time,
with the KDA state (short-convolution history + delta-rule matrix per head)
carried across tokens and reset on request.  ``trace`` dicts record the
intermediate tensors; the quantiser calibrates the integer formats on them and
the accuracy report compares the integer model against them.

Every KDA projection, the output gate's included, reads the normalised input
RMSNorm(x) (fla's ``hidden_states`` inside the attention block); the MoE reads
RMSNorm(h).

Traced names describe the *integer model's* dataflow where it differs from the
textbook order: the RMSNorm weights are folded into the following projection
by the quantiser, so ``xn_unit`` is x / rms(x) without the weight, and the
output-norm weight is folded into W_o, so ``zo`` is (o / rms(o)) * gate.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moekda.config import Config
from model.float_latent_moe import latent_moe_step
from model.float_mla import MLACache, mla_step
# the elementwise functions, the router and the SwiGLU are shared with the MLA and LatentMoE
# models (model/float_ops.py); imported from here by most callers
from model.float_ops import (L2_EPS, glu, glu_act, l2norm, moe_route, rms_unit, rmsnorm, sigmoid, silu, situ,  # noqa: F401
                                  situ_glu, swiglu)                                                    # (re-exported)
from model.params import DenseParams, KDAParams, LayerParams, MoEParams

def causal_conv_step(history, a, w):
    """One token of a causal depthwise convolution.

    history: (K-1, C) previous inputs, oldest first; a: (C,) this token; w: (C, K).
    Returns (new_history, out) with out[c] = sum_j w[c, j] * window[j, c].
    """
    window = np.concatenate([history, a[None, :]], axis=0)  # (K, C)
    out = np.einsum("ck,kc->c", w, window)
    return window[1:], out


def kda_gate(f, a_log, dt_bias, lb, head_dim):
    """Bounded log-decay g = lb * sigmoid(exp(A_log) * (f + dt_bias)), per key channel."""
    a = np.repeat(np.exp(a_log), head_dim)
    return lb * sigmoid(a * (f + dt_bias))


def delta_rule_step(S, q, k, v, g, beta):
    """KDA recurrence for one token, all heads at once.

    S: (H, dk, dv); q, k, g: (H, dk); v: (H, dv); beta: (H,).
    S' = diag(exp g) S;  u = beta (v - S'^T k);  S = S' + k u^T;  o = S^T q.
    """
    S = S * np.exp(g)[:, :, None]
    u = beta[:, None] * (v - np.einsum("hkv,hk->hv", S, k))
    S = S + k[:, :, None] * u[:, None, :]
    o = np.einsum("hkv,hk->hv", S, q)
    return S, o


def delta_rule_chunked(S, q, k, v, g, beta, chunk=16):
    """The same recurrence over T tokens, computed chunk by chunk in matrix form.

    Within a chunk (tokens 1..C, cumulative log-decay Gc_t = sum_{s<=t} g_s), the
    delta-rule writes u_t solve a unit-lower-triangular system
        u_t = beta_t (v_t - (Gamma_t k_t)^T S0 - sum_{s<t} (k_t . Gamma_{t/s} k_s) u_s)
    with Gamma_t = diag(exp Gc_t) and Gamma_{t/s} = diag(exp(Gc_t - Gc_s)); then
        o_t = (Gamma_t q_t)^T S0 + sum_{s<=t} (q_t . Gamma_{t/s} k_s) u_s
        S_C = Gamma_C S0 + sum_s Gamma_{C/s} k_s u_s^T.
    Written independently of delta_rule_step so the two check each other.
    Shapes: q, k, g (T, H, dk); v (T, H, dv); beta (T, H).  Returns (S, o (T, H, dv)).
    """
    T = q.shape[0]
    outs = []
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(T, c0 + chunk))
        qc, kc, vc, gc, bc = q[sl], k[sl], v[sl], g[sl], beta[sl]
        C = qc.shape[0]
        G = np.cumsum(gc, axis=0)                              # (C, H, dk)
        kq_dec = G[:, None] - G[None, :]                       # (t, s, H, dk): Gc_t - Gc_s
        causal = np.tril(np.ones((C, C), bool), -1)           # s < t
        incl = np.tril(np.ones((C, C), bool))                  # s <= t
        dec = np.exp(np.where((incl)[:, :, None, None], kq_dec, -np.inf))
        A_kk = np.einsum("thd,tshd,shd->hts", kc, dec, kc) * causal[None]
        A_qk = np.einsum("thd,tshd,shd->hts", qc, dec, kc) * incl[None]
        kS0 = np.einsum("thd,hdv->thv", kc * np.exp(G), S)      # (C, H, dv)
        u = np.zeros_like(vc)
        for t in range(C):  # forward substitution of the triangular system
            u[t] = bc[t][:, None] * (vc[t] - kS0[t] - np.einsum("hs,shv->hv", A_kk[:, t, :t], u[:t]))
        o = np.einsum("thd,hdv->thv", qc * np.exp(G), S) + np.einsum("hts,shv->thv", A_qk, u)
        GC = G[-1]
        S = S * np.exp(GC)[:, :, None] + np.einsum("shd,shv->hdv", kc * np.exp(GC[None] - G), u)
        outs.append(o)
    return S, np.concatenate(outs, axis=0)


@dataclass
class KDAState:
    """Everything the KDA block carries from one token to the next."""
    conv_q: np.ndarray  # (K-1, H*dk) pre-convolution q of the previous tokens
    conv_k: np.ndarray
    conv_v: np.ndarray
    S: np.ndarray       # (H, dk, dv)

    @classmethod
    def zeros(cls, cfg: Config) -> "KDAState":
        m = cfg.model
        c = m.n_heads * m.head_dim
        z = lambda: np.zeros((m.conv_kernel - 1, c))
        return cls(z(), z(), z(), np.zeros((m.n_heads, m.head_dim, m.head_dim)))


def kda_step(p: KDAParams, cfg: Config, state: KDAState, xn, trace=None):
    """One token of the KDA block on the normalised input xn (d,). Returns (state, out (d,))."""
    m = cfg.model
    H, dk = m.n_heads, m.head_dim
    t = trace if trace is not None else {}
    t["a_q"], t["a_k"], t["a_v"] = p.w_q @ xn, p.w_k @ xn, p.w_v @ xn
    conv_q, t["c_q"] = causal_conv_step(state.conv_q, t["a_q"], p.conv_q)
    conv_k, t["c_k"] = causal_conv_step(state.conv_k, t["a_k"], p.conv_k)
    conv_v, t["c_v"] = causal_conv_step(state.conv_v, t["a_v"], p.conv_v)
    t["q_s"], t["k_s"], t["v"] = silu(t["c_q"]), silu(t["c_k"]), silu(t["c_v"])
    q = l2norm(t["q_s"].reshape(H, dk))
    k = l2norm(t["k_s"].reshape(H, dk))
    t["q"], t["k"] = q.ravel(), k.ravel()
    t["fd"] = p.w_f_down @ xn
    f = p.w_f_up @ t["fd"]
    t["z"] = np.repeat(np.exp(p.a_log), dk) * (f + p.dt_bias)
    g = kda_gate(f, p.a_log, p.dt_bias, m.decay_lower_bound, dk)
    t["alpha"] = np.exp(g)
    t["b_logit"] = p.w_b @ xn
    beta = sigmoid(t["b_logit"])
    t["beta"] = beta
    S, o = delta_rule_step(state.S, q * dk ** -0.5, k, t["v"].reshape(H, dk), g.reshape(H, dk), beta)
    t["S"], t["o"] = S, o.ravel()
    on = rms_unit(o, m.norm_eps)                          # (H, dv), weight applied below
    t["on"] = on.ravel()
    t["gd"] = p.w_g_down @ xn
    t["g_logit"] = p.w_g_up @ t["gd"]
    gate = sigmoid(t["g_logit"])
    t["gate"] = gate
    t["zo"] = on.ravel() * gate                           # the integer model's W_o input
    out = p.w_o @ ((on * p.o_norm_w).ravel() * gate)
    t["kda_out"] = out
    return KDAState(conv_q, conv_k, conv_v, S), out


def moe_step(p: MoEParams, cfg: Config, hn, trace=None, select=None):
    """MoE on the normalised input hn (d,). Returns (out (d,), (idx, weights)).
    ``select`` forces the chosen experts (weights still from the scores): the accuracy
    report uses it to separate routing flips from arithmetic error."""
    m = cfg.model
    t = trace if trace is not None else {}
    t["r_logit"] = p.w_router @ hn
    scores = sigmoid(t["r_logit"])
    t["score"] = scores
    idx, w = moe_route(scores, p.router_bias, m.top_k, m.routed_scaling)
    if select is not None:
        idx = np.asarray(select)
        w = scores[idx] / (scores[idx].sum() + 1e-20) * m.routed_scaling
    t["idx"], t["w"] = idx, w
    unit = glu(m.glu)     # SwiGLU or K3's SiTU-GLU (model.glu)
    routed = sum(wi * unit(p.w_gate[e], p.w_up[e], p.w_down[e], hn) for e, wi in zip(idx, w))
    shared = sum(unit(p.sh_gate[j], p.sh_up[j], p.sh_down[j], hn) for j in range(m.n_shared))
    out = routed + shared
    t["moe_out"] = out
    return out, (idx, w)


def dense_step(p: DenseParams, cfg: Config, hn, trace=None):
    """A dense channel mixer on the normalised input hn (d,): one SwiGLU (or, model.glu = "situ",
    SiTU-GLU) of width d_ff_dense.  Traced as ``moe_out`` (the channel mixer's output, whichever
    kind). Returns out (d,)."""
    out = glu(cfg.model.glu)(p.w_gate, p.w_up, p.w_down, hn)
    if trace is not None:
        trace["moe_out"] = out
    return out


def channel_mix(p: LayerParams, cfg: Config, hn, trace=None, select=None):
    """A layer's channel mixer on its normalised input hn (d,): MoE, dense SwiGLU or
    LatentMoE (issue 15). Returns out (d,). ``select``: see moe_step (MoE only)."""
    if select is not None and p.moe is None:
        raise ValueError("channel_mix: select given for a dense layer or a LatentMoE (no plain MoE)")
    if p.dense is not None:
        return dense_step(p.dense, cfg, hn, trace)
    if p.lmoe is not None:
        return latent_moe_step(p.lmoe, hn, cfg.model.top_k, cfg.model.routed_scaling, trace, cfg.model.glu,
                               cfg.model.norm_eps)[0]
    return moe_step(p.moe, cfg, hn, trace, select)[0]


def mixer_state(p: LayerParams, cfg: Config):
    """The zero state of a layer's token mixer: a KDA state, or an MLA layer's empty cache."""
    return MLACache() if p.mla is not None else KDAState.zeros(cfg)


def token_mix(p: LayerParams, cfg: Config, state, xn, trace=None):
    """A layer's token mixer on its normalised input: (state, output (d,)).  An MLA layer's
    cache is copied before this token's latent is appended (the state passed in stays as
    it was, as a KDA state does)."""
    if p.mla is not None:
        cache = MLACache(list(state.latents))
        out = mla_step(p.mla, cache, xn, cfg.model.norm_eps, trace)
        return cache, out
    return kda_step(p.kda, cfg, state, xn, trace)


def layer_step(p: LayerParams, cfg: Config, state, x, trace=None, select=None):
    """One token through the whole layer. Returns (state, y (d,)). ``select``: see moe_step
    (a dense layer has no experts to select: it must be None)."""
    eps = cfg.model.norm_eps
    t = trace if trace is not None else {}
    t["x"] = x
    t["xn_unit"] = rms_unit(x, eps)
    state, kda_out = token_mix(p, cfg, state, t["xn_unit"] * p.attn_norm_w, t)
    h = x + kda_out
    t["h"] = h
    t["hn_unit"] = rms_unit(h, eps)
    moe_out = channel_mix(p, cfg, t["hn_unit"] * p.mlp_norm_w, t, select)
    y = h + moe_out
    t["y"] = y
    return state, y


def run_layer(p: LayerParams, cfg: Config, xs, resets=None, traces: list | None = None, selects=None):
    """Run a token sequence xs (T, d). ``resets[t]`` true zeroes the KDA state before token t.
    Appends one trace dict per token to ``traces`` if given. ``selects[t]`` forces token t's
    experts (see moe_step). Returns ys (T, d)."""
    state = mixer_state(p, cfg)
    ys = np.zeros_like(xs, dtype=np.float64)
    for t_i, x in enumerate(xs):
        if resets is not None and resets[t_i]:
            state = mixer_state(p, cfg)
        tr = {} if traces is not None else None
        state, ys[t_i] = layer_step(p, cfg, state, x, tr, None if selects is None else selects[t_i])
        if traces is not None:
            traces.append(tr)
    return ys
