"""A short training run of the float model on MQAR (``python -m train``): hand-written Adam,
float32 on the CPU, loss and accuracy on the answer positions only.

What a run returns (and ``--out`` writes as ``run.json`` beside ``params.npz``): the
config and every setting, the seed, the wall time, the loss and held-out accuracy at each
evaluation, and at the end the held-out accuracy of the trained parameters run through
model/ float model itself (float64, after the exact conversion to ModelParams): the
model the quantiser takes.
"""
from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from moekda.config import Config
from model import float_model
from model.params import ModelParams, random_model_params, save_model_params
from model.tasks import chars, splits
from train.model import model_from_tree, run_model, to_tree


@dataclass
class RunSettings:
    """Everything a run depends on besides the config (``python -m train --help``)."""
    pairs: int = 4
    seq_len: int = 64
    vocab: int = 0             # MQAR vocabulary; 0: the model's
    steps: int = 300
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 30
    seed: int = 0
    train_examples: int = 20000
    heldout_examples: int = 1000
    eval_every: int = 50
    time_limit_s: float = 540.0
    float_check_examples: int = 32
    rule: str = "delta"        # "gla": the baseline without the delta rule (train/model.py)
    task: str = "mqar"         # "chars": character LM on the standard library (model/tasks/chars.py)


# ---- the optimiser -------------------------------------------------------------------------

B1, B2, ADAM_EPS, CLIP = 0.9, 0.999, 1e-8, 1.0


def adam_init(tree):
    zeros = jax.tree_util.tree_map(jnp.zeros_like, tree)
    return {"m": zeros, "v": zeros}


def adam_update(tree, grads, opt, step, lr):
    """One Adam step (bias-corrected, ``step`` counting from 1) after clipping the gradient's
    global norm to CLIP."""
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
    grads = jax.tree_util.tree_map(lambda g: g * jnp.minimum(1.0, CLIP / (norm + 1e-12)), grads)
    m = jax.tree_util.tree_map(lambda m, g: B1 * m + (1 - B1) * g, opt["m"], grads)
    v = jax.tree_util.tree_map(lambda v, g: B2 * v + (1 - B2) * g * g, opt["v"], grads)
    c1, c2 = 1 - B1 ** step, 1 - B2 ** step
    tree = jax.tree_util.tree_map(lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + ADAM_EPS), tree, m, v)
    return tree, {"m": m, "v": v}, norm


def learning_rate(s: RunSettings, step):
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to lr/10."""
    warm = jnp.minimum(1.0, step / max(1, s.warmup))
    frac = jnp.clip((step - s.warmup) / max(1, s.steps - s.warmup), 0.0, 1.0)
    return s.lr * warm * (0.1 + 0.45 * (1 + jnp.cos(jnp.pi * frac)))


# ---- loss and accuracy ---------------------------------------------------------------------

def masked_loss_acc(logits, targets, mask):
    """Mean cross-entropy and accuracy (argmax, ties to the lowest id as float_model's
    argmax_lowest) over the positions where ``mask``: logits (..., T, V), targets and mask
    (..., T)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    n = jnp.maximum(1, mask.sum())
    hit = (jnp.argmax(logits, axis=-1) == targets) & mask
    return (nll * mask).sum() / n, hit.sum() / n


def make_functions(cfg: Config, s: RunSettings):
    """(train_step, evaluate), compiled: train_step(tree, opt, step, inputs, targets, mask)
    -> (tree, opt, loss, grad_norm); evaluate(tree, inputs, targets, mask) -> (loss, acc)."""
    batched = jax.vmap(lambda tree, toks: run_model(tree, cfg, toks, rule=s.rule), in_axes=(None, 0))

    def loss_fn(tree, inputs, targets, mask):
        return masked_loss_acc(batched(tree, inputs), targets, mask)[0]

    @jax.jit
    def train_step(tree, opt, step, inputs, targets, mask):
        loss, grads = jax.value_and_grad(loss_fn)(tree, inputs, targets, mask)
        tree, opt, norm = adam_update(tree, grads, opt, step, learning_rate(s, step))
        return tree, opt, loss, norm

    @jax.jit
    def evaluate(tree, inputs, targets, mask):
        return masked_loss_acc(batched(tree, inputs), targets, mask)

    return train_step, evaluate


