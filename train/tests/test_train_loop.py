"""train/loop.py and ``python -m train``: Adam's step, a short run that lowers the loss and
writes parameters model/ reads, and one-line refusals of bad options (exit 2).
Skipped when the training extra (JAX) is not installed."""
import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from model.int_model import int_run_model  # noqa: E402
from model.params import load_model_params  # noqa: E402
from model.quantize import quantize_model  # noqa: E402
from moekda.config import load_config  # noqa: E402
from model.cases import model_config  # noqa: E402
from train.__main__ import main  # noqa: E402
from train.loop import ADAM_EPS, RunSettings, adam_init, adam_update, run  # noqa: E402
from model.tasks.mqar import split  # noqa: E402


def test_adam_first_step_and_clipping():
    """The first bias-corrected step moves every parameter by lr * g / (|g| + eps); a gradient
    of global norm above 1 is scaled down to 1 first (the same step: Adam is scale-free)."""
    tree = {"a": jnp.array([1.0, -2.0]), "b": jnp.array([[0.5]])}
    grads = {"a": jnp.array([3.0, -0.5]), "b": jnp.array([[4.0]])}
    new, opt, norm = adam_update(tree, grads, adam_init(tree), 1.0, 0.1)
    assert np.isclose(float(norm), np.sqrt(9 + 0.25 + 16))
    scale = 1.0 / float(norm)
    for k in tree:
        g = np.asarray(grads[k]) * scale
        want = np.asarray(tree[k]) - 0.1 * g / (np.abs(g) + ADAM_EPS)
        assert np.allclose(np.asarray(new[k]), want, rtol=1e-6), k
        assert np.allclose(np.asarray(opt["m"][k]), 0.1 * g, rtol=1e-6)


def test_short_run_learns_and_writes(tmp_path):
    """A one-layer model on 2-pair MQAR: the held-out loss falls, and the written parameters
    load as the config's ModelParams, give model/'s float model the accuracy the run
    measured in JAX on the same held-out examples (float32 against float64: at most one
    answer apart, a near tie), and go through the quantiser as they are."""
    cfg = model_config("model-tiny", n_layers=1, layers=["kda"], mixers=["moe"])
    s = RunSettings(pairs=2, seq_len=16, steps=60, batch=16, lr=1e-2, warmup=5, train_examples=512,
                    heldout_examples=24, eval_every=30, float_check_examples=24,
                    time_limit_s=1e5)   # never the stop here, even on a loaded machine
    lines = []
    rec = run(cfg, s, log=lines.append, out=tmp_path)
    hist = rec["history"]
    assert [h["step"] for h in hist] == [30, 60] and rec["steps_done"] == 60
    assert hist[-1]["heldout_loss"] < hist[0]["heldout_loss"] < 12
    mp = load_model_params(tmp_path / "params.npz", cfg)
    assert len(mp.layers) == 1 and mp.layers[0].mixer == "moe"
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["final"] == rec["final"] and saved["settings"]["vocab"] == 64
    answers = 24 * 2
    final = rec["final"]
    assert final["jax_heldout_acc_same_examples"] == final["heldout_acc"]      # all 24 checked
    assert abs(final["float_model_heldout_acc"] - final["heldout_acc"]) <= 1 / answers + 1e-9
    assert lines[-1].startswith("wrote ")
    data = split("train", 2, 64, 2, 16, seed=0)
    qm = quantize_model(mp, cfg, token_seqs=list(data.inputs))
    assert int_run_model(qm, cfg, data.inputs[0]).shape == (16, 64)


@pytest.mark.parametrize("argv,word", [
    (["--steps", "0"], "--steps"), (["--lr", "fast"], "--lr"), (["--pairs", "40"], "--pairs"),
    (["--seq-len", "10"], "--seq-len"), (["-c", "tiny"], "--config"), (["-c", "no-such"], "--config"),
    (["--vocab", "100"], "--vocab"), (["--float-check", "5", "--heldout-examples", "4"], "--float-check"),
    (["--task", "chars"], "--task chars"), (["--task", "text"], "--task"), (["--rule", "linear"], "--rule"),
])
def test_bad_options_one_line_exit_2(argv, word, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m train: error: ") and word in err, err
    assert "Traceback" not in err


def test_character_run_records_its_corpus(tmp_path):
    """--task chars on model-small: bits per character in the history, the corpus (every file
    with its hash) in the record, and the float model checked on a held-out window."""
    from train.loop import RunSettings, run
    cfg = load_config("model-small")
    s = RunSettings(task="chars", seq_len=16, steps=2, batch=2, train_examples=8, heldout_examples=2,
                    eval_every=2, float_check_examples=1)
    rec = run(cfg, s, log=lambda m: None, out=tmp_path)
    assert rec["task"] == "chars" and rec["corpus"]["files"] and "sha256" in rec["corpus"]["files"][0]
    h = rec["history"][-1]
    assert abs(h["heldout_bpc"] - h["heldout_loss"] / np.log(2)) < 1e-4
    assert abs(rec["final"]["float_model_heldout_acc"] - rec["final"]["jax_heldout_acc_same_examples"]) <= 1 / 16
