"""Quantiser: float layer parameters + calibration activations -> integer parameters (QLayer).

Scheme (the why is in docs/numerics.md):
* weights: symmetric int8, one scale per matrix (per expert matrix in the MoE);
* activations: symmetric int8, one scale per tensor, = calibrated max|x| / 127;
* RMSNorm weights are folded into the next projection's columns (W diag(w)),
  the output-norm weight into W_o, exp(A_log) into the rows of W_f_up and
  A*dt_bias into an accumulator bias: exact in real arithmetic, and it removes a
  multiply (and a rounding) per element from the hardware;
* k, q, v and the state get power-of-two scales, so the delta rule needs only shifts;
* each table is computed from its float function, its input code scale and its
  output format, and stored as integers.
Calibration runs the float model on sample sequences (never the evaluation ones)
with the model's own channel profile (``model_seed``, see ``calibration_sequences``).
"""
from __future__ import annotations

import math

import numpy as np

from moekda.config import Config
from moekda import mx
from moekda.formats import Formats, formats_for
from moekda.numerics import quantize_multiplier, shared_shift_multipliers
from moekda.tables import (ALPHA_Z_MID, SITU_OUT_FRAC, cap_clip, cap_in_scale, fixed_in_scale, fixed_table,
                           silu_sigmoid_in_bits, situ_in_bits, situ_in_scale, table_in_scale)
from model import float_layer as fl
from model.params import (LayerParams, ModelParams, dense_chunks, random_inputs, random_model_params,
                               random_params, random_tokens)
from model.qparams import (QAttnRes, QDense, QExperts, QHead, QKDA, QLayer, QLinear, QLut, QMLA, QModel, QMoE, QNorm,
                                QResidual, QSilu)

# The sigmoid-shaped tables (beta, gates, router score, decay alpha) take their input codes in
# the config's fixed format (moekda/tables.py): the logits are requantised to it, and the
# tables are the config's, not the model's.
# headroom of the 16-bit residual stream over the calibrated max|x|: unseen tokens must not saturate
RESID_HEADROOM = 1.5
# branch outputs (KDA out, expert out, MoE out) are added into the residual: a saturated
# rare token costs far more than the coarser step, and their tails are long
BRANCH_HEADROOM = 1.5
# SiLU is linear for large inputs, so a saturated code is a large error: its code
# range gets headroom over the calibrated max (unseen tokens reach past it)
SILU_HEADROOM = 1.25


def _qmax(bits: int) -> int:
    return (1 << (bits - 1)) - 1


def quant_weight(w, fm: Formats):
    """Symmetric per-tensor int8: (integer array, scale)."""
    amax = float(np.max(np.abs(w)))
    scale = amax / _qmax(fm.weight_bits) if amax > 0 else 1.0
    return np.clip(np.floor(np.abs(w) / scale + 0.5) * np.sign(w), -_qmax(fm.weight_bits),
                   _qmax(fm.weight_bits)).astype(np.int64), scale


def act_scale(values, bits: int = 8, clip: float | None = None, headroom: float | None = None,
              mse: bool = True) -> float:
    """Symmetric scale of an activation tensor: the clipping level that minimises the
    quantisation MSE over the calibration values (a grid from 25 % to 100 % of
    max|x|; clipping the rare tail buys resolution for the bulk), or, with
    ``headroom``, max|x| * headroom (the 16-bit residual stream has bits to spare
    and must not saturate on unseen tokens).  ``mse=False``: plain max|x|, for the
    branch outputs added into the residual, whose rare large values matter."""
    v = np.abs(np.asarray(values, dtype=np.float64)).ravel()
    amax = float(v.max()) if v.size else 0.0
    if clip is not None:
        amax = min(amax, clip)
    amax = max(amax, 1e-6)
    qm = _qmax(bits)
    if headroom is not None:
        return amax * headroom / qm
    if bits > 8 or not mse:  # wide tensors: resolution to spare, clipping would only add error
        return amax / qm
    if v.size > 200_000:  # a fixed subsample keeps calibration fast and deterministic
        v = v[np.linspace(0, v.size - 1, 200_000).astype(np.int64)]
    best, best_err = amax / qm, np.inf
    for r in np.linspace(0.25, 1.0, 31):
        s = amax * r / qm
        err = np.mean((np.minimum(np.floor(v / s + 0.5), qm) * s - v) ** 2)
        if err < best_err:
            best, best_err = s, err
    return best


def pow2_frac_bits(amax: float, bits: int) -> int:
    """Largest f with amax * 2**f <= 2**(bits-1) - 1: the power-of-two format of a tensor."""
    return int(math.floor(math.log2(_qmax(bits) / max(amax, 1e-12))))


def _mult(scale: float, fm: Formats) -> tuple[int, int]:
    return quantize_multiplier(scale, fm.mult_bits)


def _linear(w, s_in: float, s_out: float, fm: Formats, out_bits: int, bias_real=None) -> tuple[QLinear, float]:
    wq, sw = quant_weight(w, fm)
    m, s = _mult(sw * s_in / s_out, fm)
    bias = None
    if bias_real is not None:
        bias = np.floor(np.asarray(bias_real) / (sw * s_in) + 0.5).astype(np.int64)
    return QLinear(w=wq, m=m, s=s, out_bits=out_bits, bias=bias), sw


def _residual(s_a: float, s_b: float, s_out: float, fm: Formats, branch_only: bool) -> QResidual:
    """The residual add a + b into s_out, or (``branch_only``, Attention Residuals) the branch
    b alone requantised into s_out: m_a = 0, (m_b, s) normalised for b."""
    if branch_only:
        return QResidual(0, *_mult(s_b / s_out, fm))
    (ma, mb), s = shared_shift_multipliers([s_a / s_out, s_b / s_out], fm.mult_bits)
    return QResidual(ma, mb, s)


