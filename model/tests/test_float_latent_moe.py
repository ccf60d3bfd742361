"""model/float_latent_moe.py (issue 15): with an identity latent (l = d, both latent
projections the identity) LatentMoE is float_layer's plain MoE; the router sees the full
width (the latent projections do not change the choice); the chosen experts' bytes scale
with l / d."""
import numpy as np

from moekda.config import load_config
from model.float_latent_moe import (LatentMoEParams, expert_weight_bytes, latent_moe_step,
                                         random_latent_moe_params)
from model.float_layer import moe_step
from model.params import random_params


def test_identity_latent_is_the_plain_moe():
    cfg = load_config("small")
    m = cfg.model
    p = random_params(cfg, seed=3).moe
    eye = np.eye(m.d_model)
    lp = LatentMoEParams(p.w_router, p.router_bias, eye, eye, p.w_gate, p.w_up, p.w_down, p.sh_gate, p.sh_up, p.sh_down)
    for x in np.random.default_rng(4).standard_normal((6, m.d_model)):
        want, (idx_w, w_w) = moe_step(p, cfg, x)
        got, (idx_g, w_g) = latent_moe_step(lp, x, m.top_k, m.routed_scaling)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        assert list(idx_g) == list(idx_w)


def test_router_sees_the_full_width():
    p = random_latent_moe_params(32, 8, 16, 6, 1, seed=5)
    x = np.random.default_rng(6).standard_normal(32)
    _, (idx, _) = latent_moe_step(p, x, 2, 2.5)
    p.w_lat_down = 3.0 * p.w_lat_down          # scaling the latent changes the experts' inputs only
    _, (idx2, _) = latent_moe_step(p, x, 2, 2.5)
    assert list(idx) == list(idx2)


def test_expert_bytes_scale_with_latent_width():
    assert expert_weight_bytes(64, 16) * 4 == expert_weight_bytes(64, 64)
