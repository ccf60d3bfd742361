"""Integer KDA block: the arithmetic the KDA unit performs, bit for bit.

Per token, on the int8 normalised input xn (d,):

  a_{q,k,v} = engine(W_{q,k,v} xn)                        int8
  c         = requantize(conv(history, a))                table code (lut_in_bits)
  q, k, v   = SiLU table(c)                               qkv_bits signed (v at 2**-f_v)
  q, k      = L2 normalise per head -> qk_bits at 2**-f_q, 2**-f_k (rsqrt, per-head multiplier)
  z         = engine(W_f_up' engine(W_f_down xn) + bias)  table code;  alpha = table(z), U0.alpha_frac
  beta      = table(engine(W_b xn))                       U0.unit_frac
  S'        = rs(S * alpha, alpha_frac)                   (rs = round_shift, round half up)
  kS        = sat_state(rs(sum_i k_i S'_ij, f_k))
  u         = sat_state(rs(beta * ((v << (f_s - f_v)) - kS), unit_frac))
  S         = sat_state(S' + rs(k_i u_j, f_k))            state_bits signed at 2**-f_s
  o         = sat_{o_bits}(rs(sum_i q_i S_ij, o_shift))
  on        = RMS normalise per head -> int8
  gate      = table(engine(W_g_up engine(W_g_down xn)))   U0.unit_frac
  zo        = rs(on * gate, unit_frac)                    int8 (gate <= 1 cannot overflow)
  out       = engine(W_o' zo)                             int8
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moekda.config import Config
from moekda.formats import Formats
from moekda.numerics import round_shift, saturate
from model.int_ops import check_width, int_conv_step, int_linear, int_lut, int_normalize, int_silu
from model.qparams import QKDA


@dataclass
class IntKDAState:
    conv_q: np.ndarray   # (K-1, H*dk) int8: pre-conv a_q of the previous tokens, oldest first
    conv_k: np.ndarray
    conv_v: np.ndarray
    S: np.ndarray        # (H, dk, dv) state_bits signed

    @classmethod
    def zeros(cls, cfg: Config, batch: tuple = ()) -> "IntKDAState":
        """The state of a new sequence; ``batch``: leading axes, one state per sequence."""
        m = cfg.model
        c = m.n_heads * m.head_dim
        z = lambda: np.zeros((*batch, m.conv_kernel - 1, c), dtype=np.int64)
        return cls(z(), z(), z(), np.zeros((*batch, m.n_heads, m.head_dim, m.head_dim), dtype=np.int64))

    def copy(self) -> "IntKDAState":
        return IntKDAState(self.conv_q.copy(), self.conv_k.copy(), self.conv_v.copy(), self.S.copy())


def int_delta_rule(q: QKDA, fm: Formats, S, qn, kn, v, alpha, beta, trace=None):
    """The state update and read of all heads. S (H, dk, dv); qn, kn, alpha (H, dk);
    v (H, dv) qkv_bits at 2**-f_v; beta (H,). Returns (S, o16 (H, dv))."""
    sb = fm.state_bits
    S1 = round_shift(S * alpha[..., None], fm.alpha_frac)              # |alpha| < 1: no overflow
    kS = saturate(round_shift(np.einsum("...hk,...hkv->...hv", kn, S1), q.f_k), sb)
    diff = (v << (q.f_s - q.f_v)) - kS                                  # state_bits + 1 bits
    u = saturate(round_shift(beta[..., None] * diff, fm.unit_frac), sb)
    S2 = saturate(S1 + round_shift(kn[..., None] * u[..., None, :], q.f_k), sb)
    o_acc = np.einsum("...hk,...hkv->...hv", qn, S2)
    o16 = saturate(round_shift(o_acc, q.o_shift), fm.o_bits)
    if trace is not None:
        trace.update(S_decayed=S1, kS=kS, u=u, o_acc=o_acc, o16=o16)
    return S2, o16


def int_kda_step(q: QKDA, cfg: Config, fm: Formats, state: IntKDAState, xn, trace=None):
    """One token through the KDA block. xn: (d,) int8 (or (..., d): a batch of sequences, the
    state batched alike). Returns (new state, out (d,) int8)."""
    m = cfg.model
    H, dk = m.n_heads, m.head_dim
    xn = check_width(np.asarray(xn, dtype=np.int64), fm.act_bits, "kda input")
    heads = (*xn.shape[:-1], H, dk)              # a token's channels as heads
    flat = (*xn.shape[:-1], H * dk)
    t = trace if trace is not None else {}
    t["a_q"] = int_linear(q.q_proj, xn, fm, "q_proj")
    t["a_k"] = int_linear(q.k_proj, xn, fm, "k_proj")
    t["a_v"] = int_linear(q.v_proj, xn, fm, "v_proj")
    conv_q, t["c_q"] = int_conv_step(q.conv_q, state.conv_q, t["a_q"])
    conv_k, t["c_k"] = int_conv_step(q.conv_k, state.conv_k, t["a_k"])
    conv_v, t["c_v"] = int_conv_step(q.conv_v, state.conv_v, t["a_v"])
    t["q_s"], t["k_s"], t["v"] = (int_silu(q.silu_q, t["c_q"], fm), int_silu(q.silu_k, t["c_k"], fm),
                                  int_silu(q.silu_v, t["c_v"], fm))
    qn = int_normalize(t["q_s"].reshape(heads), q.q_norm, fm, fm.qk_bits)
    kn = int_normalize(t["k_s"].reshape(heads), q.k_norm, fm, fm.qk_bits)
    t["q"], t["k"] = qn.reshape(flat), kn.reshape(flat)
    t["fd"] = int_linear(q.f_down, xn, fm, "f_down")
    t["z"] = int_linear(q.f_up, t["fd"], fm, "f_up")
    alpha = int_lut(q.alpha, t["z"]).reshape(heads)
    t["alpha"] = alpha.reshape(flat)
    t["b_logit"] = int_linear(q.b_proj, xn, fm, "b_proj")
    beta = int_lut(q.beta, t["b_logit"])
    t["beta"] = beta
    S, o16 = int_delta_rule(q, fm, state.S, qn, kn, t["v"].reshape(heads), alpha, beta, t)
    t["S"] = S
    on = int_normalize(o16, q.o_norm, fm, fm.act_bits)
    t["on"] = on.reshape(flat)
    t["gd"] = int_linear(q.g_down, xn, fm, "g_down")
    t["g_logit"] = int_linear(q.g_up, t["gd"], fm, "g_up")
    t["gate"] = int_lut(q.gate, t["g_logit"])
    t["zo"] = round_shift(t["on"] * t["gate"], fm.unit_frac)
    out = int_linear(q.o_proj, t["zo"], fm, "o_proj")
    t["kda_out"] = out
    return IntKDAState(conv_q, conv_k, conv_v, S), out