def _norm(eps_int: float, k_real: float, fm: Formats) -> QNorm:
    m, s = _mult(k_real, fm)
    return QNorm(eps_int=int(round(eps_int)), m=m, s=s)


def collect(params: LayerParams, cfg: Config, seqs) -> dict[str, np.ndarray]:
    """Float traces of every calibration sequence, stacked per tensor name."""
    traces = []
    for xs in seqs:
        fl.run_layer(params, cfg, xs, traces=traces)
    keys = [k for k in traces[0] if k not in ("idx", "w")]
    return {k: np.stack([t[k] for t in traces]) for k in keys}


def calibration_sequences(cfg: Config, n_seq: int = 4, n_tokens: int = 256, seed: int = 1000,
                          model_seed: int = 0):
    """``n_seq`` calibration inputs (token seeds ``seed``..``seed + n_seq - 1``, never an
    evaluation's) with the channel profile of the model ``model_seed`` (``random_inputs``):
    the seed the model's parameters were drawn from, so calibration sees the outlier
    channels the evaluation and the test vectors feed that model.  Calibrating model P
    on another profile leaves its outlier channels outside the calibrated ranges, and
    they saturate.  A checkpoint has no seed: its callers pick the profile (the
    commands use --param-seed, default 0)."""
    return [random_inputs(cfg, n_tokens, seed=seed + i, model_seed=model_seed) for i in range(n_seq)]


def _experts_dense(w_gate, w_up, w_down, hn, glu: str = "swiglu"):
    """Every expert on every calibration token: (gate, up, act, hid, out) arrays (n, T, .);
    ``glu`` the gated unit (model.glu).  ``up`` is W_up hn before SiTU-GLU's cap (the up
    code's range), ``act`` the gate's activation."""
    gate = np.einsum("efd,td->etf", w_gate, hn)
    up = np.einsum("efd,td->etf", w_up, hn)
    act = fl.situ(gate) if glu == "situ" else fl.silu(gate)
    hid = fl.glu_act(glu, gate, up)
    out = np.einsum("edf,etf->etd", w_down, hid)
    return gate, up, act, hid, out


def quantize_layer(params: LayerParams, cfg: Config, seqs=None, model_seed: int | None = None,
                   x_scale: float | None = None, traces: dict | None = None,
                   depth_scale: float | None = None) -> QLayer:
    """Integer parameters calibrated on ``seqs`` (list of (T, d) float inputs), by default
    on ``calibration_sequences(cfg, model_seed=model_seed)``: pass the seed ``params``
    were drawn from (``random_params(cfg, seed)``), or use ``quantize_random_layer``.
    ``model_seed`` omitted means profile 0 (right for seed 0 only).  ``seqs`` and
    ``model_seed`` together are an error: the sequences already carry their profile.
    ``x_scale``: the input's scale is given, not calibrated (a layer of a stack takes the
    previous layer's output, or the embedding, as it is).  A dense layer (``params.dense``)
    gets a QDense in place of the QMoE.  ``traces``: the float traces of the layer's tensors,
    stacked per name, in place of running the layer on ``seqs`` (a layer inside Attention
    Residuals: its inputs come from the stack).  ``depth_scale``: Attention Residuals' s_v,
    the scale of both of the layer's inputs (x and h); its residual adds are not used as
    adds: each is its branch's requantiser to s_v (m_a = 0, m_b / 2**s = the branch's scale
    / s_v), QAttnRes's out_m, out_s, which is what the chip's residual add computes with
    those values (hw/image/param_map.py attn_res_residuals)."""
    fm = formats_for(cfg)
    m = cfg.model
    d = m.d_model
    if seqs is not None and model_seed is not None:
        raise ValueError("quantize_layer: give seqs or model_seed, not both")
    if seqs is None and traces is None:
        seqs = calibration_sequences(cfg, model_seed=model_seed or 0)
    tr = collect(params, cfg, seqs) if traces is None else traces
    if depth_scale is not None:
        x_scale = depth_scale
    sc: dict[str, float] = {}

    sc["x"] = act_scale(tr["x"], fm.resid_bits, headroom=RESID_HEADROOM) if x_scale is None else float(x_scale)
    sc["xn_unit"] = act_scale(tr["xn_unit"])
    # ss of int8 x is sum(x_int^2) = d * mean(x^2) / s_x^2, so eps moves into integer units likewise
    attn_norm = _norm(m.norm_eps * d / sc["x"] ** 2, math.sqrt(d) / sc["xn_unit"], fm)
    if params.mla is not None:
        qkda, qmla, mix_out = None, _quantize_mla(params, cfg, fm, tr, sc), "mla_out"
    else:
        qkda, qmla, mix_out = _quantize_kda(params, cfg, fm, tr, sc), None, "kda_out"

    sc["h"] = act_scale(tr["h"], fm.resid_bits, headroom=RESID_HEADROOM) if depth_scale is None else depth_scale
    res1 = _residual(sc["x"], sc[mix_out], sc["h"], fm, depth_scale is not None)
    sc["hn_unit"] = act_scale(tr["hn_unit"])
    mlp_norm = _norm(m.norm_eps * d / sc["h"] ** 2, math.sqrt(d) / sc["hn_unit"], fm)

    if params.dense is not None:
        qmoe, (qdense, sc_moe) = None, _quantize_dense(params, cfg, fm, tr, sc["hn_unit"])
    elif params.lmoe is not None:
        (qmoe, sc_moe), qdense = _quantize_latent_moe(params, cfg, fm, tr, sc["hn_unit"]), None
    else:
        (qmoe, sc_moe), qdense = _quantize_moe(params, cfg, fm, tr, sc["hn_unit"], sc["h"]), None
    sc.update(sc_moe)
    sc["y"] = act_scale(tr["y"], fm.resid_bits, headroom=RESID_HEADROOM) if depth_scale is None else depth_scale
    res2 = _residual(sc["h"], sc["moe_out"], sc["y"], fm, depth_scale is not None)
    return QLayer(attn_norm=attn_norm, kda=qkda, res1=res1, mlp_norm=mlp_norm, moe=qmoe, res2=res2, scales=sc,
                  dense=qdense, mla=qmla)


