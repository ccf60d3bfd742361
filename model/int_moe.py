"""Integer MoE block: router, top-k, weight normalisation, SwiGLU experts, combine.

  r      = engine(W_r' hn) -> code;  s = sigmoid table(r)       U0.score_frac (0..2**score_frac)
  choice = s + bias                                             router_bias_bits + 1 signed
  idx    = top_k(choice): larger first, ties -> lowest index
  w_i    = s[idx_i];  tot = sum_i w_i
  wn_i   = floor((w_i << wn_frac) / max(tot, 1))                restoring divider, U0.wn_frac
  wt_i   = rs(wn_i * rs, rs_frac)                               routed_scaling applied, U.wn_frac
  e(x)   = expert, see int_expert                               expert_out_bits, common scale
  acc    = sum_i wt_i * e_idx_i(hn) + sum_j (e_shared_j(hn) << wn_frac)
  out    = requantize(acc, comb_m, comb_s, resid_bits)          16 bits: it only feeds the residual add

LatentMoE (model.moe_latent = l > 0; the router and the shared experts as above):
  z      = engine(W_lat_down' hn)                               int8 (l), own scale
  racc   = sum_i wt_i * e_idx_i(z)                              the routed experts at width l
  zr     = requantize(racc, lat_m, lat_s, act_bits)             int8 (l), own scale
  acc    = (engine(W_lat_up zr) << wn_frac) + shared as above   W_lat_up's output: expert_out_bits at
                                                                the experts' common output scale

K3's exit norm (model.latent_exit_norm; QMoE.lat_norm):
  zp     = requantize(racc, lat_m, lat_s, resid_bits)           16 bits (l), own scale
  zr     = int_normalize(zp, lat_norm, act_bits)                int8 unit vector (l): the layers'
                                                                RMSNorm, its weight folded into W_lat_up
"""
from __future__ import annotations

import numpy as np

from moekda.config import Config
from moekda.formats import Formats, derived_widths
from moekda.mx import mx8_round_int, mx_block_dot, mx_widths
from moekda.numerics import bit_length, requantize, round_shift, saturate, udiv_floor
from moekda.tables import situ_in_bits
from model.int_ops import check_width, int_cap, int_linear, int_lut, int_normalize, int_silu, int_situ
from model.qparams import QDense, QExperts, QMoE


def int_route(q: QMoE, cfg: Config, fm: Formats, score):
    """Selection and weights from the integer scores (E,) (or (..., E), a batch of tokens).
    Returns (idx, wt) in selection order."""
    m = cfg.model
    choice = score + q.bias
    check_width(choice, fm.router_bias_bits + 1, "router choice")
    idx = np.argsort(-choice, axis=-1, kind="stable")[..., :m.top_k]   # stable: ties keep index order
    w = np.take_along_axis(score, idx, axis=-1)
    tot = np.maximum(w.sum(axis=-1, keepdims=True), 1)
    widths = derived_widths(cfg)
    wn = udiv_floor(w << fm.wn_frac, np.broadcast_to(tot, w.shape), widths["div_num"], widths["div_den"])
    wt = round_shift(wn * q.rs, fm.rs_frac)
    return idx, wt


def _bank_acc(bank: QExperts, name: str, e: int, x, fm: Formats, what: str):
    """The accumulator of matrix ``name`` of expert e against x: int8 W @ x on the engine, or
    (an MXFP4 bank, issue 48) the MXFP4 engine's blocks (moekda.mx.mx_block_dot): E2M1 half
    units times x, each block's sum shifted left by its scale byte minus the matrix's floor."""
    w = getattr(bank, f"{name}_w")[e]
    sb = getattr(bank, f"{name}_sb")
    if sb is None:
        return check_width(x @ w.T, fm.acc_bits, what)
    acc = mx_block_dot(w, sb[e] - getattr(bank, f"{name}_sf")[e], x, fm.mx_block)
    bits = mx_widths(w.shape[-1], max(fm.mx_in_bits, fm.act_bits), fm.mx_scale_range, fm.mx_block)["mx_acc"]
    return check_width(acc, bits, what)


