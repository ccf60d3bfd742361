"""``python -m train``: train the float model of a config on a task (MQAR, or the character
LM with ``--task chars``) for a short run and print the loss and held-out accuracy (train/loop.py).  ``--help`` lists every option.

A bad option is refused with one line naming it and what is allowed, exit code 2."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path

# one XLA thread unless the caller says otherwise: this machine's cores belong to the
# simulations first (set before JAX is imported, which reads it once)
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

PROG = "python -m train"

# option -> (RunSettings field, type, lowest, highest, help)
OPTIONS = {
    "--pairs": ("pairs", int, 1, 1 << 15, "key-value pairs per example"),
    "--seq-len": ("seq_len", int, 4, 1 << 16, "tokens per example"),
    "--vocab": ("vocab", int, 0, 1 << 16, "MQAR vocabulary, at most the model's (0: the model's)"),
    "--steps": ("steps", int, 1, 10 ** 7, "optimiser steps"),
    "--batch": ("batch", int, 1, 1 << 14, "examples per step"),
    "--lr": ("lr", float, 1e-7, 1.0, "peak learning rate of Adam"),
    "--warmup": ("warmup", int, 0, 10 ** 7, "steps of linear warm-up"),
    "--seed": ("seed", int, 0, 2 ** 32 - 1, "seed of the initial parameters, the data and the batch order"),
    "--train-examples": ("train_examples", int, 1, 10 ** 7, "size of the training set"),
    "--heldout-examples": ("heldout_examples", int, 1, 10 ** 6, "size of the held-out set"),
    "--eval-every": ("eval_every", int, 1, 10 ** 7, "steps between held-out evaluations"),
    "--time-limit": ("time_limit_s", float, 1.0, 86400.0, "seconds after which training stops"),
    "--float-check": ("float_check_examples", int, 0, 10 ** 6,
                      "held-out examples run through model/'s float model at the end"),
}


class Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)


def ranged(kind, lo, hi):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: allowed is {'an integer' if kind is int else 'a number'} "
                                             f"from {lo} to {hi}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text!r}: allowed is {lo} to {hi}")
        return value
    return parse


def main(argv=None) -> int:
    from train.loop import RunSettings
    defaults = {f.name: f.default for f in fields(RunSettings)}
    ap = Parser(prog=PROG, description="Train a config's float model on MQAR (multi-query associative recall).")
    ap.add_argument("-c", "--config", default="model-tiny", help="config name under configs/ or a .toml path "
                    "(a model config: vocab > 0; default model-tiny)")
    for opt, (name, kind, lo, hi, text) in OPTIONS.items():
        ap.add_argument(opt, dest=name, type=ranged(kind, lo, hi), default=defaults[name],
                        help=f"{text} ({lo} to {hi}; default {defaults[name]})")
    from model.tasks import TASKS
    ap.add_argument("--task", choices=TASKS, default="mqar",
                    help="mqar (multi-query associative recall; default) or chars (character LM on the "
                         "Python standard library's sources: a byte vocabulary, model-small)")
    ap.add_argument("--rule", choices=("delta", "gla"), default="delta",
                    help="state update: delta (KDA, what the chip computes; default) or gla (the baseline "
                         "without the delta rule: plain gated linear attention)")
    ap.add_argument("-o", "--out", type=Path, help="directory for params.npz and run.json")
    args = ap.parse_args(argv)

    from moekda.config import ConfigError, hybrid_parts, load_config
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        ap.error(f"--config: {e}")
    if hybrid_parts(cfg.model):   # the JAX forward pass (train/model.py) is the chip's stack
        ap.error(f"--config {args.config}: {', '.join(hybrid_parts(cfg.model))}: training runs kda layers, "
                 f"model.attn_res = \"none\" and model.moe_latent = 0 so far")
    if cfg.model.glu != "swiglu":   # train/model.py's experts and dense mixer are SwiGLU so far
        ap.error(f"--config {args.config}: model.glu = \"{cfg.model.glu}\": training runs model.glu = \"swiglu\" "
                 f"so far (train/model.py)")
    if cfg.model.vocab < 4:
        ap.error(f"--config {args.config}: model.vocab is {cfg.model.vocab}; allowed is a model config "
                 f"with vocab 4 or more (model-tiny, model-small)")
    vocab = args.vocab or cfg.model.vocab
    if args.task == "chars":
        from model.tasks.chars import VOCAB
        if cfg.model.vocab != VOCAB or args.vocab not in (0, VOCAB):
            ap.error(f"--task chars: a byte vocabulary of {VOCAB}; config {cfg.name} has model.vocab "
                     f"{cfg.model.vocab} (use -c model-small)")
    elif vocab > cfg.model.vocab:
        ap.error(f"--vocab {vocab}: allowed is 4 to {cfg.model.vocab} (model.vocab of config {cfg.name})")
    else:
        from model.tasks.mqar import check_sizes
        try:
            check_sizes(vocab, args.pairs, args.seq_len, names=("--vocab", "--pairs", "--seq-len"))
        except ValueError as e:
            ap.error(str(e))
    if args.float_check_examples > args.heldout_examples:
        ap.error(f"--float-check {args.float_check_examples}: allowed is 0 to --heldout-examples "
                 f"({args.heldout_examples})")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out}: a file; allowed is a directory (made if missing)")

    from train.loop import run
    settings = RunSettings(**{name: getattr(args, name) for name, *_ in OPTIONS.values()}, rule=args.rule,
                           task=args.task)
    run(cfg, settings, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
