"""Float (numpy float64) model of LatentMoE (issue 15; reported for Kimi K3 as "Stable
LatentMoE", publicly described for NVIDIA Nemotron 3): the routed experts work in a latent
width l < d_model.

    scores = sigmoid(W_router hn)                 the router sees the full width
    idx, w = top-k of scores + bias (fixed selection biases, plain top-k, as K3 deploys it)
    z      = W_lat_down hn                        (l)
    routed = W_lat_up sum_i w_i SwiGLU_i(z)       each chosen expert l -> d_ff -> l
    out    = routed + sum_j SharedSwiGLU_j(hn)    shared experts stay at full width

Kimi K3's exit norm (model.latent_exit_norm; issue 47, difference 4):

    routed = W_lat_up RMSNorm(sum_i w_i E_i(z))   weight exit_norm_w (l), eps norm_eps

so the routed part's size is set by the norm's weight, not by the router's weights: top-k
renormalisation and routed_scaling no longer change it (up to eps), which is why K3's
routed scale is 1.0.

A chosen expert's weights are 3 * d_ff * l instead of 3 * d_ff * d_model: weight bytes per
chosen expert shrink by l / d_model, for the price of the two latent projections, which
every token reads once (``expert_weight_bytes``).
"""
from __future__ import annotations

import numpy as np

from model.float_ops import glu as glu_unit, moe_route, rms_unit, sigmoid
from model.params import LatentMoEParams


def latent_moe_step(p: LatentMoEParams, hn, top_k: int, routed_scaling: float, trace=None, glu: str = "swiglu",
                    eps: float = 1e-6):
    """LatentMoE on the normalised input hn (d,). Returns (out (d,), (idx, weights)).  ``glu``:
    the experts' gated unit (model.glu: "swiglu", or K3's "situ").  ``p.exit_norm_w`` not None:
    K3's exit norm on the routed latent sum, with ``eps`` (model.norm_eps)."""
    unit = glu_unit(glu)
    r_logit = p.w_router @ hn
    scores = sigmoid(r_logit)
    idx, w = moe_route(scores, p.router_bias, top_k, routed_scaling)
    z = p.w_lat_down @ hn
    routed_latent = sum(wi * unit(p.w_gate[e], p.w_up[e], p.w_down[e], z) for e, wi in zip(idx, w))
    exit_unit = None
    if p.exit_norm_w is not None:
        exit_unit = rms_unit(routed_latent, eps)
        routed = p.w_lat_up @ (exit_unit * p.exit_norm_w)
    else:
        routed = p.w_lat_up @ routed_latent
    shared = sum(unit(p.sh_gate[j], p.sh_up[j], p.sh_down[j], hn) for j in range(p.sh_gate.shape[0]))
    if trace is not None:
        trace.update(r_logit=r_logit, score=scores, idx=idx, w=w, lat_z=z, lat_routed=routed_latent, moe_out=routed + shared)
        if exit_unit is not None:
            # the integer model's names: lat_pre the sum, lat_routed what lat_up reads (the
            # normalised sum, its weight folded into lat_up)
            trace.update(lat_pre=routed_latent, lat_routed=exit_unit)
    return routed + shared, (idx, w)


def expert_weight_bytes(d_ff: int, width: int, weight_bytes: int = 1) -> int:
    """Bytes of one expert's three matrices at input/output width ``width`` (d_model for a
    plain MoE expert, l for a latent one)."""
    return 3 * d_ff * width * weight_bytes


def random_latent_moe_params(d: int, latent: int, d_ff: int, n_experts: int, n_shared: int,
                             seed: int = 0) -> LatentMoEParams:
    rng = np.random.default_rng(seed)
    dense = lambda *shape: rng.standard_normal(shape) / np.sqrt(shape[-1])
    return LatentMoEParams(w_router=dense(n_experts, d), router_bias=0.1 * rng.standard_normal(n_experts),
                           w_lat_down=dense(latent, d), w_lat_up=dense(d, latent),
                           w_gate=dense(n_experts, d_ff, latent), w_up=dense(n_experts, d_ff, latent),
                           w_down=dense(n_experts, latent, d_ff), sh_gate=dense(n_shared, d_ff, d),
                           sh_up=dense(n_shared, d_ff, d), sh_down=dense(n_shared, d, d_ff))
