"""`moekda accuracy`: error of the integer layer model against the float model.

Quantises the seeded random layer (calibrated on other sequences), runs both
models on an evaluation sequence and prints the per-token error table; writes
build/<cfg>/reports/accuracy.json (summary, formats, per-token cosines) and
accuracy.md.  ``--check`` exits 1 when the target (cosine >= --min-cos at every
token of the routing-matched layer output) is missed.  ``--pairs N`` evaluates the
N seed pairs (--param-seed + i, --eval-seed + i) instead and prints one row per pair
and min / mean / tokens below 0.99 over all of them (accuracy_pairs.{json,md}).
Calibration always uses the channel profile of --param-seed (with --params, a
checkpoint without a seed, --param-seed only picks that profile, default 0).
"""
from __future__ import annotations

import dataclasses
import json

from cli import UserError
from moekda.config import load_config
from moekda.formats import formats_for

TARGET_TENSOR = "y_matched"


def load_checkpoint(path, cfg):
    """Float parameters from --params, or None for the seeded random layer; bad files are user errors."""
    if path is None:
        return None
    from model.params import load_params
    try:
        return load_params(path, cfg)
    except ValueError as e:      # the reader's one line names the file and what is wrong
        raise UserError(f"--params: {e}" if str(path) in str(e) else f"--params {path}: {e}") from None


def configure(p):
    p.add_argument("-n", "--tokens", type=int, default=256, help="evaluation sequence length (default 256)")
    p.add_argument("--param-seed", type=int, default=0,
                   help="seed of the random layer parameters and of the inputs' channel profile "
                        "(calibration and evaluation); with --params, only the profile (default 0)")
    p.add_argument("--params", default=None,
                   help="float checkpoint (.npz or .safetensors, names of LayerParams.to_flat) instead of random")
    p.add_argument("--eval-seed", type=int, default=1, help="seed of the evaluation sequence")
    p.add_argument("--pairs", type=int, default=None, metavar="N",
                   help="evaluate N seed pairs (--param-seed + i, --eval-seed + i), print the table over all")
    p.add_argument("--min-cos", type=float, default=0.99, help="target cosine at every token (default 0.99)")
    p.add_argument("--check", action="store_true", help=f"exit 1 if {TARGET_TENSOR} misses --min-cos at any token")
    p.add_argument("-o", "--out", default=None, help="report directory (default build/<cfg>/reports)")


def run(args) -> int:
    from pathlib import Path

    from flow.paths import BuildPaths
    from model.accuracy import evaluate, markdown_table

    if not 1 <= args.tokens <= 100_000:
        raise UserError(f"--tokens = {args.tokens}: allowed range is 1 to 100000")
    if not 0.0 < args.min_cos <= 1.0:
        raise UserError(f"--min-cos = {args.min_cos}: allowed range is (0, 1]")
    cfg = load_config(args.config)
    if cfg.model.moe_latent:
        # the layer's error table is built around a plain MoE (its router, the routing flips)
        raise UserError(f"config {cfg.name}: model.moe_latent = {cfg.model.moe_latent} (LatentMoE); moekda accuracy "
                        f"evaluates a layer with a plain MoE or a dense mixer; for this model: "
                        f"python -m model.model_accuracy -c {args.config}")
    if args.pairs is not None:
        return run_pairs(args, cfg)
    params = load_checkpoint(args.params, cfg)
    res = evaluate(cfg, n_tokens=args.tokens, param_seed=args.param_seed, eval_seed=args.eval_seed, params=params)
    s = res["summary"]
    table = markdown_table({cfg.name: s})
    print(table)
    out = Path(args.out) if args.out else BuildPaths.for_config(cfg).reports
    out.mkdir(parents=True, exist_ok=True)
    cmd = (f"moekda accuracy -c {args.config} -n {args.tokens} --param-seed {args.param_seed} "
           f"--eval-seed {args.eval_seed}" + (f" --params {args.params}" if args.params else ""))
    payload = {"config": cfg.name, "config_hash": cfg.hash(), "command": cmd, "summary": s,
               "formats": dataclasses.asdict(formats_for(cfg)),
               "calibrated": {k: int(getattr(res["qparams"].kda, k)) for k in ("f_q", "f_k", "f_v", "f_s", "o_shift")},
               "per_token_cos": {k: [round(float(c), 6) for c in v["cos"]] for k, v in res["per_token"].items()},
               "routing_flip_tokens": [int(i) for i in res["flips"].nonzero()[0]]}
    (out / "accuracy.json").write_text(json.dumps(payload, indent=1))
    (out / "accuracy.md").write_text(f"# Integer vs float accuracy: {cfg.name}\n\nCommand: `{cmd}`\n\n{table}\n")
    ok = s[TARGET_TENSOR]["cos_min"] >= args.min_cos
    print(f"\n{TARGET_TENSOR}: min cosine {s[TARGET_TENSOR]['cos_min']:.4f} "
          f"({'meets' if ok else 'MISSES'} {args.min_cos}); plain y min {s['y']['cos_min']:.4f} "
          f"with {s['routing_flips']} routing flips; wrote {out / 'accuracy.json'}")
    return 1 if (args.check and not ok) else 0


def run_pairs(args, cfg) -> int:
    from pathlib import Path

    from flow.paths import BuildPaths
    from model.accuracy import evaluate_pairs, pairs_markdown

    if not 1 <= args.pairs <= 10_000:
        raise UserError(f"--pairs = {args.pairs}: allowed range is 1 to 10000")
    if args.params:
        raise UserError("--pairs evaluates seeded random layers: it takes no --params")
    pairs = [(args.param_seed + i, args.eval_seed + i) for i in range(args.pairs)]
    summaries = evaluate_pairs(cfg, pairs, n_tokens=args.tokens)
    table = pairs_markdown(cfg.name, summaries)
    print(table)
    out = Path(args.out) if args.out else BuildPaths.for_config(cfg).reports
    out.mkdir(parents=True, exist_ok=True)
    cmd = (f"moekda accuracy -c {args.config} -n {args.tokens} --param-seed {args.param_seed} "
           f"--eval-seed {args.eval_seed} --pairs {args.pairs}")
    (out / "accuracy_pairs.json").write_text(json.dumps(
        {"config": cfg.name, "config_hash": cfg.hash(), "command": cmd, "pairs": summaries}, indent=1))
    (out / "accuracy_pairs.md").write_text(f"# Integer vs float accuracy over seed pairs: {cfg.name}\n\n"
                                           f"Command: `{cmd}`\n\n{table}\n")
    missed = [(s["param_seed"], s["eval_seed"]) for s in summaries if s[TARGET_TENSOR]["cos_min"] < args.min_cos]
    print(f"\n{TARGET_TENSOR}: {len(pairs) - len(missed)}/{len(pairs)} pairs meet {args.min_cos} at every token"
          + (f"; missed by (P, E) = {', '.join(map(str, missed))}" if missed else "")
          + f"; wrote {out / 'accuracy_pairs.json'}")
    return 1 if (args.check and missed) else 0
