"""The float models' shared pieces: the elementwise functions, RMSNorm and L2 norm, the
sigmoid-score router and the SwiGLU.  model/float_layer.py (KDA, MoE, the layer),
float_mla.py and float_latent_moe.py build on them; float_layer re-exports them."""
from __future__ import annotations

import numpy as np

L2_EPS = 1e-6  # l2norm epsilon of fla's use_qk_l2norm_in_kernel


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def rms_unit(x, eps):
    """x / sqrt(mean(x^2) + eps) over the last axis (RMSNorm without its weight)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rmsnorm(x, w, eps):
    return rms_unit(x, eps) * w


def l2norm(x, eps=L2_EPS):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def moe_route(scores, bias, top_k, routed_scaling):
    """Sigmoid-score router: the bias only selects, the weights come from the scores.

    Ties in ``scores + bias`` go to the lowest expert index (a stable sort on the
    negated choice).  Returns (idx (top_k,) in selection order, weights (top_k,)).
    """
    choice = scores + bias
    idx = np.argsort(-choice, kind="stable")[:top_k]
    w = scores[idx]
    w = w / (w.sum() + 1e-20)
    return idx, w * routed_scaling


def swiglu(w_gate, w_up, w_down, x, trace=None, prefix=""):
    gate, up = w_gate @ x, w_up @ x
    hid = silu(gate) * up
    if trace is not None:
        trace[prefix + "gate"], trace[prefix + "up"], trace[prefix + "act"] = gate, up, silu(gate)
        trace[prefix + "hid"] = hid
    return w_down @ hid
