"""MXFP4 routed experts against int8 (issue 48): per-matrix error and the stack's logits.

    .venv/bin/python -m model.mx_accuracy -c model-tiny-mxfp4 --param-seed 700 --eval-seed 800 --pairs 8

Pair i is the model ``random_model_params(cfg, P + i)`` evaluated teacher-forced on
``random_tokens(cfg, T, seed=E + i, model_seed=P + i)``, as model/model_accuracy.py
does.  Variants (the same float model, each quantised on its own calibration run):

* ``int8``: every format int8 (today's chip);
* ``mxfp4``: the routed experts' W1/W2/W3 in MXFP4, their inputs int8;
* ``mxfp4+mxfp8``: and their inputs MXFP8 E4M3 (the config's formats when it asks for both);
* ``float-mxfp4``: the float model with its routed experts' weights replaced by their MXFP4
  values (the format's own error, with no integer arithmetic).

Per matrix (routed experts, every MoE layer, the matrices as the integer model quantises
them: the norm weight folded into W1/W3): relative Frobenius error of the weights, and of the
outputs W x on the pair's float activations (x = the experts' input for W1/W3, the SwiGLU
hidden for W2), int8 per matrix against MXFP4.  Per variant: top-1 agreement with the float
model and the logits cosine (dequantised integer logits).
"""
from __future__ import annotations

import copy
import sys

import numpy as np

from moekda import mx
from moekda.config import with_settings
from moekda.formats import formats_for
from model.float_model import next_tokens, run_model
from model.float_ops import silu
from model.int_model import dequantize_logits, int_next_tokens, int_run_model
from model.model_accuracy import report_study, study_args
from model.params import random_model_params, random_tokens
from model.quantize import quant_weight, quant_weight_mxfp4, quantize_model

VARIANTS = {"int8": ('formats.routed_expert_weights="int8"', 'formats.expert_inputs="int8"'),
            "mxfp4": ('formats.routed_expert_weights="mxfp4"', 'formats.expert_inputs="int8"'),
            "mxfp4+mxfp8": ('formats.routed_expert_weights="mxfp4"', 'formats.expert_inputs="mxfp8_e4m3"')}


def _cos_rows(a, b):
    return np.sum(a * b, axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))


def _routed(lp):
    """The routed experts' params of a layer (MoE or LatentMoE) or None."""
    return lp.moe if lp.moe is not None else lp.lmoe


def matrix_errors(mp, cfg, traces) -> list[dict]:
    """Per routed-expert matrix: weight and output relative errors, int8 and MXFP4."""
    fm = formats_for(cfg)
    rows = []
    for l, lp in enumerate(mp.layers):
        p = _routed(lp)
        if p is None:
            continue
        hn = np.stack([t["layers"][l]["hn_unit"] for t in traces]) * lp.mlp_norm_w[None, :]
        if lp.lmoe is not None:
            x, wn = hn @ p.w_lat_down.T, np.ones((1, p.w_lat_down.shape[0]))
        else:
            x, wn = hn, lp.mlp_norm_w[None, :]
        for e in range(p.w_gate.shape[0]):
            hid = silu(x @ (p.w_gate[e] * wn).T) * (x @ (p.w_up[e] * wn).T)
            for name, w, xin in (("w1", p.w_gate[e] * wn, x), ("w3", p.w_up[e] * wn, x), ("w2", p.w_down[e], hid)):
                q8, s8 = quant_weight(w, fm)
                w8 = q8 * s8
                qh, sb, sf, _ = quant_weight_mxfp4(w, fm)
                w4 = qh * 0.5 * np.repeat(mx.e8m0_decode(sb), fm.mx_block, axis=-1)[:, :w.shape[1]]
                rows.append({"layer": l, "expert": e, "matrix": name,
                             "w_int8": _rel(w, w8), "w_mxfp4": _rel(w, w4),
                             "out_int8": _rel(xin @ w.T, xin @ w8.T), "out_mxfp4": _rel(xin @ w.T, xin @ w4.T),
                             "clamped_blocks": int(np.sum(mx.block_scale_bytes(w, "e2m1", fm.mx_block) < sf))})
    return rows