def _quantize_kda(params: LayerParams, cfg: Config, fm: Formats, tr, sc: dict) -> QKDA:
    """The KDA token mixer (section 4 of docs/numerics.md); its scales into ``sc``."""
    m = cfg.model
    H, dk = m.n_heads, m.head_dim
    A8, LB = fm.act_bits, fm.lut_in_bits
    p = params.kda
    wn = params.attn_norm_w[None, :]

    kda = {}
    for n in ("q", "k", "v"):
        sc[f"a_{n}"] = act_scale(tr[f"a_{n}"])
        kda[f"{n}_proj"], _ = _linear(getattr(p, f"w_{n}") * wn, sc["xn_unit"], sc[f"a_{n}"], fm, A8)
        sc[f"c_{n}"] = act_scale(tr[f"c_{n}"], LB)
        kda[f"conv_{n}"], _ = _linear(getattr(p, f"conv_{n}"), sc[f"a_{n}"], sc[f"c_{n}"], fm, LB)
    # SiLU = c * sigmoid (QSilu), c * sigmoid at the code's scale times 2**-unit_frac: q, k
    # keep that scale (qkv_bits hold every product; L2-normalised next), v is requantised to
    # a power of two, at most the state's
    QB, UF = fm.qkv_bits, fm.unit_frac
    s_amax = max(float(np.max(np.abs(tr["S"]))), 2.0 * float(np.max(np.abs(tr["v"]))))
    f_s = pow2_frac_bits(s_amax, fm.state_bits)
    f_v = min(pow2_frac_bits(float(np.max(np.abs(tr["v"]))), QB), f_s)
    sc["q_s"], sc["k_s"], sc["v"] = sc["c_q"] * 2.0 ** -UF, sc["c_k"] * 2.0 ** -UF, 2.0 ** -f_v
    for n, key in (("q", "q_s"), ("k", "k_s"), ("v", "v")):
        kda[f"silu_{n}"] = _silu(sc[f"c_{n}"], sc[key], QB, fm)
    f_q = pow2_frac_bits(float(np.max(np.abs(tr["q"]))), fm.qk_bits)
    f_k = pow2_frac_bits(float(np.max(np.abs(tr["k"]))), fm.qk_bits)
    sc["q"], sc["k"] = 2.0 ** -f_q, 2.0 ** -f_k
    kda["q_norm"] = _norm(fl.L2_EPS / sc["q_s"] ** 2, 2.0 ** f_q, fm)
    kda["k_norm"] = _norm(fl.L2_EPS / sc["k_s"] ** 2, 2.0 ** f_k, fm)

    # decay: z = A (W_f_up fd + dt_bias); code c = (z - ALPHA_Z_MID) / s_z, the config's format
    sc["fd"] = act_scale(tr["fd"])
    kda["f_down"], _ = _linear(p.w_f_down * wn, sc["xn_unit"], sc["fd"], fm, A8)
    a_rows = np.repeat(np.exp(p.a_log), dk)
    sc["z"] = table_in_scale(cfg)
    kda["f_up"], _ = _linear(p.w_f_up * a_rows[:, None], sc["fd"], sc["z"], fm, LB,
                             bias_real=a_rows * p.dt_bias - ALPHA_Z_MID)
    kda["alpha"] = QLut(fixed_table(cfg, "kda.alpha"), LB)
    sc["alpha"] = 2.0 ** -fm.alpha_frac

    sc["b_logit"] = table_in_scale(cfg)
    kda["b_proj"], _ = _linear(p.w_b * wn, sc["xn_unit"], sc["b_logit"], fm, LB)
    kda["beta"] = QLut(fixed_table(cfg, "kda.beta"), LB)
    sc["beta"] = sc["gate"] = 2.0 ** -fm.unit_frac

    # state: the largest of S, S'^T k and beta*(v - S'^T k) must fit state_bits (f_s above)
    sc["S"] = 2.0 ** -f_s
    # o = S^T q_unit at 2**-(f_q + f_s); the float o carries d_k**-0.5 on top
    o_unit_amax = float(np.max(np.abs(tr["o"]))) * math.sqrt(dk)
    o_frac = pow2_frac_bits(o_unit_amax, fm.o_bits)
    o_shift = max(0, f_q + f_s - o_frac)
    s_o16 = 2.0 ** -(f_q + f_s - o_shift) / math.sqrt(dk)   # in units of the float o
    sc["o16"] = s_o16
    sc["on"] = act_scale(tr["on"])
    kda["o_norm"] = _norm(m.norm_eps * dk / s_o16 ** 2, math.sqrt(dk) / sc["on"], fm)
    sc["zo"] = sc["on"]

    sc["gd"] = act_scale(tr["gd"])
    kda["g_down"], _ = _linear(p.w_g_down * wn, sc["xn_unit"], sc["gd"], fm, A8)
    sc["g_logit"] = table_in_scale(cfg)
    kda["g_up"], _ = _linear(p.w_g_up, sc["gd"], sc["g_logit"], fm, LB)
    kda["gate"] = QLut(fixed_table(cfg, "kda.gate"), LB)
    sc["kda_out"] = act_scale(tr["kda_out"], headroom=BRANCH_HEADROOM)
    kda["o_proj"], _ = _linear(p.w_o * np.tile(p.o_norm_w, H)[None, :], sc["on"], sc["kda_out"], fm, A8)
    qkda = QKDA(**kda, f_q=f_q, f_k=f_k, f_v=f_v, f_s=f_s, o_shift=o_shift)
    return qkda