def int_expert(bank: QExperts, e: int, q: QMoE, fm: Formats, hn, trace=None):
    """One SwiGLU expert of a bank on int8 hn: expert_out_bits out at the common output scale.

      act  = SiLU table(engine(W_gate hn) -> code)         int8, bank-common scale
      up   = engine(W_up hn)                               int8, this expert's scale
      prod = act * up                                      16 bits signed (derived_widths swiglu_prod)
      sh   = max(0, bit_length(max_i |prod_i|) - (hid_bits - 1))       per token
      hid  = sat_hid(round_shift(prod, sh))                hid_bits (8) at 2**sh * (act scale * up scale)
      out  = requantize(W_down hid, down_m, down_s - sh)   expert_out_bits, bank-common scale

    The hidden vector gets a per-token power-of-two exponent (block floating point):
    the product of two activations is heavy-tailed, so any static int8 scale either
    saturates rare tokens or leaves the bulk with 3-4 bits; the exponent costs a
    max-abs reduction and a leading-one detector over d_ff values, and folds into the
    down projection's shift.

    SiTU-GLU (model.glu = "situ": ``q.silu`` is None), both branches bounded:

      gate = engine(W_gate hn) -> code in SITU's fixed input format (situ_in_bits, +-16)
      act  = SITU[gate]                                    int8 at the fixed scale 2**-SITU_OUT_FRAC
      up   = engine(W_up hn) -> int8 at this expert's scale, then 25 tanh(u/25) at the same
             scale as c * F(t) (int_cap, the expert's cap_t_m, cap_t_s)

    and prod, sh, hid, out as above.
    """
    acc_g = _bank_acc(bank, "gate", e, hn, fm, "expert gate accumulator")
    acc_u = _bank_acc(bank, "up", e, hn, fm, "expert up accumulator")
    situ = q.silu is None
    gate = requantize(acc_g, int(bank.gate_m[e]), int(bank.gate_s[e]), situ_in_bits(fm) if situ else fm.lut_in_bits)
    act = int_situ(gate, fm) if situ else int_silu(q.silu, gate, fm)
    up = requantize(acc_u, int(bank.up_m[e]), int(bank.up_s[e]), fm.act_bits)
    if situ:
        up = int_cap(up, int(bank.cap_t_m[e]), int(bank.cap_t_s[e]), fm)
    prod = act * up
    # the per-token exponent (an array for a batch of tokens, one per row)
    sh = np.maximum(0, bit_length(np.max(np.abs(prod), axis=-1)) - (fm.hid_bits - 1))
    hid = saturate(round_shift(prod, sh[..., None]), fm.hid_bits)
    down_s = int(bank.down_s[e]) - sh
    if np.any(down_s < 1):
        raise OverflowError("int_expert: down-projection shift below 1")
    acc_d = _bank_acc(bank, "down", e, hid, fm, "expert down accumulator")
    out = requantize(acc_d, int(bank.down_m[e]), down_s[..., None], fm.expert_out_bits)
    if trace is not None:
        trace.append({"gate": gate, "act": act, "up": up, "hid": hid, "hid_shift": np.int64(sh), "out": out})
    return out


