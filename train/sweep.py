"""MQAR accuracy against the number of pairs and the sequence length, KDA against the
baseline without the delta rule (``--rule gla``), every point trained the same way.

    python -m train.sweep --pairs 2,4,8,12 --seq-lens 64 --out train/runs/mqar-sweep.json
    python -m train.sweep --pairs 4 --seq-lens 32,128 --out train/runs/mqar-sweep.json
    python -m train.sweep --plot train/runs/mqar-sweep.json --png docs/training-mqar.png

Each point is one ``train.loop.run`` of the grid's shared settings (steps, batch, learning
rate, seed ...; ``--help``) with its pairs, sequence length and rule.  The records are
merged into ``--out`` by key (pairs, seq_len, rule, steps, seed): a point already there is
not trained again, so a sweep can be split across processes or resumed.  The weights of
the points are not kept (train one with ``python -m train --out DIR`` to keep it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

PROG = "python -m train.sweep"


def key(r: dict) -> tuple:
    s = r["settings"]
    return (s["pairs"], s["seq_len"], s.get("rule", "delta"), s["steps"], s["seed"])


def _ints(text: str, name: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} {text!r}: allowed is a comma-separated list of integers") from None
    if not out:
        raise argparse.ArgumentTypeError(f"{name} {text!r}: no values")
    return out


def load(path: Path) -> list[dict]:
    return json.loads(path.read_text())["points"] if path.is_file() else []


def save(path: Path, points: list[dict]) -> None:
    points = sorted(points, key=key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"what": "MQAR held-out accuracy per (pairs, seq_len, rule), train/sweep.py",
                                "points": points}, indent=1) + "\n")


def table(points: list[dict]) -> str:
    """Markdown: one row per (pairs, seq_len), the final held-out accuracy per rule."""
    by = {}
    for p in points:
        s = p["settings"]
        by.setdefault((s["pairs"], s["seq_len"]), {})[s.get("rule", "delta")] = p
    lines = ["| pairs | tokens | KDA (delta rule) | GLA baseline | steps | held-out answers |",
             "|---|---|---|---|---|---|"]
    for (pairs, T), rules in sorted(by.items()):
        acc = {r: f"{100 * p['final']['heldout_acc']:.1f} %" for r, p in rules.items()}
        any_p = next(iter(rules.values()))
        lines.append(f"| {pairs} | {T} | {acc.get('delta', '')} | {acc.get('gla', '')} | "
                     f"{any_p['steps_done']} | {any_p['settings']['heldout_examples'] * pairs:,} |")
    return "\n".join(lines)


def plot(points: list[dict], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, (fixed, vary, label) in zip(axes, ((64, "pairs", "key-value pairs (64 tokens)"),
                                               (4, "seq_len", "tokens per example (4 pairs)"))):
        for rule, style in (("delta", "o-"), ("gla", "s--")):
            pts = sorted((p["settings"][vary], p["final"]["heldout_acc"]) for p in points
                         if p["settings"].get("rule", "delta") == rule
                         and p["settings"]["seq_len" if vary == "pairs" else "pairs"] == fixed)
            if pts:
                ax.plot([x for x, _ in pts], [100 * y for _, y in pts], style,
                        label="KDA (delta rule)" if rule == "delta" else "GLA (no delta rule)")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("MQAR on model-tiny (4 layers, d_model 16, one 16x16 state per layer)", fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> int:
    ap = Parser(prog=PROG, description="MQAR accuracy against pairs and length, KDA and the GLA baseline.")
    ap.add_argument("-c", "--config", default="model-tiny")
    ap.add_argument("--pairs", type=lambda t: _ints(t, "--pairs"), default=[4])
    ap.add_argument("--seq-lens", type=lambda t: _ints(t, "--seq-lens"), default=[64])
    ap.add_argument("--rules", default="delta,gla", help="comma-separated: delta, gla (default both)")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout-examples", type=int, default=500)
    ap.add_argument("--time-limit", type=float, default=1800.0, help="seconds per point (default 1800)")
    ap.add_argument("--out", type=Path, help="the sweep's JSON (merged into)")
    ap.add_argument("--plot", type=Path, metavar="JSON", help="print the table of a sweep's JSON and plot it")
    ap.add_argument("--png", type=Path, help="with --plot: the picture to write")
    args = ap.parse_args(argv)
    if args.plot:
        if not args.plot.is_file():
            ap.error(f"--plot {args.plot}: no such file")
        pts = load(args.plot)
        print(table(pts))
        if args.png:
            plot(pts, args.png)
            print(f"wrote {args.png}")
        return 0
    if args.out is None:
        ap.error("--out: required (the sweep's JSON)")
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    bad = [r for r in rules if r not in ("delta", "gla")]
    if bad or not rules:
        ap.error(f"--rules {args.rules!r}: allowed are delta, gla")
    for p in args.pairs:
        for T in args.seq_lens:
            if not 1 <= p or T < 4 * p:
                ap.error(f"--pairs {p} with --seq-lens {T}: allowed is seq_len >= 4 * pairs")

    from moekda.config import ConfigError, hybrid_parts, load_config
    from train.loop import RunSettings, run
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        ap.error(f"--config: {e}")
    if hybrid_parts(cfg.model):
        ap.error(f"--config {args.config}: {', '.join(hybrid_parts(cfg.model))}: training runs kda layers only so far")
    if cfg.model.glu != "swiglu":
        ap.error(f"--config {args.config}: model.glu = \"{cfg.model.glu}\": training runs model.glu = \"swiglu\" so far")
    done = {key(r) for r in load(args.out)}
    for T in args.seq_lens:
        for p in args.pairs:
            for rule in rules:
                s = RunSettings(pairs=p, seq_len=T, steps=args.steps, batch=args.batch, lr=args.lr,
                                warmup=args.warmup, seed=args.seed, heldout_examples=args.heldout_examples,
                                eval_every=max(1, args.steps // 6), time_limit_s=args.time_limit,
                                float_check_examples=0, rule=rule)
                k = (p, T, rule, args.steps, args.seed)
                if k in done:
                    print(f"{PROG}: {k} already in {args.out}", flush=True)
                    continue
                print(f"{PROG}: pairs {p}, {T} tokens, {rule} ({time.strftime('%H:%M:%S')})", flush=True)
                rec = run(cfg, s, log=lambda m: print("  " + m, flush=True))
                pts = [r for r in load(args.out) if key(r) != k] + [rec]
                save(args.out, pts)
                done.add(k)
    print(table(load(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