def _quantize_mla(params: LayerParams, cfg: Config, fm: Formats, tr, sc: dict) -> QMLA:
    """The Gated MLA token mixer (model/int_mla.py; docs/numerics.md section 9); its
    scales into ``sc``.  The cache holds c_unit: the latent norm's weight w is folded into
    W_uk (with 1/sqrt(dh), on the query side) and W_uv, as qa . (c_unit w) = (qa w) . c_unit."""
    p, eps = params.mla, cfg.model.norm_eps
    H, dh, r = p.heads, p.head_dim, p.kv_rank
    A8, LB = fm.act_bits, fm.lut_in_bits
    wn = params.attn_norm_w[None, :]
    w_kv = p.kv_norm_w
    sc["mla_a"] = act_scale(tr["mla_a"], fm.resid_bits, headroom=RESID_HEADROOM)
    dkv, _ = _linear(p.w_dkv * wn, sc["xn_unit"], sc["mla_a"], fm, fm.resid_bits)
    sc["mla_c_unit"] = act_scale(tr["mla_c_unit"])
    kv_norm = _norm(eps * r / sc["mla_a"] ** 2, math.sqrt(r) / sc["mla_c_unit"], fm)
    sc["mla_q"] = act_scale(tr["mla_q"])
    q_proj, _ = _linear(p.w_q * wn, sc["xn_unit"], sc["mla_q"], fm, A8)
    sc["mla_qa"] = act_scale(tr["mla_qa"] * np.tile(w_kv, H))          # the query side of c_unit
    uk_w = np.transpose(p.w_uk, (0, 2, 1)) * w_kv[None, :, None] / math.sqrt(dh)   # (H, r, dh)
    uk, _ = _linear(uk_w, sc["mla_q"], sc["mla_qa"], fm, A8)
    u_m, u_s = _mult(sc["mla_qa"] * sc["mla_c_unit"] * math.log2(math.e) * (1 << fm.mla_exp_frac), fm)
    sc["mla_ctx"] = sc["mla_c_unit"]                                   # a weighted mean of c_unit
    sc["mla_o"] = act_scale(tr["mla_o"])
    uv, _ = _linear(p.w_uv * w_kv[None, None, :], sc["mla_ctx"], sc["mla_o"], fm, A8)
    sc["mla_g_logit"] = table_in_scale(cfg)
    g_proj, _ = _linear(p.w_g * wn, sc["xn_unit"], sc["mla_g_logit"], fm, LB)
    gate = QLut(fixed_table(cfg, "mla.gate"), LB)
    sc["mla_gate"] = 2.0 ** -fm.unit_frac
    sc["mla_zo"] = sc["mla_o"]
    sc["mla_out"] = act_scale(tr["mla_out"], headroom=BRANCH_HEADROOM)
    o_proj, _ = _linear(p.w_o, sc["mla_zo"], sc["mla_out"], fm, A8)
    return QMLA(q_proj=q_proj, uk=uk, dkv=dkv, kv_norm=kv_norm, u_m=u_m, u_s=u_s, uv=uv, g_proj=g_proj, gate=gate,
                o_proj=o_proj)


def _quantize_moe(params: LayerParams, cfg: Config, fm: Formats, tr, s_hn: float, s_h: float = 1.0):
    """The MoE (QMoE); ``s_h``: the scale of h, read by the MXFP8 input's norm (issue 48)."""
    p = params.moe
    wn = params.mlp_norm_w[None, :]
    sc = {}
    router, score, bias = _router(p.w_router * wn, p.router_bias, s_hn, cfg, sc)

    # every expert on every calibration token: rarely chosen experts get scales too
    hn = tr["hn_unit"] * params.mlp_norm_w[None, :]
    glu = cfg.model.glu
    routed = _experts_dense(p.w_gate, p.w_up, p.w_down, hn, glu)
    shared = _experts_dense(p.sh_gate, p.sh_up, p.sh_down, hn, glu)
    s_gate, s_act, s_e, silu = _expert_scales(fm, [routed, shared], glu)
    sc.update(e_gate=s_gate, e_act=s_act, e_out=s_e)
    f = cfg.formats
    bank = lambda wg, wu, wd, dense, s_in, wfmt: _expert_bank(wg, wu, wd, dense, wn, s_in, s_gate, s_act, s_e, fm,
                                                               wfmt, glu)
    # MXFP8 routed inputs (issue 48): h normalised to mx_in_bits at its own scale, then E4M3 blocks
    mx_norm, s_rin = None, s_hn
    if f.expert_inputs == "mxfp8_e4m3":
        sc["mx_src"] = s_rin = act_scale(tr["hn_unit"], fm.mx_in_bits, headroom=RESID_HEADROOM)
        mx_norm = _norm(cfg.model.norm_eps * cfg.model.d_model / s_h ** 2,
                        math.sqrt(cfg.model.d_model) / s_rin, fm)

    q = QMoE(router=router, score=score, bias=bias, silu=silu,
             routed=bank(p.w_gate, p.w_up, p.w_down, routed, s_rin, f.routed_expert_weights),
             shared=bank(p.sh_gate, p.sh_up, p.sh_down, shared, s_hn, f.shared_expert_weights),
             mx_norm=mx_norm, **_combine(cfg, fm, tr, s_e, sc))
    return q, sc