def int_moe_step(q: QMoE, cfg: Config, fm: Formats, hn, trace=None, h=None):
    """One token through the MoE block. hn: (d,) int8. Returns (out (resid_bits), (idx, wt)).
    A batch of tokens (hn (..., d)) is computed expert by expert, each on the tokens that
    chose it (the sums are exact integers: their order does not matter).  ``h``: the
    residual stream hn was normalised from, read when the routed experts' input is MXFP8
    (QMoE.mx_norm; issue 48)."""
    m = cfg.model
    hn = check_width(np.asarray(hn, dtype=np.int64), fm.act_bits, "moe input")
    t = trace if trace is not None else {}
    t["r_logit"] = int_linear(q.router, hn, fm, "router")
    score = int_lut(q.score, t["r_logit"])
    t["score"] = score
    idx, wt = int_route(q, cfg, fm, score)
    t["idx"], t["w"] = idx, wt
    experts = [] if trace is not None else None
    latent = q.lat_down is not None
    # the routed experts' input: hn itself, or (LatentMoE) its int8 latent z
    xr = int_linear(q.lat_down, hn, fm, "latent down") if latent else hn
    if latent:
        t["lat_z"] = xr
    if cfg.formats.expert_inputs == "mxfp8_e4m3":
        # MXFP8 (issue 48): a 16-bit source (LatentMoE: lat_down at 16 bits; MoE: h normalised
        # to 16 bits by mx_norm) rounded to E4M3 blocks of 32, kept in the source's units
        if not latent:
            if h is None:
                raise ValueError("int_moe_step: MXFP8 expert inputs need h (the residual stream)")
            xr = int_normalize(np.asarray(h, dtype=np.int64)[..., None, :], q.mx_norm, fm, fm.mx_in_bits)[..., 0, :]
        t["mx_src"] = xr
        xr = mx8_round_int(xr, fm.mx_block)
        t["mx_in"] = xr
    width = xr.shape[-1]
    racc = np.zeros(xr.shape, dtype=np.int64)
    if xr.ndim == 1:
        for e, w in zip(idx, wt):
            racc += w * int_expert(q.routed, int(e), q, fm, xr, experts)
    else:
        rows_x, rows_acc = xr.reshape(-1, width), racc.reshape(-1, width)
        rows_idx, rows_wt = idx.reshape(-1, m.top_k), wt.reshape(-1, m.top_k)
        for e in np.unique(rows_idx):
            chose = rows_idx == e                              # top-k ids are distinct per token
            rows = np.nonzero(chose.any(axis=1))[0]
            w = (rows_wt * chose).sum(axis=1)[rows]
            rows_acc[rows] += w[:, None] * int_expert(q.routed, int(e), q, fm, rows_x[rows])
    if latent:
        # the weighted latent sum to int8, then up to width d at the experts' output scale:
        # from there it joins the combine as a shared expert's output does
        check_width(racc, derived_widths(cfg)["moe_combine_acc"], "latent combine accumulator")
        if q.lat_norm is None:
            t["lat_routed"] = requantize(racc, q.lat_m, q.lat_s, fm.act_bits)
        else:
            # K3's exit norm: the sum to 16 bits first (the norm is scale-free, so a 16-bit
            # value keeps small tokens' shape; int8 would leave them a few levels), then the
            # RMSNorm the layers use (one rsqrt per token) to int8
            t["lat_pre"] = requantize(racc, q.lat_m, q.lat_s, fm.resid_bits)
            t["lat_routed"] = int_normalize(t["lat_pre"][..., None, :], q.lat_norm, fm, fm.act_bits)[..., 0, :]
        acc = int_linear(q.lat_up, t["lat_routed"], fm, "latent up") << fm.wn_frac
    else:
        acc = racc
    for j in range(m.n_shared):
        acc += int_expert(q.shared, j, q, fm, hn, experts) << fm.wn_frac
    t["experts"] = experts
    t["moe_acc"] = check_width(acc, derived_widths(cfg)["moe_combine_acc"], "moe combine accumulator")
    out = requantize(acc, q.comb_m, q.comb_s, fm.resid_bits)   # straight into the residual add
    t["moe_out"] = out
    return out, (idx, wt)


def dense_combine_bits(cfg: Config, fm: Formats) -> int:
    """Width of a dense mixer's combine accumulator: C chunk outputs << wn_frac.  At most the
    MoE's moe_combine_acc when C <= top_k + n_shared (the default d_ff_dense), so the shared-
    expert path's accumulator holds it; wider dense mixers need this many bits."""
    w = derived_widths(cfg)
    return max(w["dense_combine_acc"], w["moe_combine_acc"])


def int_dense_step(q: QDense, cfg: Config, fm: Formats, hn, trace=None):
    """One token through a dense mixer: the MoE's shared-expert path alone, with the chunks
    of the dense SwiGLU as its experts (int_expert, the same arithmetic):
      acc = sum_c (e_c(hn) << wn_frac);  out = requantize(acc, comb_m, comb_s, resid_bits).
    hn: (d,) int8. Returns out (resid_bits)."""
    m = cfg.model
    hn = check_width(np.asarray(hn, dtype=np.int64), fm.act_bits, "dense input")
    t = trace if trace is not None else {}
    experts = [] if trace is not None else None
    acc = np.zeros(hn.shape, dtype=np.int64)
    for c in range(q.chunks.gate_w.shape[0]):
        acc += int_expert(q.chunks, c, q, fm, hn, experts) << fm.wn_frac
    t["experts"] = experts
    t["moe_acc"] = check_width(acc, dense_combine_bits(cfg, fm), "dense combine accumulator")
    out = requantize(acc, q.comb_m, q.comb_s, fm.resid_bits)
    t["moe_out"] = out
    return out
