"""The integer model of the stack (model/int_model.py) and its quantiser
(quantize_model): one QLayer per layer through int_layer_step, int8 embedding, final
norm, LM head to 16-bit logits, integer argmax (ties: lowest id); decode and reset;
accuracy against the float model on seeds never used for calibration."""
import numpy as np
import pytest

from moekda.config import load_config
from moekda.numerics import sat_bounds
from model import float_layer as fl
from model.float_model import next_tokens, run_model
from model.int_layer import int_run_layer, quantize_input
from model.int_model import (IntModelState, dequantize_logits, int_argmax, int_generate, int_model_step,
                                  int_next_tokens, int_run_model, int_run_stack)
from model.params import random_inputs, random_model_params, random_params, random_tokens
from model.qparams import QLayer, QModel
from model.quantize import quantize_layer, quantize_model, quantize_random_layer
from model.cases import assert_traces_close, model_config, quick_model


@pytest.fixture(scope="module")
def tiny_model():
    cfg = model_config()
    mp, qm = quick_model(cfg, 7)
    return cfg, mp, qm


def test_int_argmax_ties_lowest_index():
    assert int_argmax([3, 5, 5, 1]) == 1
    assert int_argmax([-2, -2]) == 0
    assert int_argmax([0, 0, 7, 0, 7]) == 2
    assert list(int_next_tokens(np.array([[1, 9, 9], [4, 4, 4]]))) == [1, 0]


def test_tie_rule_in_the_head(tiny_model):
    """An LM head whose rows 3 and 7 are equal and every other row zero: the two logits are
    always equal, so the next token is 3 (when they are the largest) or 0 (all others tie at 0)."""
    cfg, mp, qm = tiny_model
    ucfg = model_config(tie_embedding=False)
    head = qm.head
    w = np.zeros((64, 16), np.int64)
    w[3] = w[7] = np.arange(16) - 8
    from dataclasses import replace
    q2 = QModel(layers=qm.layers, head=replace(head, lm_head=w, norm_w=np.full(16, 1 << 14), norm_w_shift=14),
                scales=qm.scales)
    toks = random_tokens(cfg, 24, seed=3, model_seed=7)
    logits = int_run_model(q2, ucfg, toks)
    assert np.array_equal(logits[:, 3], logits[:, 7])
    nxt = int_next_tokens(logits)
    assert set(nxt.tolist()) <= {0, 3} and {0, 3} == set(nxt.tolist()) | {0, 3}
    assert all(n == (3 if lg[3] > 0 else 0) for n, lg in zip(nxt, logits))


def test_shapes_formats_and_stack_wiring(tiny_model):
    cfg, mp, qm = tiny_model
    toks = random_tokens(cfg, 10, seed=5, model_seed=7)
    traces = []
    logits = int_run_model(qm, cfg, toks, traces=traces)
    assert logits.shape == (10, 64) and logits.dtype == np.int64
    lo, hi = sat_bounds(16)
    assert logits.min() >= lo and logits.max() <= hi
    assert [q.mixer for q in qm.layers] == ["dense", "moe", "moe", "moe"]
    assert qm.layers[0].moe is None and qm.layers[0].dense.chunks.gate_w.shape == (3, 16, 16)
    # x_0 is the int8 table entry; layer l+1 reads layer l's y at its scale, unchanged
    assert qm.head.emb.dtype == np.int64 and np.abs(qm.head.emb).max() <= 127
    assert qm.layers[0].scales["x"] == qm.scales["emb"]
    for a, b in zip(qm.layers, qm.layers[1:]):
        assert b.scales["x"] == a.scales["y"]
    for t, tok in zip(traces, toks):
        assert np.array_equal(t["x0"], qm.head.emb[tok])
        for a, b in zip(t["layers"], t["layers"][1:]):
            assert np.array_equal(a["y"], b["x"])
        assert np.array_equal(t["xL"], t["layers"][-1]["y"])
        assert np.abs(t["fn"]).max() <= 128 and np.abs(t["fn_unit"]).max() <= 128
    # the stack's layers are int_layer_step: layer by layer with int_run_layer gives the same
    x = np.stack([qm.head.emb[t] for t in toks])
    for l, q in enumerate(qm.layers):
        x = int_run_layer(q, cfg, x)
        assert np.array_equal(x, np.stack([t["layers"][l]["y"] for t in traces]))


def test_tied_head_is_the_embedding_untied_folds_the_norm():
    tied = model_config()
    _, qt = quick_model(tied, 1)
    assert qt.head.lm_head is None and not np.all(qt.head.norm_w == qt.head.norm_w[0])
    untied = model_config(tie_embedding=False)
    _, qu = quick_model(untied, 1)
    assert qu.head.lm_head.shape == (64, 16) and np.all(qu.head.norm_w == 1 << qu.head.norm_w_shift)


def test_one_layer_stack_is_the_layer():
    """n_layers = 1 without a vocabulary: the integer stack is today's QLayer and int_run_layer."""
    cfg = load_config("tiny")
    mp = random_model_params(cfg, 4)
    qm = quantize_model(mp, cfg, model_seed=4)
    ref = quantize_random_layer(cfg, 4)
    a, b = qm.layers[0].to_flat(), ref.to_flat()
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    xs = quantize_input(random_inputs(cfg, 12, seed=9, model_seed=4), ref, cfg)
    resets = [t == 6 for t in range(12)]
    assert np.array_equal(int_run_stack(qm, cfg, xs, resets), int_run_layer(ref, cfg, xs, resets))