def _combine(cfg: Config, fm: Formats, tr, s_e: float, sc: dict) -> dict:
    """The MoE's combine (plain or latent): the routed scaling as U.rs_frac and the
    multiplier from the experts' weighted sum to the mixer's output scale (into ``sc``)."""
    sc["moe_out"] = act_scale(tr["moe_out"], fm.resid_bits, headroom=BRANCH_HEADROOM)
    comb_m, comb_s = _mult(s_e * 2.0 ** -fm.wn_frac / sc["moe_out"], fm)
    return {"rs": int(round(cfg.model.routed_scaling * (1 << fm.rs_frac))), "comb_m": comb_m, "comb_s": comb_s}


def _quantize_latent_moe(params: LayerParams, cfg: Config, fm: Formats, tr, s_hn: float):
    """LatentMoE (QMoE with lat_down, lat_up): the router and the shared experts as in
    ``_quantize_moe``; the routed experts on the int8 latent z (its own MSE scale), with the
    shared experts' SiLU table and output scale (one expert engine); their weighted sum
    back to int8 (max|x|: a rare large token must not saturate before the up-projection),
    whose output joins the combine at the experts' output scale."""
    p = params.lmoe
    A8 = fm.act_bits
    wn = params.mlp_norm_w[None, :]
    sc = {}
    router, score, bias = _router(p.w_router * wn, p.router_bias, s_hn, cfg, sc)

    f = cfg.formats
    if f.expert_inputs == "mxfp8_e4m3":      # the latent at mx_in_bits, then MXFP8 blocks (issue 48)
        sc["lat_z"] = sc["mx_src"] = act_scale(tr["lat_z"], fm.mx_in_bits, headroom=RESID_HEADROOM)
        lat_down, _ = _linear(p.w_lat_down * wn, s_hn, sc["lat_z"], fm, fm.mx_in_bits)
    else:
        sc["lat_z"] = act_scale(tr["lat_z"])
        lat_down, _ = _linear(p.w_lat_down * wn, s_hn, sc["lat_z"], fm, A8)
    hn = tr["hn_unit"] * params.mlp_norm_w[None, :]
    z = tr["lat_z"].reshape(-1, p.w_lat_down.shape[0])
    glu = cfg.model.glu
    routed = _experts_dense(p.w_gate, p.w_up, p.w_down, z, glu)
    shared = _experts_dense(p.sh_gate, p.sh_up, p.sh_down, hn, glu)
    s_gate, s_act, s_e, silu = _expert_scales(fm, [routed, shared], glu)
    sc.update(e_gate=s_gate, e_act=s_act, e_out=s_e)
    ones = np.ones((1, z.shape[1]))
    q_routed = _expert_bank(p.w_gate, p.w_up, p.w_down, routed, ones, sc["lat_z"], s_gate, s_act, s_e, fm,
                            f.routed_expert_weights, glu)
    q_shared = _expert_bank(p.sh_gate, p.sh_up, p.sh_down, shared, wn, s_hn, s_gate, s_act, s_e, fm,
                            f.shared_expert_weights, glu)

    lat_norm = None
    if p.exit_norm_w is None:
        sc["lat_routed"] = act_scale(tr["lat_routed"], mse=False)
        lat_m, lat_s = _mult(s_e * 2.0 ** -fm.wn_frac / sc["lat_routed"], fm)
        lat_up, _ = _linear(p.w_lat_up, sc["lat_routed"], s_e, fm, fm.expert_out_bits)
    else:
        # K3's exit norm: the sum to 16 bits (max|x| with the residual headroom), its RMSNorm
        # to int8 at the unit vector's MSE scale; the weight folded into lat_up's columns as
        # every norm weight is into the next projection.  eps moves into sum-of-squares units
        # as the layers' norms' does
        l = p.w_lat_down.shape[0]
        sc["lat_pre"] = act_scale(tr["lat_pre"], fm.resid_bits, headroom=RESID_HEADROOM)
        lat_m, lat_s = _mult(s_e * 2.0 ** -fm.wn_frac / sc["lat_pre"], fm)
        sc["lat_routed"] = act_scale(tr["lat_routed"])          # the unit-RMS sum (float trace)
        lat_norm = _norm(cfg.model.norm_eps * l / sc["lat_pre"] ** 2, math.sqrt(l) / sc["lat_routed"], fm)
        lat_up, _ = _linear(p.w_lat_up * p.exit_norm_w[None, :], sc["lat_routed"], s_e, fm, fm.expert_out_bits)
    q = QMoE(router=router, score=score, bias=bias, silu=silu, routed=q_routed, shared=q_shared,
             lat_down=lat_down, lat_up=lat_up, lat_m=lat_m, lat_s=lat_s, lat_norm=lat_norm,
             **_combine(cfg, fm, tr, s_e, sc))
    return q, sc


