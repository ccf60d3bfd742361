"""The float models' shared pieces: the elementwise functions, RMSNorm and L2 norm, the
sigmoid-score router and the gated units (SwiGLU, and K3's SiTU-GLU: ``glu``).  model/float_layer.py (KDA, MoE, the layer),
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


def situ(g):
    """SiTU(g) = 4 tanh(g/4) sigmoid(g) (Kimi K3's gate activation, bounded in (-0.27, 4))."""
    return 4.0 * np.tanh(g / 4.0) * sigmoid(g)


def situ_up(u):
    """The up branch of SiTU-GLU: 25 tanh(u/25), bounded by 25."""
    return 25.0 * np.tanh(u / 25.0)


def situ_glu(w_gate, w_up, w_down, x, trace=None, prefix=""):
    """K3's SiTU-GLU: W_2 (SiTU(W_1 x) * 25 tanh((W_3 x) / 25)), W_1 = w_gate, W_3 = w_up,
    W_2 = w_down (the SwiGLU's three matrices in the SwiGLU's roles)."""
    gate, up = w_gate @ x, w_up @ x
    hid = situ(gate) * situ_up(up)
    if trace is not None:
        trace[prefix + "gate"], trace[prefix + "up"], trace[prefix + "act"] = gate, up, situ(gate)
        trace[prefix + "hid"] = hid
    return w_down @ hid


GLUS = {"swiglu": swiglu, "situ": situ_glu}


def glu(kind: str):
    """The gated unit of ``model.glu`` (``kind``): swiglu or situ_glu."""
    return GLUS[kind]


def glu_act(kind: str, gate, up):
    """The hidden vector act(gate) * branch(up) of gated unit ``kind``, elementwise."""
    if kind == "situ":
        return situ(gate) * situ_up(up)
    return silu(gate) * up
