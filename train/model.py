"""The project's float model in JAX, over whole sequences: what is trained is what is quantised.

Formula by formula the same as model/float_layer.py (one layer: RMSNorm, KDA with
short convolution, gates, delta rule, o-norm and output gate; RMSNorm, MoE or dense SwiGLU)
and model/float_model.py (embedding, the L layers, final RMSNorm, LM head, tied or
untied).  The float model runs one token at a time; here a layer runs a whole sequence at
once: every projection, the short convolution, the norms and the channel mixer are batched
over the T tokens, and only the delta rule's state is carried token to token (a
``lax.scan``).  Layer l+1 reads layer l's outputs for the same tokens only, so running the
stack layer by layer over the sequence computes what the token-by-token stack does.

Sequences: ``resets[t]`` true starts a new sequence at token t (float_model.run_model's
rule): the short-convolution history and the delta-rule state of every layer are zero
before it.  Token 0 always starts one.

Parameters (the *tree*): a dict from the flat names of ``model.params`` to arrays,
``LayerParams.to_flat()`` names for one layer (``kda.w_q``, ``moe.w_router``, ...) and
``ModelParams.to_flat()`` names for a model (``embedding``, ``final_norm_w``, ``lm_head``
when untied, ``layers.<l>.kda.w_q``, ...).  A dict of arrays is a JAX pytree as it is, and
``to_tree`` / ``layer_from_tree`` / ``model_from_tree`` convert without rounding (float64
in, float64 out; a float32 tree widens exactly), so a trained tree goes to the quantiser
(model/quantize.py) unchanged.

MoE routing: the experts are chosen as the float model chooses them (``scores + bias``
sorted, ties to the lowest index, the top k), a discrete choice with no gradient; the
chosen experts' outputs are combined with the weights the float model computes from the
scores, so gradients reach the chosen experts' weights and the router through those
weights (the selection bias, which only selects, gets none).  Every expert is evaluated
and the unchosen ones weighted by zero: for the small expert counts trained here that is
cheaper than gathering each token's experts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from moekda.config import Config
from model.float_layer import L2_EPS
from model.params import LayerParams, ModelParams, check_model_shapes, check_shapes


# ---- parameters ----------------------------------------------------------------------------

def to_tree(params: LayerParams | ModelParams, dtype=jnp.float64) -> dict:
    """The tree (flat name -> jax array of ``dtype``) of a layer's or a model's parameters.
    float64 needs ``jax.config.update("jax_enable_x64", True)`` first (JAX otherwise makes it
    float32 silently), so it is refused here without it."""
    if jnp.dtype(dtype) == jnp.float64 and not jax.config.jax_enable_x64:
        raise ValueError("to_tree: float64 needs jax.config.update('jax_enable_x64', True)")
    return {k: jnp.asarray(v, dtype=dtype) for k, v in params.to_flat().items()}


def _numpy_flat(tree: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float64) for k, v in tree.items()}


def layer_from_tree(tree: dict, cfg: Config) -> LayerParams:
    """The LayerParams of a one-layer tree (float64 numpy arrays), shapes checked against cfg."""
    p = LayerParams.from_flat(_numpy_flat(tree))
    check_shapes(p, cfg)
    return p


def model_from_tree(tree: dict, cfg: Config) -> ModelParams:
    """The ModelParams of a model tree (float64 numpy arrays), shapes and mixers checked."""
    mp = ModelParams.from_flat(_numpy_flat(tree), cfg)
    check_model_shapes(mp, cfg)
    return mp


def _layer_view(tree: dict, prefix: str) -> dict:
    """Layer l's entries of a model tree under its own flat names (prefix ``layers.<l>.``)."""
    return {k[len(prefix):]: v for k, v in tree.items() if k.startswith(prefix)}


# ---- elementwise pieces (float_layer's, in jnp) ------------------------------------------------

def rms_unit(x, eps):
    """x / sqrt(mean(x^2) + eps) over the last axis."""
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def l2norm(x, eps=L2_EPS):
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def silu(x):
    return x * jax.nn.sigmoid(x)