def _router(w_router, router_bias, s_hn: float, cfg: Config, sc: dict):
    """The router (its logits to the config's sigmoid table code), the score table
    (U0.score_frac, moekda/tables.py) and the selection bias in score units
    (router_bias_bits signed); their scales into ``sc``."""
    fm = formats_for(cfg)
    LB = fm.lut_in_bits
    sc["r_logit"] = table_in_scale(cfg)
    router, _ = _linear(w_router, s_hn, sc["r_logit"], fm, LB)
    score = QLut(fixed_table(cfg, "moe.score"), LB)
    sc["score"] = 2.0 ** -fm.score_frac
    bias = np.floor(router_bias * (1 << fm.score_frac) + 0.5).astype(np.int64)
    if np.any(np.abs(bias) >= 1 << (fm.router_bias_bits - 1)):
        raise ValueError(f"router bias beyond +-{2 ** (fm.router_bias_bits - 1 - fm.score_frac)}: "
                         "does not fit router_bias_bits")
    return router, score, bias


def _expert_scales(fm: Formats, banks, glu: str = "swiglu"):
    """The scales common to a set of expert banks (SiLU input and output, expert output) and
    their one SiLU table, from every expert's calibration activations (``_experts_dense``).
    SiTU-GLU (``glu = "situ"``): the gate code and SiTU's output have the config's fixed
    scales (moekda/tables.py: SiTU is bounded, so its table needs no model scale) and there is
    no QSilu (None)."""
    A8, LB = fm.act_bits, fm.lut_in_bits
    both = [np.concatenate([b[i].reshape(-1) for b in banks]) for i in range(5)]
    if glu == "situ":
        s_e = act_scale(both[4], fm.expert_out_bits, headroom=BRANCH_HEADROOM)
        return situ_in_scale(fm), 2.0 ** -SITU_OUT_FRAC, s_e, None
    s_gate = act_scale(both[0], LB, headroom=SILU_HEADROOM)
    # SiLU (QSilu) at the gate code's own scale: |silu(x)| <= |x| for x > 0 and < 0.28 below,
    # so every value fits the code's width and nothing saturates on the tokens the headroom
    # is for; the shift by unit_frac takes c * sigmoid back to that scale
    s_act = s_gate
    s_e = act_scale(both[4], fm.expert_out_bits, headroom=BRANCH_HEADROOM)
    silu = _silu(s_gate, s_act, A8, fm)
    return s_gate, s_act, s_e, silu


def _silu(s_code: float, s_out: float, out_bits: int, fm: Formats) -> QSilu:
    """SiLU from a code at scale ``s_code`` to ``out_bits`` at ``s_out`` (QSilu): the
    requantisation to the sigmoid's fixed input format (moekda/tables.py) and the product's."""
    t_m, t_s = _mult(s_code / fixed_in_scale(silu_sigmoid_in_bits(fm)), fm)
    m, s = _mult(s_code * 2.0 ** -fm.unit_frac / s_out, fm)
    return QSilu(t_m=t_m, t_s=t_s, m=m, s=s, out_bits=out_bits)


def _expert_bank(wg, wu, wd, dense, wn, s_hn, s_gate, s_act, s_e, fm: Formats, wfmt: str = "int8",
                 glu: str = "swiglu") -> QExperts:
    """A bank of SwiGLU experts (n, d_ff, d) with per-expert (m, s); ``dense``: their
    calibration activations, ``wn`` the RMSNorm weight folded into gate and up.  ``wfmt``
    "mxfp4" (issue 48): every matrix in MXFP4 (``quant_weight_mxfp4``), its (m, s) carrying
    the matrix's floor scale.  SiTU-GLU (``glu = "situ"``): the gate code in SITU's input
    format, and per expert the up code's requantisation to CAP's input (cap_t_m, cap_t_s); the
    up code's range is clipped at CAP's (+-64, where 25 tanh(u/25) is within 0.4 of its bound)."""
    A8, LB = fm.act_bits, fm.lut_in_bits
    situ = glu == "situ"
    names = ("gate_w", "gate_m", "gate_s", "up_w", "up_m", "up_s", "down_w", "down_m", "down_s")
    if wfmt == "mxfp4":
        names += ("gate_sb", "gate_sf", "up_sb", "up_sf", "down_sb", "down_sf")
    if situ:
        names += ("cap_t_m", "cap_t_s")
    cols = {k: [] for k in names}
    for e in range(wg.shape[0]):
        # this expert's own range, never saturating (SiTU-GLU: up to CAP's input range)
        s_up = act_scale(dense[1][e], mse=False, clip=cap_clip() if situ else None)
        s_prod = s_act * s_up                           # the hidden at exponent 0 (int_expert)
        if situ:
            t_m, t_s = _mult(s_up / cap_in_scale(fm), fm)
            cols["cap_t_m"].append(t_m)
            cols["cap_t_s"].append(t_s)
        for name, w, s_in, s_out, bits in (("gate", wg[e] * wn, s_hn, s_gate, situ_in_bits(fm) if situ else LB),
                                           ("up", wu[e] * wn, s_hn, s_up, A8),
                                           ("down", wd[e], s_prod, s_e, A8)):
            if wfmt == "mxfp4":
                wq, sb, sf, sw = quant_weight_mxfp4(w, fm)
                m, s = _mult(sw * s_in / s_out, fm)
                cols[f"{name}_sb"].append(sb)
                cols[f"{name}_sf"].append(sf)
            else:
                lin, _ = _linear(w, s_in, s_out, fm, bits)
                wq, m, s = lin.w, lin.m, lin.s
            cols[f"{name}_w"].append(wq)
            cols[f"{name}_m"].append(m)
            cols[f"{name}_s"].append(s)
    if wg.shape[0] == 0:
        return QExperts(**{k: np.zeros((0,), np.int64) for k in cols})
    return QExperts(**{k: np.array(v, dtype=np.int64) for k, v in cols.items()})


