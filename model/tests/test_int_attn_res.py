"""Integer Attention Residuals (issue 15; model/int_attn_res.py, quantised by
quantize.py _quantize_depth; formats and measured error in docs/numerics.md section 9):
the depth mix against the float formula (float_attn_res.depth_mix) on the same values,
what is kept in each mode, zero queries giving the mean, and the whole model."""
import dataclasses
import math

import numpy as np
import pytest

from moekda.config import load_config, with_settings
from moekda.formats import formats_for
from model.float_attn_res import depth_mix, kept_vectors
from model.float_model import next_tokens, run_model
from model.int_attn_res import IntDepthResidual
from model.int_model import int_next_tokens, int_run_model
from model.int_ops import int_normalize
from model.params import random_model_params, random_tokens
from model.qparams import QModel
from model.quantize import quantize_model


def model(mode):
    cfg = with_settings(load_config("model-tiny"), [f'model.attn_res="{mode}"'])
    mp = random_model_params(cfg, 61)
    return cfg, mp, quantize_model(mp, cfg, model_seed=61)


@pytest.fixture(scope="module", params=["block", "full"])
def ar_model(request):
    return model(request.param)


def real_query(q, cfg, n):
    """The pseudo-query the integer logits stand for: u = (key . q_n) u_m 2^-u_s in base 2
    with mla_exp_frac fractional bits, key = RMS-normalised value / s_key."""
    fm = formats_for(cfg)
    ar = q.attn_res
    return ar.queries[n] * (int(ar.u_m[n]) / 2.0 ** int(ar.u_s[n])) * math.log(2) / 2 ** fm.mla_exp_frac \
        / q.scales["depth_key"]


def test_the_mix_is_the_float_formula_on_the_same_values(ar_model):
    """Random sub-layer outputs through IntDepthResidual: every input h_n (and the output)
    against float_attn_res.depth_mix of the kept values, dequantised, with the query the
    integer logits stand for."""
    cfg, _, q = ar_model
    fm, N, d = formats_for(cfg), 2 * cfg.model.n_layers, cfg.model.d_model
    s_v = q.scales["depth"]
    rng = np.random.default_rng(5)
    r = IntDepthResidual(q.attn_res, cfg, rng.integers(-127, 128, d))
    errs_key, errs = [], []
    for n in range(1, N + 2):
        h = r.input(n) if n <= N else r.output()
        V = np.stack(r._kept())
        want = depth_mix(real_query(q, cfg, n - 1), V * s_v, cfg.model.norm_eps)
        # the same with the integer keys: what is left is the softmax's arithmetic
        keys = int_normalize(V, q.attn_res.key_norm, fm, fm.act_bits) * q.scales["depth_key"]
        z = keys @ real_query(q, cfg, n - 1)
        a = np.exp(z - z.max())
        want_k = (a / a.sum()) @ (V * s_v)
        got = h * s_v
        errs.append(np.linalg.norm(got - want) / np.linalg.norm(want))
        errs_key.append(np.linalg.norm(got - want_k) / np.linalg.norm(want_k))
        if n <= N:
            out = rng.integers(-127, 128, d) if n % 2 else rng.integers(-20000, 20000, d)
            r.add(n, out)
    assert max(errs_key) <= 0.003 and max(errs) <= 0.03, (errs_key, errs)
    assert r.n == N
    assert len(r._kept()) <= kept_vectors(cfg.model.attn_res, N, cfg.model.attn_res_block)


def test_zero_queries_give_the_mean():
    cfg, _, q = model("full")
    zero = dataclasses.replace(q, attn_res=dataclasses.replace(q.attn_res, queries=np.zeros_like(q.attn_res.queries)))
    rng = np.random.default_rng(6)
    r = IntDepthResidual(zero.attn_res, cfg, rng.integers(-127, 128, 16))
    for n in range(1, 5):
        h = r.input(n)
        mean = np.mean(np.stack(r.values), axis=0)
        assert np.max(np.abs(h - mean)) <= 1.0
        r.add(n, rng.integers(-127, 128, 16))


def test_the_model_follows_the_float_one(ar_model):
    """A fresh token sequence: top-1 agreement and mean logits cosine of the integer model
    (measured on the 12 pairs of docs/numerics.md section 9; this pair is seed 61/62)."""
    cfg, mp, q = ar_model
    toks = random_tokens(cfg, 96, seed=62, model_seed=61)
    lf, li = run_model(mp, cfg, toks), int_run_model(q, cfg, toks)
    agree = np.mean(next_tokens(lf) == int_next_tokens(li))
    cos = np.sum(lf * li, 1) / np.linalg.norm(lf, axis=1) / np.linalg.norm(li, axis=1)
    assert agree >= 0.7 and cos.mean() >= 0.93, (agree, cos.mean())


def test_a_wrong_depth_conversion_breaks_the_match(ar_model):
    cfg, mp, q = ar_model
    ar = q.attn_res
    bad = dataclasses.replace(q, attn_res=dataclasses.replace(ar, out_s=ar.out_s - 1))
    toks = random_tokens(cfg, 48, seed=63, model_seed=61)
    nf = next_tokens(run_model(mp, cfg, toks))
    good = np.mean(int_next_tokens(int_run_model(q, cfg, toks)) == nf)
    worse = np.mean(int_next_tokens(int_run_model(bad, cfg, toks)) == nf)
    assert worse < good - 0.1


def test_flat_round_trip_and_batch(ar_model):
    cfg, _, q = ar_model
    back = QModel.from_flat(q.to_flat(), cfg.model.n_layers)
    assert back.attn_res is not None and back.attn_res.queries.shape == (2 * cfg.model.n_layers + 1, 16)
    seqs = np.stack([random_tokens(cfg, 8, seed=70 + i, model_seed=61) for i in range(3)])
    batch = int_run_model(q, cfg, seqs)
    for s, got in zip(seqs, batch):
        assert np.array_equal(got, int_run_model(back, cfg, s))


def test_the_hybrid_configs_run_on_the_integer_model():
    for name in ("model-tiny-hybrid",):
        cfg = load_config(name)
        mp = random_model_params(cfg, 0)
        qm = quantize_model(mp, cfg, model_seed=0)
        assert [l.kind for l in qm.layers] == ["kda", "kda", "kda", "mla"] and qm.attn_res is not None
        assert qm.layers[1].moe.lat_down is not None
        toks = random_tokens(cfg, 24, seed=1, model_seed=0)
        agree = np.mean(next_tokens(run_model(mp, cfg, toks)) == int_next_tokens(int_run_model(qm, cfg, toks)))
        assert agree >= 0.6