def swiglu(w_gate, w_up, w_down, x):
    """Batched SwiGLU: x (T, d), w_gate/w_up (..., F, d), w_down (..., d, F) with the same
    leading axes: out (T, ..., d) = w_down (silu(w_gate x) * (w_up x)) per leading index."""
    gate = jnp.einsum("td,...fd->t...f", x, w_gate)
    up = jnp.einsum("td,...fd->t...f", x, w_up)
    return jnp.einsum("t...f,...df->t...d", silu(gate) * up, w_down)


# ---- sequences -----------------------------------------------------------------------------------

def segment_starts(resets, T: int):
    """(starts (T,) bool, seg_start (T,) int): token t starts a sequence, and the index of
    the first token of t's sequence (token 0 always starts one)."""
    starts = jnp.zeros(T, bool) if resets is None else jnp.asarray(resets, bool)
    starts = starts.at[0].set(True)
    seg_start = jax.lax.cummax(jnp.where(starts, jnp.arange(T), 0))
    return starts, seg_start


def causal_conv(a, w, seg_start):
    """float_layer.causal_conv_step over a sequence: a (T, C), w (C, K) with tap j weighting
    token t-(K-1)+j; tokens before t's sequence start count as zero (the zeroed history)."""
    T, K = a.shape[0], w.shape[1]
    t = jnp.arange(T)
    out = jnp.zeros_like(a)
    for back in range(K):       # back = K-1-j tokens into the past
        src = t - back
        shifted = jnp.where((src >= seg_start)[:, None], a[jnp.maximum(src, 0)], 0.0)
        out = out + w[:, K - 1 - back] * shifted
    return out


RULES = ("delta", "gla")


def delta_rule(q, k, v, g, beta, starts, rule: str = "delta"):
    """float_layer.delta_rule_step over a sequence, the state zeroed where ``starts``.
    q, k, g (T, H, dk); v (T, H, dv); beta (T, H); starts (T,).  Returns o (T, H, dv).

    ``rule="gla"`` is the training baseline without the delta rule, plain gated linear
    attention (Yang et al. 2023): S = diag(exp g) S + k v^T, the same decay and readout
    but no correction by what S already holds for k and no write strength beta (the chip
    and model/ computes only the delta rule)."""
    if rule not in RULES:
        raise ValueError(f"rule {rule!r}: allowed are {', '.join(RULES)}")
    H, dk, dv = q.shape[1], q.shape[2], v.shape[2]

    def step(S, tok):
        qt, kt, vt, gt, bt, st = tok
        S = jnp.where(st, jnp.zeros_like(S), S)
        S = S * jnp.exp(gt)[:, :, None]
        u = vt if rule == "gla" else bt[:, None] * (vt - jnp.einsum("hkv,hk->hv", S, kt))
        S = S + kt[:, :, None] * u[:, None, :]
        return S, jnp.einsum("hkv,hk->hv", S, qt)

    _, o = jax.lax.scan(step, jnp.zeros((H, dk, dv), q.dtype), (q, k, v, g, beta, starts))
    return o


def kda(p: dict, cfg: Config, xn, starts, seg_start, rule: str = "delta"):
    """float_layer.kda_step over a sequence: xn (T, d) the normalised input. Returns (T, d)."""
    m = cfg.model
    T, H, dk = xn.shape[0], m.n_heads, m.head_dim
    conv = lambda w, c: causal_conv(xn @ p[w].T, p[c], seg_start)
    q = l2norm(silu(conv("kda.w_q", "kda.conv_q")).reshape(T, H, dk))
    k = l2norm(silu(conv("kda.w_k", "kda.conv_k")).reshape(T, H, dk))
    v = silu(conv("kda.w_v", "kda.conv_v")).reshape(T, H, dk)
    f = (xn @ p["kda.w_f_down"].T) @ p["kda.w_f_up"].T
    a = jnp.repeat(jnp.exp(p["kda.a_log"]), dk)
    g = m.decay_lower_bound * jax.nn.sigmoid(a * (f + p["kda.dt_bias"]))
    beta = jax.nn.sigmoid(xn @ p["kda.w_b"].T)
    o = delta_rule(q * dk ** -0.5, k, v, g.reshape(T, H, dk), beta, starts, rule)
    on = rms_unit(o, m.norm_eps)
    gate = jax.nn.sigmoid((xn @ p["kda.w_g_down"].T) @ p["kda.w_g_up"].T)
    return ((on * p["kda.o_norm_w"]).reshape(T, H * dk) * gate) @ p["kda.w_o"].T


