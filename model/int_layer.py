"""Integer model of the whole layer and the sequence runner.

    xn = RMSNorm(x);  h = x (+) KDA(xn);  hn = RMSNorm(h);  y = h (+) MoE(hn)

(an MLA layer: h = x (+) MLA(xn), int_mla.int_mla_step; a dense layer: y = h (+) Dense(hn),
int_moe.int_dense_step; a LatentMoE is int_moe_step's latent form)

(+) is the two-scale residual add.  The residual stream x, h, y is resid_bits (16)
wide, every other activation int8, the KDA state state_bits.
"""
from __future__ import annotations

import numpy as np

from moekda.config import Config
from moekda.formats import formats_for
from model.int_kda import IntKDAState, int_kda_step
from model.int_mla import IntMLACache, int_mla_step
from model.int_moe import int_dense_step, int_moe_step
from model.int_ops import check_width, int_residual_add, int_rmsnorm
from model.qparams import QLayer


def int_token_mix(qp: QLayer, cfg: Config, fm, state, xn, t: dict):
    """The layer's token mixer (KDA or MLA) on its int8 normalised input: (state, out int8)."""
    if qp.mla is not None:
        return int_mla_step(qp.mla, cfg, fm, state, xn, t)
    return int_kda_step(qp.kda, cfg, fm, state, xn, t)


def int_channel_mix(qp: QLayer, cfg: Config, fm, hn, t: dict):
    """The layer's channel mixer (MoE, LatentMoE or dense) on its int8 normalised input: out
    (resid_bits)."""
    if qp.dense is not None:
        return int_dense_step(qp.dense, cfg, fm, hn, t)
    return int_moe_step(qp.moe, cfg, fm, hn, t, h=t.get("h"))[0]


def int_layer_step(qp: QLayer, cfg: Config, state, x, trace=None):
    """One token x (d,) (resid_bits) through the layer. Returns (state, y (resid_bits))."""
    fm = formats_for(cfg)
    t = trace if trace is not None else {}
    x = check_width(np.asarray(x, dtype=np.int64), fm.resid_bits, "layer input")
    t["x"] = x
    t["xn_unit"] = int_rmsnorm(x, qp.attn_norm, fm)
    state, mix_out = int_token_mix(qp, cfg, fm, state, t["xn_unit"], t)
    t["h"] = int_residual_add(x, mix_out, qp.res1, fm)
    t["hn_unit"] = int_rmsnorm(t["h"], qp.mlp_norm, fm)
    moe_out = int_channel_mix(qp, cfg, fm, t["hn_unit"], t)
    t["y"] = int_residual_add(t["h"], moe_out, qp.res2, fm)
    return state, t["y"]


def int_mixer_state(qp: QLayer, cfg: Config, batch: tuple = ()):
    """The zero state of a layer's token mixer: a KDA state, or an MLA layer's empty cache."""
    return IntMLACache() if qp.mla is not None else IntKDAState.zeros(cfg, batch)


def int_run_layer(qp: QLayer, cfg: Config, xs, resets=None, traces: list | None = None):
    """Run tokens xs (T, d) (resid_bits); resets[t] true clears the KDA state (and conv history)
    before token t. Returns ys (T, d)."""
    state = int_mixer_state(qp, cfg)
    xs = np.asarray(xs, dtype=np.int64)
    ys = np.zeros_like(xs)
    for i, x in enumerate(xs):
        if resets is not None and resets[i]:
            state = int_mixer_state(qp, cfg)
        tr = {} if traces is not None else None
        state, ys[i] = int_layer_step(qp, cfg, state, x, tr)
        if traces is not None:
            traces.append(tr)
    return ys


def quantize_input(x, qp: QLayer, cfg: Config):
    """Float layer input -> resid_bits integers at the calibrated input scale (the host's job)."""
    fm = formats_for(cfg)
    lo, hi = -(1 << (fm.resid_bits - 1)), (1 << (fm.resid_bits - 1)) - 1
    return np.clip(np.floor(np.asarray(x) / qp.scales["x"] + 0.5), lo, hi).astype(np.int64)


def dequantize(name: str, v, qp: QLayer):
    return np.asarray(v, dtype=np.float64) * qp.scales[name]
