"""Error of the integer model against the float model, per token.

The same float input sequence goes to the float model and, quantised to the
residual format, to the integer model; outputs are dequantised with the
calibrated scales and compared token by token (cosine similarity, max abs
error).  Calibration uses other sequences than the evaluation (different seeds).

Because top-k routing is discontinuous, a token whose top-k set differs
between the two models (a "routing flip", always a near-tie in the float
scores) can differ by a whole expert.  The report therefore also gives the
float model re-run with the integer model's expert choice ("routing matched"),
which isolates the arithmetic error from the flips, and the float model's own
sensitivity: the number of flips of the float model against itself when its
input is perturbed by a random relative error of 2**-b, for several b
("float_perturbed_flips"): how precise the router's input must be for no flips.
"""
from __future__ import annotations

import numpy as np

from moekda.config import Config
from sim.models import float_layer as fl
from sim.models.int_layer import int_run_layer, quantize_input
from sim.models.params import random_inputs, random_params
from sim.models.quantize import calibration_sequences, quantize_layer

PERTURB_BITS = (5, 7, 9, 11)   # relative input perturbations of the float self-sensitivity runs

# tensor compared -> (float trace name, integer trace name)
COMPARED = {
    "y": ("y", "y"),            # layer output
    "h": ("h", "h"),            # after the KDA residual
    "kda_out": ("kda_out", "kda_out"),
    "moe_out": ("moe_out", "moe_out"),
    "S": ("S", "S"),            # KDA state
    "o": ("o", "o16"),          # KDA read before its norm
}


def cosine_rows(a, b):
    a = a.reshape(a.shape[0], -1)
    b = b.reshape(b.shape[0], -1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    both_zero = (na == 0) & (nb == 0)
    cos = np.sum(a * b, axis=1) / np.maximum(na * nb, 1e-300)
    return np.where(both_zero, 1.0, cos)


def _stack(traces, name):
    return np.stack([np.asarray(t[name], dtype=np.float64) for t in traces])


def evaluate(cfg: Config, n_tokens: int = 256, param_seed: int = 0, eval_seed: int = 1,
             n_calib: int = 4, params=None) -> dict:
    """Run both models on one evaluation sequence; returns per-token arrays and a summary."""
    params = random_params(cfg, seed=param_seed) if params is None else params
    qp = quantize_layer(params, cfg, calibration_sequences(cfg, n_seq=n_calib, n_tokens=n_tokens))
    xs = random_inputs(cfg, n_tokens, seed=eval_seed, model_seed=param_seed)
    ftr, itr = [], []
    fl.run_layer(params, cfg, xs, traces=ftr)
    int_run_layer(qp, cfg, quantize_input(xs, qp, cfg), traces=itr)
    matched = []
    fl.run_layer(params, cfg, xs, traces=matched, selects=[t["idx"] for t in itr])
    flips = np.array([sorted(a["idx"].tolist()) != sorted(b["idx"].tolist()) for a, b in zip(ftr, itr)])
    # the float router (float weights, exact norm and sigmoid) on the integer model's h:
    # the flips that remain with a perfect router, caused by the KDA branch's error in h
    m = cfg.model
    h_int = _stack(itr, "h") * qp.scales["h"]
    logits = fl.rms_unit(h_int, m.norm_eps) @ (params.moe.w_router * params.mlp_norm_w[None, :]).T
    choice = fl.sigmoid(logits) + params.moe.router_bias
    sel = np.sort(np.argsort(-choice, axis=1, kind="stable")[:, :m.top_k], axis=1)
    ref = np.array([np.sort(t["idx"]) for t in ftr])
    flips_float_router = int(np.any(sel != ref, axis=1).sum())
    rng = np.random.default_rng(eval_seed + 12345)
    noise = rng.uniform(-1, 1, xs.shape)
    perturbed_flips = {}
    for b in PERTURB_BITS:
        ptr = []
        fl.run_layer(params, cfg, xs * (1 + noise * 2.0 ** -b), traces=ptr)
        perturbed_flips[b] = int(sum(sorted(a["idx"].tolist()) != sorted(c["idx"].tolist())
                                     for a, c in zip(ftr, ptr)))
    per_token = {}
    for name, (fn, iname) in COMPARED.items():
        f = _stack(ftr, fn).reshape(n_tokens, -1)
        i = _stack(itr, iname).reshape(n_tokens, -1) * qp.scales[iname]
        per_token[name] = {"cos": cosine_rows(f, i),
                           "max_abs": np.max(np.abs(f - i), axis=1),
                           "ref_max_abs": np.max(np.abs(f), axis=1)}
    for name in ("y", "moe_out"):
        f = _stack(matched, name)
        i = _stack(itr, name) * qp.scales[name]
        per_token[name + "_matched"] = {"cos": cosine_rows(f, i),
                                        "max_abs": np.max(np.abs(f - i), axis=1),
                                        "ref_max_abs": np.max(np.abs(f), axis=1)}
    summary = {name: {"cos_min": float(v["cos"].min()), "cos_mean": float(v["cos"].mean()),
                      "cos_p1": float(np.percentile(v["cos"], 1)),
                      "tokens_below_0.99": int(np.sum(v["cos"] < 0.99)),
                      "max_abs_err": float(v["max_abs"].max()), "ref_max_abs": float(v["ref_max_abs"].max())}
               for name, v in per_token.items()}
    summary["routing_flips"] = int(flips.sum())
    summary["flips_float_router_on_int_h"] = flips_float_router
    summary["float_perturbed_flips"] = {f"2^-{b}": n for b, n in perturbed_flips.items()}
    summary["n_tokens"] = n_tokens
    return {"summary": summary, "per_token": per_token, "flips": flips, "qparams": qp}


def markdown_table(results: dict[str, dict]) -> str:
    """results: config name -> evaluate(...)["summary"]."""
    rows = ["| config | tensor | cos min | cos p1 | cos mean | tokens < 0.99 | max abs err | max abs ref |",
            "|---|---|---|---|---|---|---|---|"]
    for cfg_name, s in results.items():
        for name in ("y", "y_matched", "h", "kda_out", "moe_out", "moe_out_matched", "S", "o"):
            v = s[name]
            rows.append(f"| {cfg_name} | {name} | {v['cos_min']:.4f} | {v['cos_p1']:.4f} | {v['cos_mean']:.5f} | "
                        f"{v['tokens_below_0.99']}/{s['n_tokens']} | {v['max_abs_err']:.3g} | {v['ref_max_abs']:.3g} |")
    flips = ", ".join(f"{c}: {s['routing_flips']}/{s['n_tokens']}" for c, s in results.items())
    rows.append("")
    rows.append(f"Routing flips (top-k set differs from the float model): {flips}. With a float router "
                "on the integer h (the flips a perfect router would keep): "
                + ", ".join(f"{c}: {s['flips_float_router_on_int_h']}" for c, s in results.items()) + ".")
    rows.append("")
    rows.append("Flips of the float model against itself, input perturbed by a relative error of:")
    for c, s in results.items():
        rows.append(f"{c}: " + ", ".join(f"{k}: {n}" for k, n in s["float_perturbed_flips"].items()) + ".")
    return "\n".join(rows)
