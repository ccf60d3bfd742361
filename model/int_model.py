"""Integer model of the whole language model: the contract of the model chip (issue 14).

    x_0    = emb[token]                                     int8 table entry, as a resid_bits value
    x_l+1  = int_layer_step(layer l, x_l)                   l = 0 .. L-1, own QLayer and IntKDAState
    fn_u   = int_rmsnorm(x_L, final_norm)                   int8 (unit RMS)
    fn     = sat8(round_shift(fn_u * norm_w, norm_w_shift)) int8 (final-norm weight; identity when untied)
    logits = requantize(W @ fn, head_m, head_s, resid_bits) W = lm_head (V, d) int8, or emb when tied
    next   = int_argmax(logits)                             the lowest index of the largest logit

Every layer is model/int_layer.py's ``int_layer_step`` itself; the integer y of layer
l is the x of layer l+1 unchanged (the quantiser gives them one scale).  Decode: one token
id at a time, every layer's KDA state (and short-conv history) carried; a reset before a
token clears every layer's.  With vocab = 0 there is no embedding or head (``int_run_stack``:
resid_bits streams in and out; one layer = ``int_run_layer``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moekda.config import Config
from moekda.formats import formats_for
from moekda.numerics import requantize, round_shift, saturate
from model.int_attn_res import IntDepthResidual
from model.int_kda import IntKDAState
from model.int_mla import IntMLACache
from model.int_layer import int_channel_mix, int_layer_step, int_token_mix
from model.int_ops import check_width, int_rmsnorm
from model.qparams import QHead, QModel
from model.sequence import greedy, run_sequence


def int_argmax(logits) -> int:
    """The next token id: the index of the largest integer logit; on a tie the lowest index
    (a scan from index 0 that replaces the running best only on a strictly larger value)."""
    return int(np.argmax(np.asarray(logits, dtype=np.int64)))


def int_next_tokens(logits) -> np.ndarray:
    """int_argmax of every row (the last axis): (T, V) -> (T,), (n, T, V) -> (n, T)."""
    return np.argmax(np.atleast_2d(np.asarray(logits, dtype=np.int64)), axis=-1)


@dataclass
class IntModelState:
    layers: list

    @classmethod
    def zeros(cls, cfg: Config, batch: tuple = ()) -> "IntModelState":
        return cls([IntMLACache() if kind == "mla" else IntKDAState.zeros(cfg, batch) for kind in cfg.model.layers])


def int_embed(qh: QHead, cfg: Config, token) -> np.ndarray:
    """The table entry of a token id (or of an array of ids: one row each)."""
    tok = np.asarray(token, dtype=np.int64)
    bad = tok[(tok < 0) | (tok >= cfg.model.vocab)]
    if bad.size:
        raise ValueError(f"token id {int(bad.flat[0])}: allowed range is 0 to {cfg.model.vocab - 1} (model.vocab)")
    return qh.emb[tok].astype(np.int64)


def int_head_step(qh: QHead, cfg: Config, xL, trace=None) -> np.ndarray:
    """Final norm, its weight and the LM head: resid_bits logits (V,)."""
    fm = formats_for(cfg)
    t = trace if trace is not None else {}
    t["fn_unit"] = int_rmsnorm(xL, qh.final_norm, fm)
    prod = check_width(t["fn_unit"] * qh.norm_w, fm.act_bits + fm.resid_bits - 1, "final norm weight product")
    t["fn"] = saturate(round_shift(prod, qh.norm_w_shift), fm.act_bits)
    w = qh.emb if qh.lm_head is None else qh.lm_head
    acc = check_width(t["fn"] @ w.T, fm.acc_bits, "LM head accumulator")
    t["logits"] = requantize(acc, qh.head_m, qh.head_s, fm.resid_bits)
    return t["logits"]


def int_attn_res_stack_step(qm: QModel, cfg: Config, state: IntModelState, x, t: dict):
    """The stack with Attention Residuals: each sub-layer's input from the kept values
    (int_attn_res.IntDepthResidual), normalised by the layer's RMSNorm; its output kept."""
    fm = formats_for(cfg)
    r = IntDepthResidual(qm.attn_res, cfg, x)
    new = []
    for l, (q, st) in enumerate(zip(qm.layers, state.layers)):
        tr = {"x": r.input(2 * l + 1)}
        tr["xn_unit"] = int_rmsnorm(tr["x"], q.attn_norm, fm)
        st, out = int_token_mix(q, cfg, fm, st, tr["xn_unit"], tr)
        r.add(2 * l + 1, out)
        tr["h"] = r.input(2 * l + 2)
        tr["hn_unit"] = int_rmsnorm(tr["h"], q.mlp_norm, fm)
        r.add(2 * l + 2, int_channel_mix(q, cfg, fm, tr["hn_unit"], tr))
        new.append(st)
        t["layers"].append(tr)
    t["xL"] = r.output()
    return IntModelState(new), t["xL"]