def float_model_accuracy(mp: ModelParams, cfg: Config, data, n: int) -> float:
    """Accuracy of model/ float model (float64) on the first n examples' answers."""
    hit = total = 0
    for inp, tgt, msk in zip(data.inputs[:n], data.targets[:n], data.mask[:n]):
        pred = float_model.next_tokens(float_model.run_model(mp, cfg, inp))
        hit += int((pred[msk] == tgt[msk]).sum())
        total += int(msk.sum())
    return hit / max(1, total)


def task_data(cfg: Config, s: RunSettings):
    """(vocab, training split, held-out split, extra record fields) of the run's task."""
    vocab, train_data, held = splits(s.task, asdict(s), cfg.model.vocab, s.train_examples, s.heldout_examples)
    return vocab, train_data, held, ({"corpus": chars.corpus_record()} if s.task == "chars" else {})


def run(cfg: Config, s: RunSettings, log=print, out: Path | None = None) -> dict:
    """Train from ``random_model_params(cfg, s.seed)`` on the task and return the run's record
    (module doc); with ``out``, write ``params.npz`` and ``run.json`` there."""
    vocab, train_data, held, extra = task_data(cfg, s)
    tree = to_tree(random_model_params(cfg, s.seed), jnp.float32)
    opt = adam_init(tree)
    train_step, evaluate = make_functions(cfg, s)
    held_j = (jnp.asarray(held.inputs), jnp.asarray(held.targets), jnp.asarray(held.mask))
    order = np.random.default_rng([s.seed, 2])      # batch order: its own stream
    history = []
    t0 = time.perf_counter()
    step = 0

    def record(loss):
        h_loss, h_acc = (float(x) for x in evaluate(tree, *held_j))
        row = {"step": step, "train_loss": round(float(loss), 5), "heldout_loss": round(h_loss, 5),
               "heldout_acc": round(h_acc, 5), "wall_s": round(time.perf_counter() - t0, 1)}
        if s.task == "chars":
            row["heldout_bpc"] = round(h_loss / np.log(2.0), 5)
        history.append(row)
        log("  ".join(f"{k} {v}" for k, v in row.items()))

    loss = float("nan")
    stopped = "steps"
    while step < s.steps:
        idx = order.integers(0, s.train_examples, size=s.batch)
        tree, opt, loss, _ = train_step(tree, opt, jnp.float32(step + 1), jnp.asarray(train_data.inputs[idx]),
                                        jnp.asarray(train_data.targets[idx]), jnp.asarray(train_data.mask[idx]))
        step += 1
        if step % s.eval_every == 0 or step == s.steps:
            record(loss)
        if time.perf_counter() - t0 > s.time_limit_s:
            stopped = "time limit"
            break
    if not history or history[-1]["step"] != step:
        record(loss)
    wall = time.perf_counter() - t0
    mp = model_from_tree(tree, cfg)
    # model/ computes the delta rule only: a GLA baseline has no float model to check against
    n_check = min(s.float_check_examples, s.heldout_examples) if s.rule == "delta" else 0
    final = dict(history[-1], float_model_examples=n_check)
    msg = f"trained {step} steps in {wall:.0f} s ({stopped}); held-out accuracy {final['heldout_acc']:.3f} " \
          f"(JAX, {s.heldout_examples} examples)"
    if n_check:     # the same examples in JAX (float32) and in model/ float model (float64)
        final["jax_heldout_acc_same_examples"] = round(float(evaluate(tree, *(a[:n_check] for a in held_j))[1]), 5)
        final["float_model_heldout_acc"] = round(float_model_accuracy(mp, cfg, held, n_check), 5)
        msg += f"; on the first {n_check}: {final['jax_heldout_acc_same_examples']:.3f} (JAX, float32), " \
               f"{final['float_model_heldout_acc']:.3f} (sim float model, float64)"
    log(msg)
    rec = {"task": s.task, "config": cfg.name, "model": cfg.to_dict()["model"], "settings": asdict(s) | {"vocab": vocab},
           "seed": s.seed, "steps_done": step, "stopped_by": stopped, "wall_time_s": round(wall, 1),
           "history": history, "final": final, "jax": jax.__version__, "python": platform.python_version(), **extra}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        save_model_params(mp, out / "params.npz")
        (out / "run.json").write_text(json.dumps(rec, indent=1) + "\n")
        log(f"wrote {out / 'params.npz'} and {out / 'run.json'}")
    return rec
