"""Integer model of the stack against its float model: next-token agreement and logits error.

    .venv/bin/python -m model.model_accuracy -c model-tiny --param-seed 400 --eval-seed 600 --pairs 12

Pair i is the model ``random_model_params(cfg, P + i)``, quantised on its own calibration
tokens (seeds 1000..1003, ``quantize_random_model``), and evaluated teacher-forced on the
token sequence ``random_tokens(cfg, T, seed=E + i, model_seed=P + i)`` (never a calibration
one).  Per pair: top-1 agreement (integer argmax == float argmax), cosine of the
dequantised integer logits against the float logits (per token: min, mean), each layer's
output cosine and routing flips (the integer top-k set differs from the float one), the
float logit margin (top-1 minus top-2) at all tokens and at the disagreements, and, for
scale, the float model against itself with only its embedding rounded to the int8 table
(``float_int8_emb_agree``) and with its embedding perturbed by a random relative 2^-5
(``float_noise_agree``: how sensitive the model's argmax is).  Writes JSON with -o.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np

from moekda.config import ConfigError, load_config, with_settings
from model.float_model import next_tokens, run_model
from model.int_model import dequantize_logits, int_next_tokens, int_run_model
from model.params import random_model_params, random_tokens
from model.quantize import quantize_model


def _cos_rows(a, b):
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    return np.sum(a * b, axis=1) / np.maximum(na * nb, 1e-30)


def evaluate_model(cfg, param_seed: int, eval_seed: int, n_tokens: int = 256, noise_bits: int | None = 5) -> dict:
    mp = random_model_params(cfg, param_seed)
    qm = quantize_model(mp, cfg, model_seed=param_seed)
    toks = random_tokens(cfg, n_tokens, seed=eval_seed, model_seed=param_seed)
    tf, ti = [], []
    lf = run_model(mp, cfg, toks, traces=tf)
    li = int_run_model(qm, cfg, toks, traces=ti)
    nf, ni = next_tokens(lf), int_next_tokens(li)
    cos = _cos_rows(lf, dequantize_logits(qm, li))
    srt = np.sort(lf, axis=1)
    margin = srt[:, -1] - srt[:, -2]
    dis = nf != ni
    layers = []
    for l, q in enumerate(qm.layers):
        # a layer's output; with Attention Residuals there is none (no residual add): its
        # channel mixer's input h, the mix the layer reads
        key = "y" if "y" in tf[0]["layers"][l] else "h"
        yf = np.stack([t["layers"][l][key] for t in tf])
        yi = np.stack([t["layers"][l][key] for t in ti]) * q.scales[key]
        c = _cos_rows(yf, yi)
        flips = 0
        if q.moe is not None:
            flips = int(sum(set(map(int, a["layers"][l]["idx"])) != set(map(int, b["layers"][l]["idx"]))
                            for a, b in zip(tf, ti)))
        layers.append({"layer": l, "mixer": q.mixer, "y_cos_min": float(c.min()), "y_cos_mean": float(c.mean()),
                       "flips": flips})
    out = {"config": cfg.name, "param_seed": param_seed, "eval_seed": eval_seed, "tokens": n_tokens,
           "agree": float(np.mean(~dis)), "disagree": int(dis.sum()),
           "logits_cos_min": float(cos.min()), "logits_cos_p1": float(np.percentile(cos, 1)),
           "logits_cos_mean": float(cos.mean()), "margin_median": float(np.median(margin)),
           "margin_median_at_disagree": float(np.median(margin[dis])) if dis.any() else None,
           "logit_std": float(lf.std()), "layers": layers}
    if noise_bits is not None:
        # the float model with only its embedding rounded to the integer model's int8 table
        emb8 = copy.deepcopy(mp)
        emb8.embedding = qm.head.emb * qm.scales["emb"]
        out["float_int8_emb_agree"] = float(np.mean(next_tokens(run_model(emb8, cfg, toks)) == nf))
        noisy = copy.deepcopy(mp)
        rng = np.random.default_rng([param_seed, eval_seed, noise_bits])
        noisy.embedding = mp.embedding * (1.0 + rng.uniform(-1.0, 1.0, mp.embedding.shape) * 2.0 ** -noise_bits)
        out["float_noise_bits"] = noise_bits
        out["float_noise_agree"] = float(np.mean(next_tokens(run_model(noisy, cfg, toks)) == nf))
    return out


def summary(rows: list[dict]) -> dict:
    tot = sum(r["tokens"] for r in rows)
    return {"pairs": len(rows), "tokens": tot,
            "agree": float(sum(r["agree"] * r["tokens"] for r in rows) / tot),
            "agree_min": min(r["agree"] for r in rows), "agree_max": max(r["agree"] for r in rows),
            "logits_cos_min": min(r["logits_cos_min"] for r in rows),
            "logits_cos_mean": float(np.mean([r["logits_cos_mean"] for r in rows])),
            "logits_cos_mean_min": min(r["logits_cos_mean"] for r in rows),
            "float_noise_agree": float(np.mean([r.get("float_noise_agree", np.nan) for r in rows])),
            "float_int8_emb_agree": float(np.mean([r.get("float_int8_emb_agree", np.nan) for r in rows])),
            "layer_y_cos_mean": [float(np.mean([r["layers"][l]["y_cos_mean"] for r in rows]))
                                 for l in range(len(rows[0]["layers"]))],
            "layer_flips": [int(sum(r["layers"][l]["flips"] for r in rows)) for l in range(len(rows[0]["layers"]))]}


def markdown(rows: list[dict]) -> str:
    lines = ["| config | P | E | top-1 agree | logits cos min | logits cos mean | layer y cos mean (0..L-1) | "
             "flips per layer | float margin median / at disagreements | float, int8 embedding | float, 2^-5 embedding |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ys = " / ".join(f"{x['y_cos_mean']:.4f}" for x in r["layers"])
        fl_ = " / ".join(str(x["flips"]) for x in r["layers"])
        md = r["margin_median_at_disagree"]
        lines.append(f"| {r['config']} | {r['param_seed']} | {r['eval_seed']} | {r['agree']:.3f} | "
                     f"{r['logits_cos_min']:.4f} | {r['logits_cos_mean']:.4f} | {ys} | {fl_} | "
                     f"{r['margin_median']:.2f} / {'-' if md is None else f'{md:.2f}'} | "
                     f"{r.get('float_int8_emb_agree', float('nan')):.3f} | "
                     f"{r.get('float_noise_agree', float('nan')):.3f} |")
    return "\n".join(lines)


def study_args(argv, prog: str, doc: str, config: str, param_seed: int, eval_seed: int):
    """The command line every seed-pair study of a model config shares (this one and
    model/mx_accuracy.py): (args, config), or (None, None) after a one-line error."""
    ap = argparse.ArgumentParser(prog=f"python -m model.{prog}", description=doc.split("\n\n")[0])
    ap.add_argument("-c", "--config", default=config)
    ap.add_argument("--param-seed", type=int, default=param_seed)
    ap.add_argument("--eval-seed", type=int, default=eval_seed)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="replace a config field (repeatable), e.g. model.moe_latent=8")
    ap.add_argument("-o", "--output", help="JSON file for the rows and the summary")
    args = ap.parse_args(argv)
    try:
        cfg = with_settings(load_config(args.config), args.set)
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return None, None
    if cfg.model.vocab == 0:
        print(f"{prog}: error: config {cfg.name} has no vocabulary (model.vocab = 0)", file=sys.stderr)
        return None, None
    return args, cfg


def report_study(args, rows: list, s: dict) -> int:
    """Print a study's summary and write its rows and summary to ``--output`` if given."""
    print(json.dumps(s, indent=1))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({"rows": rows, "summary": s}, indent=1))
    return 0


def main(argv=None) -> int:
    args, cfg = study_args(argv, "model_accuracy", __doc__, "model-tiny", 400, 600)
    if cfg is None:
        return 2
    rows = [evaluate_model(cfg, args.param_seed + i, args.eval_seed + i, args.tokens) for i in range(args.pairs)]
    print(markdown(rows))
    return report_study(args, rows, summary(rows))


if __name__ == "__main__":
    sys.exit(main())
