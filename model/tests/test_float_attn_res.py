"""model/float_attn_res.py (issue 15): Attention Residuals against sums written out
from the formulas, the limits that must hold (zero queries give the mean, block = 1 is the
full form, no AttnRes is the plain residual), and the vectors the hardware must keep."""
import numpy as np
import pytest

from model.float_attn_res import DepthResidual, depth_mix, kept_vectors, run_stack

EPS = 1e-6
D = 12


def _sublayers(n, seed):
    rng = np.random.default_rng(seed)
    mats = [rng.standard_normal((D, D)) / np.sqrt(D) for _ in range(n)]
    return [lambda h, W=W: np.tanh(W @ h) * 3.0 for W in mats]


def _rms(v):
    return v / np.sqrt(np.mean(v * v) + EPS)


def _softmix(q, vals):
    logits = np.array([q @ _rms(v) for v in vals])
    a = np.exp(logits - logits.max())
    return sum(ai * v for ai, v in zip(a / a.sum(), vals))


def test_plain_residual_is_the_usual_chain():
    fs = _sublayers(6, 0)
    x0 = np.random.default_rng(1).standard_normal(D)
    h = x0.copy()
    for f in fs:
        h = h + f(h)
    np.testing.assert_allclose(run_stack("none", x0, fs, None, EPS), h, rtol=1e-12)


@pytest.mark.parametrize("n,seed", [(1, 2), (4, 3), (8, 4)])
def test_full_matches_the_formula(n, seed):
    fs = _sublayers(n, seed)
    rng = np.random.default_rng(seed + 100)
    x0, Q = rng.standard_normal(D), rng.standard_normal((n + 1, D))
    vals = [x0]
    for i, f in enumerate(fs):
        vals.append(f(_softmix(Q[i], vals)))
    np.testing.assert_allclose(run_stack("full", x0, fs, Q, EPS), _softmix(Q[n], vals), rtol=1e-12)


@pytest.mark.parametrize("n,block,seed", [(8, 2, 5), (8, 3, 6), (5, 4, 7), (6, 6, 8)])
def test_block_matches_the_formula(n, block, seed):
    fs = _sublayers(n, seed)
    rng = np.random.default_rng(seed + 100)
    x0, Q = rng.standard_normal(D), rng.standard_normal((n + 1, D))
    summaries, partial = [x0], None
    for i, f in enumerate(fs):
        u = summaries + ([partial] if partial is not None else [])
        v = f(_softmix(Q[i], u))
        partial = v if partial is None else partial + v
        if (i + 1) % block == 0:
            summaries.append(partial)
            partial = None
    u = summaries + ([partial] if partial is not None else [])
    np.testing.assert_allclose(run_stack("block", x0, fs, Q, EPS, block), _softmix(Q[n], u), rtol=1e-12)


def test_block_of_one_is_full():
    fs = _sublayers(6, 9)
    rng = np.random.default_rng(10)
    x0, Q = rng.standard_normal(D), rng.standard_normal((7, D))
    np.testing.assert_allclose(run_stack("block", x0, fs, Q, EPS, 1), run_stack("full", x0, fs, Q, EPS), rtol=1e-12)


def test_zero_queries_give_the_mean_and_keys_ignore_scale():
    rng = np.random.default_rng(11)
    vals = rng.standard_normal((5, D))
    np.testing.assert_allclose(depth_mix(np.zeros(D), vals, EPS), vals.mean(axis=0), rtol=1e-12)
    q = rng.standard_normal(D)
    t1, t2 = {}, {}
    depth_mix(q, vals, 0.0, t1)
    depth_mix(q, vals * np.array([[1.0], [7.0], [0.5], [2.0], [3.0]]), 0.0, t2)
    np.testing.assert_allclose(t1["res_weights"], t2["res_weights"], rtol=1e-12)   # RMS-normalised keys
    assert abs(t1["res_weights"].sum() - 1) < 1e-12


@pytest.mark.parametrize("mode,n,block", [("none", 8, 2), ("full", 8, 2), ("block", 8, 2), ("block", 7, 3),
                                          ("block", 8, 8)])
def test_kept_vectors_is_the_most_held(mode, n, block):
    fs = _sublayers(n, 12)
    rng = np.random.default_rng(13)
    tr = {}
    run_stack(mode, rng.standard_normal(D), fs, rng.standard_normal((n + 1, D)), EPS, block, tr)
    assert max(tr["kept"]) == kept_vectors(mode, n, block)


def test_bad_mode_and_order_are_refused():
    with pytest.raises(ValueError, match="attn_res 'half'"):
        DepthResidual("half", np.zeros(D), None, EPS)
    r = DepthResidual("full", np.zeros(D), np.zeros((3, D)), EPS)
    with pytest.raises(ValueError, match="sub-layer 2"):
        r.input(2)