def int_stack_step(qm: QModel, cfg: Config, state: IntModelState, x, trace=None):
    """x_0 (d,) resid_bits through the L layers. Returns (state, x_L)."""
    t = trace if trace is not None else {}
    t["x0"] = x
    t["layers"] = []
    if qm.attn_res is not None:
        return int_attn_res_stack_step(qm, cfg, state, x, t)
    new = []
    for q, st in zip(qm.layers, state.layers):
        tr = {}
        st, x = int_layer_step(q, cfg, st, x, tr)
        new.append(st)
        t["layers"].append(tr)
    t["xL"] = x
    return IntModelState(new), x


def int_model_step(qm: QModel, cfg: Config, state: IntModelState, token, trace=None):
    """One token id. Returns (state, logits (V,) resid_bits)."""
    state, xL = int_stack_step(qm, cfg, state, int_embed(qm.head, cfg, token), trace)
    return state, int_head_step(qm.head, cfg, xL, trace)


def int_run_model(qm: QModel, cfg: Config, tokens, resets=None, traces: list | None = None) -> np.ndarray:
    """Token ids (T,) teacher-forced: integer logits (T, V).  ``resets[t]``: a new sequence at
    token t.  One trace dict per token appended to ``traces``.

    Token ids (n, T): n sequences of one length, each from a zero state, run side by side
    (every array gets a leading axis; the same integers as n runs): logits (n, T, V)."""
    if qm.head is None:
        raise ValueError(f"config {cfg.name}: vocab = 0, no tokens (int_run_stack takes residual streams)")
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim == 2:
        if resets is not None or traces is not None:
            raise ValueError("int_run_model: a batch of sequences takes no resets or traces")
        n, T = tokens.shape
        out = run_sequence(lambda st, tok, tr: int_model_step(qm, cfg, st, tok, tr),
                           lambda: IntModelState.zeros(cfg, (n,)), tokens.T,
                           np.zeros((T, n, cfg.model.vocab), dtype=np.int64))
        return out.transpose(1, 0, 2)
    return run_sequence(lambda st, tok, tr: int_model_step(qm, cfg, st, tok, tr), lambda: IntModelState.zeros(cfg),
                        tokens, np.zeros((len(tokens), cfg.model.vocab), dtype=np.int64), resets, traces)


def int_run_stack(qm: QModel, cfg: Config, xs, resets=None, traces: list | None = None) -> np.ndarray:
    """The layers alone on resid_bits inputs xs (T, d): x_L (T, d)."""
    xs = np.asarray(xs, dtype=np.int64)
    return run_sequence(lambda st, x, tr: int_stack_step(qm, cfg, st, x, tr), lambda: IntModelState.zeros(cfg),
                        xs, np.zeros_like(xs), resets, traces)


def int_generate(qm: QModel, cfg: Config, prompt, n_new: int) -> list[int]:
    """Greedy decoding on the integer model: the prompt as a new sequence, then ``n_new``
    ids each fed back (what ``moekda run --prompt-ids`` will compare the chip against)."""
    return greedy(lambda st, tok, tr: int_model_step(qm, cfg, st, tok, tr), lambda: IntModelState.zeros(cfg),
                  int_argmax, prompt, n_new, "int_generate")


def dequantize_logits(qm: QModel, logits) -> np.ndarray:
    return np.asarray(logits, dtype=np.float64) * qm.scales["logits"]