def quant_weight_mxfp4(w, fm: Formats):
    """MXFP4 of a matrix (out, in) in blocks of fm.mx_block along the input (moekda/mx.py: OCP
    floor rule, RNE, saturation at 6), every block's scale byte at least the matrix's floor
    max(byte) - fm.mx_scale_range (a block below it is quantised at the floor's scale: the
    engine's shifts stay within mx_scale_range).  Returns (E2M1 half units, scale bytes
    (out, blocks), floor byte, the real value of one half unit at the floor: 2^-1 2^(floor-127))."""
    sb0 = mx.block_scale_bytes(w, "e2m1", fm.mx_block)
    floor = max(int(sb0.max()) - fm.mx_scale_range, 0)
    codes, sb = mx.mx_quantize(w, "e2m1", fm.mx_block, min_byte=floor)
    return mx.e2m1_half_units(codes), sb, floor, 0.5 * 2.0 ** (floor - mx.E8M0_BIAS)


def _quantize_dense(params: LayerParams, cfg: Config, fm: Formats, tr, s_hn: float):
    """A dense mixer as d_ff-wide chunks (QDense): each chunk quantised as a shared expert,
    with the MoE's scale rules (common SiLU table and chunk-output scale, own up scale)."""
    wn = params.mlp_norm_w[None, :]
    g, u, dn = dense_chunks(params.dense, cfg)
    hn = tr["hn_unit"] * wn
    glu = cfg.model.glu
    acts = _experts_dense(g, u, dn, hn, glu)
    s_gate, s_act, s_e, silu = _expert_scales(fm, [acts], glu)
    sc = {"e_gate": s_gate, "e_act": s_act, "e_out": s_e}
    chunks = _expert_bank(g, u, dn, acts, wn, s_hn, s_gate, s_act, s_e, fm, cfg.formats.shared_expert_weights, glu)
    sc["moe_out"] = act_scale(tr["moe_out"], fm.resid_bits, headroom=BRANCH_HEADROOM)
    comb_m, comb_s = _mult(s_e * 2.0 ** -fm.wn_frac / sc["moe_out"], fm)
    return QDense(silu=silu, chunks=chunks, comb_m=comb_m, comb_s=comb_s), sc


def quantize_random_layer(cfg: Config, seed: int = 0) -> QLayer:
    """The seeded random layer ``random_params(cfg, seed)`` quantised on its own channel
    profile: the one call for whoever builds a model from a seed."""
    return quantize_layer(random_params(cfg, seed), cfg, model_seed=seed)


# ---- the model stack (issue 14) ---------------------------------------------------------

# headroom of the 16-bit logits over their calibrated max|logit|: they are only compared
# (argmax) and read by the host, 16 bits leave resolution to spare
LOGIT_HEADROOM = 1.5
# the identity final-norm weight of an untied head (the weight is folded into the LM head):
# every entry 1 << NORM_W_SHIFT, the shift the same
NORM_W_SHIFT = 14


def calibration_tokens(cfg: Config, n_seq: int = 4, n_tokens: int = 256, seed: int = 1000, model_seed: int = 0):
    """``n_seq`` calibration token sequences (token seeds ``seed``..``seed + n_seq - 1``, never
    an evaluation's) in the language of model ``model_seed`` (``random_tokens``)."""
    return [random_tokens(cfg, n_tokens, seed=seed + i, model_seed=model_seed) for i in range(n_seq)]


def quantize_model(mp: ModelParams, cfg: Config, token_seqs=None, model_seed: int | None = None,
                   xs_seqs=None) -> QModel:
    """Integer model of a float model.  Calibration runs the *float* stack on the calibration
    sequences (``token_seqs``, default ``calibration_tokens(cfg, model_seed=...)``; with
    vocab = 0, residual-stream inputs ``xs_seqs``, default ``calibration_sequences``) and
    quantises layer l with ``quantize_layer`` on the float activations that reach it.  Each
    layer's input scale is fixed to what feeds it (the embedding's scale for layer 0, layer
    l-1's output scale after), so the integer stream passes between layers unchanged.

    Head formats (QHead): the embedding is symmetric int8 per table (max|E| / 127) and x_0
    the int8 entry as it is (x_0's scale = the table's); the final norm is an int8
    RMSNorm like the layers'; untied, its weight is folded into the LM head's columns and
    the int8 head has one (m, s); tied, the table is the head, and the weight is applied
    per channel (norm_w, resid_bits signed, the largest shift that fits) into an int8 fn
    whose scale minimises the MSE; the logits are resid_bits at max|logit| * 1.5."""
    fm = formats_for(cfg)
    m = cfg.model
    if (token_seqs is not None or xs_seqs is not None) and model_seed is not None:
        raise ValueError("quantize_model: give calibration sequences or model_seed, not both")
    ms = model_seed or 0
    scales: dict[str, float] = {}
    emb_q = None
    if m.vocab:
        if xs_seqs is not None:
            raise ValueError("quantize_model: a model with a vocabulary calibrates on token sequences")
        seqs = calibration_tokens(cfg, model_seed=ms) if token_seqs is None else token_seqs
        xs = [mp.embedding[np.asarray(t, dtype=np.int64)] for t in seqs]
        emb_q, scales["emb"] = quant_weight(mp.embedding, fm)
        x_scale = scales["emb"]
    else:
        if token_seqs is not None:
            raise ValueError(f"quantize_model: config {cfg.name} has no vocabulary (vocab = 0): give xs_seqs")
        xs = calibration_sequences(cfg, model_seed=ms) if xs_seqs is None else xs_seqs
        x_scale = None
    layers, attn_res = [], None
    if m.attn_res != "none":
        layers, attn_res, xs, x_scale = _quantize_depth(mp, cfg, fm, xs, x_scale, scales)
    for lp in mp.layers[len(layers):]:
        q = quantize_layer(lp, cfg, seqs=xs, x_scale=x_scale)
        layers.append(q)
        x_scale = q.scales["y"]
        xs = [fl.run_layer(lp, cfg, x) for x in xs]
    if not m.vocab:
        return QModel(layers=layers, head=None, scales=scales, attn_res=attn_res)

    d = m.d_model
    xL = np.concatenate(xs)
    fn_unit = fl.rms_unit(xL, m.norm_eps)
    scales["fn_unit"] = act_scale(fn_unit)
    final_norm = _norm(m.norm_eps * d / x_scale ** 2, math.sqrt(d) / scales["fn_unit"], fm)
    w = mp.final_norm_w
    fn = fn_unit * w[None, :]
    if m.tie_embedding:
        scales["fn"] = act_scale(fn)
        ratio = w * scales["fn_unit"] / scales["fn"]
        sh = int(np.clip(pow2_frac_bits(float(np.max(np.abs(ratio))), fm.resid_bits), 0, 30))
        norm_w = np.floor(ratio * (1 << sh) + 0.5).astype(np.int64)
        s_w, lm_head = scales["emb"], None
    else:
        scales["fn"] = scales["fn_unit"]
        sh = NORM_W_SHIFT
        norm_w = np.full(d, 1 << sh, dtype=np.int64)
        lm_head, s_w = quant_weight(mp.lm_head * w[None, :], fm)
    scales["logits"] = act_scale(fn @ mp.head().T, fm.resid_bits, headroom=LOGIT_HEADROOM)
    head_m, head_s = _mult(s_w * scales["fn"] / scales["logits"], fm)
    head = QHead(emb=emb_q, final_norm=final_norm, norm_w=norm_w, norm_w_shift=sh, head_m=head_m, head_s=head_s,
                 lm_head=lm_head)
    return QModel(layers=layers, head=head, scales=scales, attn_res=attn_res)