def route(scores, bias, top_k: int, routed_scaling: float):
    """float_layer.moe_route for T tokens: scores (T, E) -> gates (T, E), the chosen experts'
    weights (the normalised scores times routed_scaling), zero for the others.  The choice
    (``scores + bias``, a stable sort: ties to the lowest index) carries no gradient."""
    E = scores.shape[-1]
    idx = jnp.argsort(-jax.lax.stop_gradient(scores + bias), axis=-1, stable=True)[:, :top_k]
    w = jnp.take_along_axis(scores, idx, axis=-1)
    w = w / (w.sum(axis=-1, keepdims=True) + 1e-20) * routed_scaling
    return jnp.einsum("tk,tke->te", w, jax.nn.one_hot(idx, E, dtype=scores.dtype))


def moe(p: dict, cfg: Config, hn):
    """float_layer.moe_step over a sequence: hn (T, d) -> (T, d)."""
    m = cfg.model
    gates = route(jax.nn.sigmoid(hn @ p["moe.w_router"].T), p["moe.router_bias"], m.top_k, m.routed_scaling)
    routed = jnp.einsum("te,ted->td", gates, swiglu(p["moe.w_gate"], p["moe.w_up"], p["moe.w_down"], hn))
    shared = swiglu(p["moe.sh_gate"], p["moe.sh_up"], p["moe.sh_down"], hn).sum(axis=1)
    return routed + shared


def layer(p: dict, cfg: Config, x, starts, seg_start, rule: str = "delta"):
    """float_layer.layer_step over a sequence: x (T, d) -> y (T, d)."""
    eps = cfg.model.norm_eps
    h = x + kda(p, cfg, rms_unit(x, eps) * p["attn_norm_w"], starts, seg_start, rule)
    hn = rms_unit(h, eps) * p["mlp_norm_w"]
    mixer = swiglu(p["dense.w_gate"], p["dense.w_up"], p["dense.w_down"], hn) if "dense.w_gate" in p \
        else moe(p, cfg, hn)
    return h + mixer


def run_layer(tree: dict, cfg: Config, xs, resets=None):
    """float_layer.run_layer: a one-layer tree on residual-stream inputs xs (T, d) -> (T, d)."""
    starts, seg_start = segment_starts(resets, xs.shape[0])
    return layer(tree, cfg, jnp.asarray(xs, tree["attn_norm_w"].dtype), starts, seg_start)


def run_stack(tree: dict, cfg: Config, xs, resets=None, rule: str = "delta"):
    """float_model.run_stack: a model tree's L layers on xs (T, d) -> x_L (T, d)."""
    starts, seg_start = segment_starts(resets, xs.shape[0])
    x = jnp.asarray(xs, tree["layers.0.attn_norm_w"].dtype)
    for l in range(cfg.model.n_layers):
        x = layer(_layer_view(tree, f"layers.{l}."), cfg, x, starts, seg_start, rule)
    return x


def run_model(tree: dict, cfg: Config, tokens, resets=None, rule: str = "delta"):
    """float_model.run_model, teacher-forced: token ids (T,) -> logits (T, V), row t the
    prediction of the token after tokens[t].  The ids must lie in 0 .. vocab-1 (JAX clamps
    an index out of range instead of refusing it; float_model.embed refuses it)."""
    tokens = jnp.asarray(tokens)
    xL = run_stack(tree, cfg, tree["embedding"][tokens], resets, rule)
    fn = rms_unit(xL, cfg.model.norm_eps) * tree["final_norm_w"]
    head = tree["lm_head"] if "lm_head" in tree else tree["embedding"]
    return fn @ head.T
