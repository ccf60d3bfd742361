"""Error of the integer model against the float model, per token.

The same float input sequence goes to the float model and, quantised to the
residual format, to the integer model; outputs are dequantised with the
calibrated scales and compared token by token (cosine similarity, max abs
error).  Calibration uses other sequences than the evaluation (different token
seeds) with the same channel profile: the model's, ``param_seed``.

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
from model import float_layer as fl
from model.int_layer import int_run_layer, quantize_input
from model.params import random_inputs, random_params
from model.quantize import calibration_sequences, quantize_layer

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
    """Run both models on one evaluation sequence; returns per-token arrays and a summary.

    The layer is ``random_params(cfg, param_seed)``, or ``params`` (a checkpoint: then
    ``param_seed`` only picks the channel profile of the synthetic inputs).  Calibration
    and evaluation inputs share that profile (``model_seed=param_seed``)."""
    params = random_params(cfg, seed=param_seed) if params is None else params
    qp = quantize_layer(params, cfg, calibration_sequences(cfg, n_seq=n_calib, n_tokens=n_tokens,
                                                           model_seed=param_seed))
    xs = random_inputs(cfg, n_tokens, seed=eval_seed, model_seed=param_seed)
    ftr, itr = [], []
    fl.run_layer(params, cfg, xs, traces=ftr)
    int_run_layer(qp, cfg, quantize_input(xs, qp, cfg), traces=itr)
    matched = []
    fl.run_layer(params, cfg, xs, traces=matched, selects=[t["idx"] for t in itr])
    flips = np.array([sorted(a["idx"].tolist()) != sorted(b["idx"].tolist()) for a, b in zip(ftr, itr)])
    gaps, margins = flip_gaps(params, cfg, ftr, itr)
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
    summary["flip_gap_max"] = float(gaps.max()) if n_tokens else 0.0
    summary["topk_margin_median"] = float(np.median(margins)) if n_tokens else 0.0
    summary["flips_float_router_on_int_h"] = flips_float_router
    summary["float_perturbed_flips"] = {f"2^-{b}": n for b, n in perturbed_flips.items()}
    summary["n_tokens"] = n_tokens
    return {"summary": summary, "per_token": per_token, "flips": flips, "flip_gap": gaps,
            "topk_margin": margins, "qparams": qp}


def flip_gaps(params, cfg: Config, ftr, itr):
    """Per token, how far the integer model's expert set is from a valid float choice:
    ``gap = c_k - min(c[I])`` with ``c`` the float model's choice values (score + bias),
    ``c_k`` its k-th largest and ``I`` the integer model's experts; 0 when the integer
    set is a float top-k (every unflipped token), small for a near-tie.  Also the float
    top-k margin ``c_k - c_(k+1)`` of every token, the scale a gap compares with."""
    k, E = cfg.model.top_k, cfg.model.n_experts
    gaps, margins = [], []
    for a, b in zip(ftr, itr):
        c = np.asarray(a["score"], np.float64) + params.moe.router_bias
        srt = np.sort(c)[::-1]
        gaps.append(max(0.0, float(srt[k - 1] - c[np.asarray(b["idx"])].min())))
        margins.append(float(srt[k - 1] - srt[k]) if k < E else np.inf)
    return np.array(gaps), np.array(margins)


# tensors of the multi-pair table (docs/numerics.md section 5)
PAIR_TENSORS = ("y", "y_matched", "h", "kda_out", "moe_out_matched", "S")


def evaluate_pairs(cfg: Config, pairs, n_tokens: int = 256) -> list[dict]:
    """``evaluate`` on every (param_seed, eval_seed) of ``pairs``: their summaries."""
    out = []
    for p, e in pairs:
        s = evaluate(cfg, n_tokens=n_tokens, param_seed=p, eval_seed=e)["summary"]
        out.append({"param_seed": p, "eval_seed": e, **s})
    return out


def pairs_markdown(cfg_name: str, summaries: list[dict]) -> str:
    """One row per pair, then min / mean / tokens below 0.99 per tensor over all pairs."""
    n = summaries[0]["n_tokens"]
    rows = [f"| config | P | E | {' | '.join(t + ' min' for t in PAIR_TENSORS)} | flips | max flip gap |",
            "|---|---|---|" + "---|" * (len(PAIR_TENSORS) + 2)]
    for s in summaries:
        rows.append(f"| {cfg_name} | {s['param_seed']} | {s['eval_seed']} | "
                    + " | ".join(f"{s[t]['cos_min']:.4f}" for t in PAIR_TENSORS)
                    + f" | {s['routing_flips']} | {s['flip_gap_max']:.4f} |")
    rows += ["", f"Over the {len(summaries)} pairs ({len(summaries)} x {n} tokens):", "",
             "| config | tensor | cos min | cos mean | tokens < 0.99 | pairs with a token < 0.99 |",
             "|---|---|---|---|---|---|"]
    for t in PAIR_TENSORS:
        below = [s[t]["tokens_below_0.99"] for s in summaries]
        rows.append(f"| {cfg_name} | {t} | {min(s[t]['cos_min'] for s in summaries):.4f} | "
                    f"{np.mean([s[t]['cos_mean'] for s in summaries]):.5f} | {sum(below)}/{len(summaries) * n} | "
                    f"{sum(b > 0 for b in below)}/{len(summaries)} |")
    flips = sum(s["routing_flips"] for s in summaries)
    rows += ["", f"Routing flips: {flips}/{len(summaries) * n} tokens (max {max(s['routing_flips'] for s in summaries)}"
             f"/{n} in one pair); largest flip gap {max(s['flip_gap_max'] for s in summaries):.4f} "
             f"(median float top-k margin {np.median([s['topk_margin_median'] for s in summaries]):.4f})."]
    return "\n".join(rows)


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