def _quantize_depth(mp: ModelParams, cfg: Config, fm: Formats, xs, x_scale, scales: dict):
    """A stack with Attention Residuals (QAttnRes; model/int_attn_res.py): the float
    stack runs the calibration sequences; every value a sub-layer can mix (x_0, the outputs,
    block sums) and every mix gets one depth scale s_v = max|x| * 1.5 / 32767; each layer is
    quantised on its own tensors from that run (``quantize_layer(traces=, depth_scale=)``);
    the keys' int8 scale is the MSE one over the RMS-normalised values; each pseudo-query is
    int8 with its own scale.  Returns (layers, QAttnRes, the float x_L per sequence, s_v)."""
    from model.float_model import run_stack
    m, d, L = cfg.model, cfg.model.d_model, cfg.model.n_layers
    runs, outs = [], []
    for x in xs:
        traces = []
        outs.append(run_stack(mp, cfg, x, traces=traces))
        runs.extend(traces)
    per_layer = [{k: np.stack([t["layers"][l][k] for t in runs]) for k in runs[0]["layers"][l]
                  if k not in ("idx", "w")} for l in range(L)]
    # the sub-layers' outputs, in order, for every calibration token: (N, tokens, d)
    sub_out = np.stack([per_layer[l][k] for l in range(L)
                        for k in (f"{mp.layers[l].kind}_out", "moe_out")])
    x0 = np.concatenate(xs)
    kept = [x0, *sub_out]
    if m.attn_res == "block":                      # the blocks' running sums are kept values too
        part = np.zeros_like(x0)
        for n, v in enumerate(sub_out):
            part = v if n % m.attn_res_block == 0 else part + v
            kept.append(part)
    mixes = [per_layer[l][k] for l in range(L) for k in ("x", "h")] + [np.concatenate(outs)]
    s_v = act_scale(np.concatenate([np.abs(v).ravel() for v in kept + mixes]), fm.resid_bits,
                    headroom=RESID_HEADROOM)
    layers = [quantize_layer(lp, cfg, traces=per_layer[l], depth_scale=s_v) for l, lp in enumerate(mp.layers)]
    keys = fl.rms_unit(np.concatenate(kept), m.norm_eps)
    s_key = act_scale(keys)
    key_norm = _norm(m.norm_eps * d / s_v ** 2, math.sqrt(d) / s_key, fm)
    qs, u_m, u_s = [], [], []
    for w in mp.res_queries:
        wq, s_w = quant_weight(w, fm)
        qs.append(wq)
        mm, ss = _mult(s_w * s_key * math.log2(math.e) * (1 << fm.mla_exp_frac), fm)
        u_m.append(mm)
        u_s.append(ss)
    # the sub-layers' output requantisers are the layers' residual adds (``_residual``)
    out_ms = [(r.m_b, r.s) for q in layers for r in (q.res1, q.res2)]
    emb_m, emb_s = _mult(x_scale / s_v, fm) if x_scale is not None else _mult(1.0, fm)
    scales["depth"], scales["depth_key"] = s_v, s_key
    ar = QAttnRes(queries=np.stack(qs), u_m=np.array(u_m, np.int64), u_s=np.array(u_s, np.int64), key_norm=key_norm,
                  emb_m=emb_m, emb_s=emb_s, out_m=np.array([a for a, _ in out_ms], np.int64),
                  out_s=np.array([b for _, b in out_ms], np.int64))
    return layers, ar, outs, s_v


def quantize_random_model(cfg: Config, seed: int = 0) -> QModel:
    """The seeded random model ``random_model_params(cfg, seed)`` quantised on its own language
    (or channel profile, vocab = 0)."""
    return quantize_model(random_model_params(cfg, seed), cfg, model_seed=seed)
