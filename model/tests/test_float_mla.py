"""model/float_mla.py (issue 15): the decoder's Gated MLA (absorbed up-projections,
online softmax over the latent cache) equals the textbook form (explicit keys and values,
two-pass softmax), restarts empty the cache, the cache holds one latent per token, and the
gate and NoPE behave as the formulas say."""
import numpy as np
import pytest

from model.float_mla import (MLACache, cache_bytes_per_token, mla_reference, mla_step, online_softmax_sum,
                                  random_mla_params, run_mla)

EPS = 1e-6


@pytest.mark.parametrize("d,H,dh,r,seed", [(16, 1, 16, 8, 0), (64, 2, 32, 16, 1), (24, 3, 8, 4, 2)])
def test_absorbed_online_form_equals_textbook(d, H, dh, r, seed):
    p = random_mla_params(d, H, dh, r, seed)
    xs = np.random.default_rng(seed + 10).standard_normal((40, d)) * 2.0
    resets = np.zeros(40, bool)
    resets[[0, 17]] = True
    np.testing.assert_allclose(run_mla(p, xs, EPS, resets), mla_reference(p, xs, EPS, resets), rtol=1e-10, atol=1e-10)


def test_online_softmax_survives_large_and_rising_scores():
    rng = np.random.default_rng(3)
    s = np.concatenate([[-800.0], rng.standard_normal(30) * 50, [900.0, 1000.0]])
    c = rng.standard_normal((len(s), 5))
    a = np.exp(s - s.max())
    np.testing.assert_allclose(online_softmax_sum(zip(s, c)), (a / a.sum()) @ c, rtol=1e-12, atol=1e-300)


def test_cache_grows_one_latent_per_token_and_restart_forgets():
    p = random_mla_params(16, 2, 8, 6, 4)
    xs = np.random.default_rng(5).standard_normal((9, 16))
    cache = MLACache()
    for t, x in enumerate(xs):
        mla_step(p, cache, x, EPS)
        assert len(cache.latents) == t + 1 and cache.latents[-1].shape == (6,)
    fresh = run_mla(p, xs[5:], EPS)
    resets = np.zeros(9, bool)
    resets[5] = True
    np.testing.assert_allclose(run_mla(p, xs, EPS, resets)[5:], fresh, rtol=1e-12)
    assert not np.allclose(run_mla(p, xs, EPS)[5:], fresh)
    assert cache_bytes_per_token(6, 1) == 6


def test_nope_attention_is_permutation_invariant_over_the_past_and_gated():
    """No positional encoding: the last token's output depends on the set of earlier
    tokens, not their order; a gate of zero (large negative W_g x) silences the output."""
    p = random_mla_params(12, 2, 6, 5, 6)
    xs = np.random.default_rng(7).standard_normal((8, 12))
    perm = np.r_[np.random.default_rng(8).permutation(7), 7]
    np.testing.assert_allclose(mla_reference(p, xs, EPS)[-1], mla_reference(p, xs[perm], EPS)[-1], rtol=1e-10)
    p.w_g = -60 * np.outer(np.ones(p.w_g.shape[0]), xs[-1]) / (xs[-1] @ xs[-1])   # W_g x_last = -60
    assert np.abs(run_mla(p, xs, EPS)[-1]).max() < 1e-20
