"""Float (numpy float64) model of the whole language model: the ground truth of the stack.

    x_0     = E[token]                          embedding lookup (V, d)
    x_l+1   = layer_l(x_l)                      l = 0 .. L-1, float_layer.layer_step, own params and KDA state
    logits  = W_head RMSNorm(x_L; w_final)      W_head = E (tied) or its own (V, d)
    next    = argmax(logits)                    ties: the lowest token id

Decode: one token at a time, every layer's KDA state carried to the next token; a reset
before token t clears every layer's state (a new sequence).  With ``model.vocab = 0`` the
stack has no embedding, final norm or head: residual streams in and out (x_0 given,
x_L returned), which for one layer is exactly ``float_layer.run_layer``.

Each layer is float_layer.layer_step itself (no copy of its formulas); this module adds
only the embedding, the final norm, the head and the sequencing.  Traces: one dict per
token, ``layers`` (a list of layer_step trace dicts, layer_step's names) plus
``x0``, ``xL``, ``fn_unit`` (x_L / rms(x_L), the integer model's final-norm output before
the norm weight), ``fn`` (RMSNorm(x_L) with its weight) and ``logits``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moekda.config import Config
from model.float_attn_res import DepthResidual
from model.float_layer import KDAState, channel_mix, layer_step, rms_unit, token_mix
from model.float_mla import MLACache
from model.params import ModelParams
from model.sequence import greedy, run_sequence


def argmax_lowest(logits) -> int:
    """The next token: the index of the largest logit, the lowest such index on ties
    (numpy's argmax returns the first maximum).  The integer model uses the same rule."""
    return int(np.argmax(np.asarray(logits)))


@dataclass
class ModelState:
    """Everything the model carries from one token to the next: each layer's KDA state, or
    for an MLA layer (issue 15) its cache of latents."""
    layers: list

    @classmethod
    def zeros(cls, cfg: Config) -> "ModelState":
        return cls([MLACache() if kind == "mla" else KDAState.zeros(cfg) for kind in cfg.model.layers])


def embed(mp: ModelParams, cfg: Config, token) -> np.ndarray:
    tok = int(token)
    if not 0 <= tok < cfg.model.vocab:
        raise ValueError(f"token id {tok}: allowed range is 0 to {cfg.model.vocab - 1} (model.vocab)")
    return mp.embedding[tok]


def head_step(mp: ModelParams, cfg: Config, xL, trace=None) -> np.ndarray:
    """Final RMSNorm and LM head: logits (V,)."""
    t = trace if trace is not None else {}
    t["fn_unit"] = rms_unit(xL, cfg.model.norm_eps)
    t["fn"] = t["fn_unit"] * mp.final_norm_w
    t["logits"] = mp.head() @ t["fn"]
    return t["logits"]


def hybrid_stack_step(mp: ModelParams, cfg: Config, state: ModelState, x, t: dict):
    """The stack with K3's hybrid parts (issue 15): each layer's two sub-layers (token mixer
    2l, channel mixer 2l + 1) read their input from float_attn_res.DepthResidual (the plain
    residual sum, full or block Attention Residuals) and give it their output."""
    m, eps = cfg.model, cfg.model.norm_eps
    r = DepthResidual(m.attn_res, x, mp.res_queries, eps, m.attn_res_block)
    new = []
    for l, (lp, st) in enumerate(zip(mp.layers, state.layers)):
        tr = {"x": r.input(2 * l + 1)}
        tr["xn_unit"] = rms_unit(tr["x"], eps)
        st, out = token_mix(lp, cfg, st, tr["xn_unit"] * lp.attn_norm_w, tr)
        r.add(out)
        tr["h"] = r.input(2 * l + 2)
        tr["hn_unit"] = rms_unit(tr["h"], eps)
        r.add(channel_mix(lp, cfg, tr["hn_unit"] * lp.mlp_norm_w, tr))
        new.append(st)
        t["layers"].append(tr)
    t["xL"] = r.output()
    return ModelState(new), t["xL"]


def stack_step(mp: ModelParams, cfg: Config, state: ModelState, x, trace=None, hybrid: bool | None = None):
    """x_0 (d,) through the L layers. Returns (state, x_L (d,)).  A model with the plain
    residual runs float_layer.layer_step per layer (what the chip computes; a layer's token
    mixer may be KDA or MLA, its channel mixer a LatentMoE); one with Attention Residuals
    runs ``hybrid_stack_step``;
    ``hybrid=True`` runs even such a model through ``hybrid_stack_step`` (the tests: both
    give the same)."""
    t = trace if trace is not None else {}
    t["x0"] = x
    t["layers"] = []
    if hybrid or (hybrid is None and cfg.model.attn_res != "none"):
        return hybrid_stack_step(mp, cfg, state, x, t)
    new = []
    for lp, st in zip(mp.layers, state.layers):
        tr = {}
        st, x = layer_step(lp, cfg, st, x, tr)
        new.append(st)
        t["layers"].append(tr)
    t["xL"] = x
    return ModelState(new), x


def model_step(mp: ModelParams, cfg: Config, state: ModelState, token, trace=None):
    """One token id through the model. Returns (state, logits (V,))."""
    state, xL = stack_step(mp, cfg, state, embed(mp, cfg, token), trace)
    return state, head_step(mp, cfg, xL, trace)


def run_model(mp: ModelParams, cfg: Config, tokens, resets=None, traces: list | None = None) -> np.ndarray:
    """Decode a token sequence (T,) teacher-forced: logits (T, V), row t the prediction of
    the token after tokens[t].  ``resets[t]`` true starts a new sequence at token t (every
    layer's state zeroed before it).  Appends one trace dict per token to ``traces``."""
    m = cfg.model
    if m.vocab == 0:
        raise ValueError(f"config {cfg.name}: vocab = 0, no tokens (run_stack takes residual streams)")
    tokens = np.asarray(tokens, dtype=np.int64)
    return run_sequence(lambda st, tok, tr: model_step(mp, cfg, st, tok, tr), lambda: ModelState.zeros(cfg),
                        tokens, np.zeros((len(tokens), m.vocab)), resets, traces)


def run_stack(mp: ModelParams, cfg: Config, xs, resets=None, traces: list | None = None) -> np.ndarray:
    """The layers alone on residual-stream inputs xs (T, d): x_L (T, d).  For a one-layer
    stack this is float_layer.run_layer."""
    xs = np.asarray(xs, dtype=np.float64)
    return run_sequence(lambda st, x, tr: stack_step(mp, cfg, st, x, tr), lambda: ModelState.zeros(cfg),
                        xs, np.zeros_like(xs), resets, traces)


def next_tokens(logits) -> np.ndarray:
    """argmax_lowest of each row of logits (T, V)."""
    return np.array([argmax_lowest(row) for row in np.atleast_2d(logits)], dtype=np.int64)


def generate(mp: ModelParams, cfg: Config, prompt, n_new: int) -> list[int]:
    """Greedy decoding: the prompt (a new sequence), then ``n_new`` tokens each fed back.
    Returns the generated ids (n_new)."""
    return greedy(lambda st, tok, tr: model_step(mp, cfg, st, tok, tr), lambda: ModelState.zeros(cfg),
                  argmax_lowest, prompt, n_new, "generate")