def mxfp4_float_params(mp, cfg):
    """The float model with its routed experts' W1/W2/W3 replaced by their MXFP4 values (the
    integer model's quantisation: norm weight folded, floor as quant_weight_mxfp4; unfolded after)."""
    fm = formats_for(cfg)
    out = copy.deepcopy(mp)
    for lp, lq in zip(mp.layers, out.layers):
        p, q = _routed(lp), _routed(lq)
        if p is None:
            continue
        wn = np.ones((1, p.w_gate.shape[2])) if lp.lmoe is not None else lp.mlp_norm_w[None, :]
        for name, fold in (("w_gate", wn), ("w_up", wn), ("w_down", None)):
            ws = getattr(p, name)
            new = np.empty_like(ws)
            for e in range(ws.shape[0]):
                w = ws[e] * fold if fold is not None else ws[e]
                qh, sb, _, _ = quant_weight_mxfp4(w, fm)
                deq = qh * 0.5 * np.repeat(mx.e8m0_decode(sb), fm.mx_block, axis=-1)[:, :w.shape[1]]
                new[e] = deq / fold if fold is not None else deq
            setattr(q, name, new)
    return out


def evaluate_pair(cfg, param_seed: int, eval_seed: int, n_tokens: int = 256) -> dict:
    mp = random_model_params(cfg, param_seed)
    toks = random_tokens(cfg, n_tokens, seed=eval_seed, model_seed=param_seed)
    tf = []
    lf = run_model(mp, cfg, toks, traces=tf)
    nf = next_tokens(lf)
    out = {"param_seed": param_seed, "eval_seed": eval_seed, "tokens": n_tokens,
           "matrices": matrix_errors(mp, cfg, tf), "variants": {}}
    l4 = run_model(mxfp4_float_params(mp, cfg), cfg, toks)
    out["variants"]["float-mxfp4"] = {"agree": float(np.mean(next_tokens(l4) == nf)),
                                      "logits_cos_mean": float(_cos_rows(lf, l4).mean()),
                                      "logits_cos_min": float(_cos_rows(lf, l4).min())}
    for name, sets in VARIANTS.items():
        c = with_settings(cfg, sets)
        qm = quantize_model(mp, c, model_seed=param_seed)
        li = int_run_model(qm, c, toks)
        cos = _cos_rows(lf, dequantize_logits(qm, li))
        out["variants"][name] = {"agree": float(np.mean(int_next_tokens(li) == nf)),
                                 "logits_cos_mean": float(cos.mean()), "logits_cos_min": float(cos.min())}
    return out


def summary(rows: list[dict]) -> dict:
    mats = [m for r in rows for m in r["matrices"]]
    s = {"pairs": len(rows), "tokens": sum(r["tokens"] for r in rows), "matrices": {}}
    for name in ("w1", "w3", "w2"):
        ms = [m for m in mats if m["matrix"] == name]
        s["matrices"][name] = {k: float(np.mean([m[k] for m in ms])) for k in ("w_int8", "w_mxfp4", "out_int8",
                                                                               "out_mxfp4")}
        s["matrices"][name]["out_mxfp4_max"] = float(max(m["out_mxfp4"] for m in ms))
        s["matrices"][name]["clamped_blocks"] = int(sum(m["clamped_blocks"] for m in ms))
    for v in rows[0]["variants"]:
        vs = [r["variants"][v] for r in rows]
        s[v] = {"agree": float(np.mean([x["agree"] for x in vs])), "agree_min": min(x["agree"] for x in vs),
                "agree_max": max(x["agree"] for x in vs),
                "logits_cos_mean": float(np.mean([x["logits_cos_mean"] for x in vs])),
                "logits_cos_mean_min": min(x["logits_cos_mean"] for x in vs),
                "logits_cos_min": min(x["logits_cos_min"] for x in vs)}
    return s


def main(argv=None) -> int:
    args, cfg = study_args(argv, "mx_accuracy", __doc__, "model-tiny-mxfp4", 700, 800)
    if cfg is None:
        return 2
    rows = []
    for i in range(args.pairs):
        rows.append(evaluate_pair(cfg, args.param_seed + i, args.eval_seed + i, args.tokens))
        v = rows[-1]["variants"]
        print(f"pair P={args.param_seed + i} E={args.eval_seed + i}: " + ", ".join(
            f"{k} agree {x['agree']:.3f} cos {x['logits_cos_mean']:.4f}" for k, x in v.items()), flush=True)
    return report_study(args, rows, summary(rows))


if __name__ == "__main__":
    sys.exit(main())