def test_reset_starts_a_new_sequence(tiny_model):
    cfg, mp, qm = tiny_model
    toks = random_tokens(cfg, 14, seed=8, model_seed=7)
    k = 5
    with_reset = int_run_model(qm, cfg, toks, [t == k for t in range(14)])
    assert np.array_equal(with_reset[k:], int_run_model(qm, cfg, toks[k:]))
    assert not np.array_equal(int_run_model(qm, cfg, toks)[k:], with_reset[k:])
    # a step from a cleared state is the first token of a sequence
    _, first = int_model_step(qm, cfg, IntModelState.zeros(cfg), toks[k])
    assert np.array_equal(first, with_reset[k])
    with pytest.raises(ValueError, match="token id -1: allowed range is 0 to 63"):
        int_model_step(qm, cfg, IntModelState.zeros(cfg), -1)


def test_generate_and_flat_round_trip(tiny_model):
    cfg, mp, qm = tiny_model
    prompt = [1, 2, 3, 40]
    out = int_generate(qm, cfg, prompt, 6)
    logits = int_run_model(qm, cfg, prompt + out)
    assert list(int_next_tokens(logits)[len(prompt) - 1:-1]) == out
    back = QModel.from_flat(qm.to_flat(), cfg.model.n_layers)
    assert np.array_equal(int_run_model(back, cfg, prompt + out), logits)
    assert back.layers[0].mixer == "dense" and back.head.lm_head is None
    assert back.scales == qm.scales


def test_dense_layer_accuracy():
    """The dense mixer's integer path (chunks on the shared-expert arithmetic) against the float
    dense SwiGLU: one dense layer, calibrated on its profile, evaluated on a fresh sequence."""
    cfg = load_config("small")
    p = random_params(cfg, 21, mixer="dense")
    q = quantize_layer(p, cfg, model_seed=21)
    assert q.moe is None and q.dense.chunks.gate_w.shape == (3, 64, 64)
    back = QLayer.from_flat(q.to_flat())
    assert back.dense is not None and back.moe is None
    xs = random_inputs(cfg, 96, seed=321, model_seed=21)
    tf, ti = [], []
    fl.run_layer(p, cfg, xs, traces=tf)
    int_run_layer(q, cfg, quantize_input(xs, q, cfg), traces=ti)
    assert_traces_close(tf, ti, q.scales, [("moe_out", 0.97, 0.995), ("y", 0.99, 0.999)])


# (top-1 agreement, mean logits cosine) bounds, from docs/numerics.md "The model stack": over
# 12 fresh pairs (256 tokens) tiny 0.891..0.969 / >= 0.986, small 0.688..0.828 / >= 0.952; this
# test's pair (900/950, 128 tokens) measured tiny 0.898 / 0.9917, small 0.633 / 0.9553.  Below
# every measured value, far above a broken model (chance is 1/vocab).
BOUNDS = {"model-tiny": (0.85, 0.98), "model-small": (0.60, 0.94)}


@pytest.mark.parametrize("name", ["model-tiny", "model-small"])
def test_accuracy_on_a_fresh_pair(name):
    """Top-1 agreement and mean logits cosine of the integer model on a model seed and a token
    sequence never used for calibration or tuning (128 tokens)."""
    from model.model_accuracy import evaluate_model
    cfg = load_config(name)
    r = evaluate_model(cfg, 900, 950, n_tokens=128, noise_bits=None)
    agree_min, cos_mean_min = BOUNDS[name]
    assert r["agree"] >= agree_min and r["logits_cos_mean"] >= cos_mean_min, r
    # the disagreements are at tokens whose float top-2 are close (median margin well below typical)
    if r["disagree"] >= 4:
        assert r["margin_median_at_disagree"] < r["margin_median"], r


def test_broken_head_scale_fails_the_bound(tiny_model):
    """The accuracy measure can fail: a head multiplier off by 2x saturates the logits and
    the agreement bound no longer holds."""
    from dataclasses import replace
    cfg, mp, qm = tiny_model
    toks = random_tokens(cfg, 64, seed=951, model_seed=7)
    nf = next_tokens(run_model(mp, cfg, toks))
    good = np.mean(int_next_tokens(int_run_model(qm, cfg, toks)) == nf)
    bad_head = replace(qm.head, norm_w=-qm.head.norm_w)
    bad = np.mean(int_next_tokens(int_run_model(QModel(qm.layers, bad_head, qm.scales), cfg, toks)) == nf)
    assert good >= BOUNDS["model-tiny"][0] > bad
    assert np.all(np.isfinite(dequantize_logits(qm, int_run_model(qm, cfg, toks[:2]))))


def test_a_batch_of_sequences_is_each_sequence_alone(tiny_model):
    """int_run_model on (n, T) ids (what the task scores use: every array gets a leading
    axis, the MoE runs expert by expert over the tokens that chose it) gives each
    sequence's logits exactly, through a dense layer, routed and shared experts."""
    cfg, mp, qm = tiny_model
    seqs = np.stack([random_tokens(cfg, 12, seed=20 + i, model_seed=7) for i in range(5)])
    batch = int_run_model(qm, cfg, seqs)
    assert batch.shape == (5, 12, 64)
    for s, got in zip(seqs, batch):
        assert np.array_equal(got, int_run_model(qm, cfg, s))
    assert np.array_equal(int_run_model(qm, cfg, seqs[:1])[0], batch[0])
    assert np.array_equal(int_next_tokens(batch), np.stack([int_next_tokens(b) for b in batch]))
    with pytest.raises(ValueError, match="no resets or traces"):
        int_run_model(qm, cfg, seqs, resets=[False] * 12)
