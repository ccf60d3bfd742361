"""Kimi K3's LatentMoE exit norm (issue 47, difference 4; model.latent_exit_norm):

    y = W_lat_up RMSNorm(sum_i p_i E_i(z)) + sum_j Shared_j(hn),   z = W_lat_down hn

The float model (model/float_latent_moe.py) against an independent reading of the formula
written out here term by term; what the norm does (the routed scale and the router's weights
no longer size the routed part); the integer model (model/int_moe.py: the sum to 16 bits, the
layers' integer RMSNorm to int8, the weight folded into lat_up) against the float one on a
fresh seed, and tests that fail when the norm is left out."""
import dataclasses

import numpy as np
import pytest

from moekda.config import ConfigError, config_from_dict, load_config
from model import float_layer as fl
from model.float_latent_moe import latent_moe_step
from model.int_layer import int_run_layer, quantize_input
from model.cases import assert_traces_close
from model.params import LayerParams, random_inputs, random_params
from model.qparams import QLayer
from model.quantize import quantize_layer


def k3_latent(name="small", **model):
    base = load_config(name).to_dict()
    base["model"].update({"moe_latent": 32 if name == "small" else 8, "latent_exit_norm": True, **model})
    base["name"] = f"{name}-exit-norm"
    return config_from_dict(base)


def _reading(p, hn, top_k, scale, eps, glu):
    """The formula of kimi-layer-math.md ("Kimi K3 as released", LatentMoE exit norm) read
    directly, sharing no code with the model: sigmoid router, bias for selection only,
    weights the chosen scores renormalised and scaled; each expert's gated unit; the RMSNorm
    with its weight; the up-projection; the shared experts at full width."""
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))
    s = sig(p.w_router @ hn)
    chosen = sorted(range(len(s)), key=lambda e: (-(s[e] + p.router_bias[e]), e))[:top_k]
    wts = [s[e] / sum(s[c] for c in chosen) * scale for e in chosen]

    def unit(wg, wu, wd, x):
        g, u = wg @ x, wu @ x
        if glu == "situ":
            return wd @ (4 * np.tanh(g / 4) * sig(g) * 25 * np.tanh(u / 25))
        return wd @ (g * sig(g) * u)
    z = p.w_lat_down @ hn
    acc = np.zeros(z.shape)
    for e, w in zip(chosen, wts):
        acc = acc + w * unit(p.w_gate[e], p.w_up[e], p.w_down[e], z)
    rms = np.sqrt(np.sum(acc ** 2) / acc.size + eps)
    out = p.w_lat_up @ (acc / rms * p.exit_norm_w)
    for j in range(p.sh_gate.shape[0]):
        out = out + unit(p.sh_gate[j], p.sh_up[j], p.sh_down[j], hn)
    return out


@pytest.mark.parametrize("glu", ["swiglu", "situ"])
def test_float_model_is_the_formula(glu):
    cfg = k3_latent(glu=glu)
    m = cfg.model
    p = random_params(cfg, 71).lmoe
    assert p.exit_norm_w is not None and p.exit_norm_w.shape == (m.moe_latent,)
    for hn in np.random.default_rng(72).standard_normal((8, m.d_model)):
        got = latent_moe_step(p, hn, m.top_k, m.routed_scaling, glu=glu, eps=m.norm_eps)[0]
        np.testing.assert_allclose(got, _reading(p, hn, m.top_k, m.routed_scaling, m.norm_eps, glu),
                                   rtol=1e-10, atol=1e-12)


def test_the_norm_makes_the_routed_part_independent_of_the_routed_scale():
    """With the norm, routed_scaling 1.0 (K3's) and 2.5 give the same output (to eps: 1e-12
    here; at norm_eps 1e-6 they differ by ~3e-4 relative, the random models' latent sums having
    a mean square ~1e-3); without it they do not: so this would fail on a model that left the
    norm out."""
    cfg = k3_latent()
    m = cfg.model
    p = random_params(cfg, 73).lmoe
    plain = dataclasses.replace(p, exit_norm_w=None)
    xs = np.random.default_rng(74).standard_normal((8, m.d_model))
    for hn in xs:
        a = latent_moe_step(p, hn, m.top_k, 1.0, eps=1e-12)[0]
        b = latent_moe_step(p, hn, m.top_k, 2.5, eps=1e-12)[0]
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)
    moved = [np.linalg.norm(latent_moe_step(plain, hn, m.top_k, 2.5)[0] - latent_moe_step(plain, hn, m.top_k, 1.0)[0])
             / np.linalg.norm(latent_moe_step(plain, hn, m.top_k, 1.0)[0]) for hn in xs]
    assert min(moved) > 0.05


def test_params_without_the_norm_are_unchanged():
    """The exit weight is drawn last: every other parameter of a seed is the plain LatentMoE's,
    and a file of a plain LatentMoE layer loads without it."""
    with_norm, without = random_params(k3_latent(), 5), random_params(k3_latent(latent_exit_norm=False), 5)
    fa, fb = with_norm.to_flat(), without.to_flat()
    assert set(fa) - set(fb) == {"lmoe.exit_norm_w"}
    assert all(np.array_equal(fa[k], fb[k]) for k in fb)
    assert LayerParams.from_flat(fb).lmoe.exit_norm_w is None
    assert np.array_equal(LayerParams.from_flat(fa).lmoe.exit_norm_w, fa["lmoe.exit_norm_w"])


def test_config_field():
    assert "latent_exit_norm" not in load_config("model-tiny-hybrid").to_dict()["model"]
    with pytest.raises(ConfigError, match=r"^model.latent_exit_norm = 1: must be true or false$"):
        k3_latent(latent_exit_norm=1)
    with pytest.raises(ConfigError, match=r"^model.latent_exit_norm = true: needs a LatentMoE"):
        k3_latent(moe_latent=0)


@pytest.fixture(scope="module")
def layer():
    cfg = k3_latent()
    p = random_params(cfg, 923)                   # a fresh seed (not one of the docs' tables)
    q = quantize_layer(p, cfg, model_seed=923)
    xs = random_inputs(cfg, 64, seed=924, model_seed=923)
    tf, ti = [], []
    fl.run_layer(p, cfg, xs, traces=tf)
    int_run_layer(q, cfg, quantize_input(xs, q, cfg), traces=ti)
    same = np.array([set(map(int, a["idx"])) == set(map(int, b["idx"])) for a, b in zip(tf, ti)])
    return cfg, p, q, xs, tf, ti, same


def test_integer_exit_norm_follows_the_float_one(layer):
    """The 16-bit sum, the int8 unit vector and the outputs against the float trace, on the
    tokens whose experts are the float model's (docs/numerics.md section 12 has the
    measured numbers)."""
    cfg, p, q, xs, tf, ti, same = layer
    assert q.moe.lat_norm is not None and same.mean() > 0.8
    assert_traces_close(tf, ti, q.scales, [("lat_pre", 0.97, 0.99), ("lat_routed", 0.97, 0.99),
                                           ("moe_out", 0.97, 0.99), ("y", 0.99, 0.998)], rows=same)
    # the unit vector has RMS 1 on every token, whatever the sum's size (|lat_pre| spans a range)
    rms = np.array([np.sqrt(np.mean((t["lat_routed"] * q.scales["lat_routed"]) ** 2)) for t in ti])
    pre = np.array([np.sqrt(np.mean(t["lat_pre"].astype(float) ** 2)) for t in ti])
    assert pre.max() / pre.min() > 2 and np.all(np.abs(rms - 1) < 0.05), (pre.min(), pre.max(), rms.min(), rms.max())


def _rel(tf, ti, scale, name="moe_out", rows=None):
    f = np.stack([t[name] for t in tf])[rows]
    i = np.stack([t[name] for t in ti])[rows] * scale
    return np.linalg.norm(f - i) / np.linalg.norm(f)


def test_the_integer_model_without_the_norm_is_far(layer):
    """What the comparisons can see: moe_out's relative error against the float layer is small
    for the integer exit norm; the norm's multiplier halved, or the float layer without the norm,
    are far (cosines alone are blind to a per-token scale, so this uses the relative error)."""
    cfg, p, q, xs, tf, ti, same = layer
    good = _rel(tf, ti, q.scales["moe_out"], rows=same)
    assert good < 0.08, good
    bad = dataclasses.replace(q, moe=dataclasses.replace(q.moe, lat_norm=dataclasses.replace(q.moe.lat_norm,
                                                                                              s=q.moe.lat_norm.s + 1)))
    tb = []
    int_run_layer(bad, cfg, quantize_input(xs, q, cfg), traces=tb)
    assert _rel(tf, tb, q.scales["moe_out"], rows=same) > 3 * good
    plain = dataclasses.replace(p, lmoe=dataclasses.replace(p.lmoe, exit_norm_w=None))
    tp = []
    fl.run_layer(plain, cfg, xs, traces=tp)
    assert _rel(tp, ti, q.scales["moe_out"], rows=same) > 3 * good


def test_flat_names_round_trip(layer):
    cfg, p, q, xs, tf, ti, same = layer
    flat = q.to_flat()
    assert {"moe.lat_norm.eps_int", "moe.lat_norm.m", "moe.lat_norm.s"} <= set(flat)
    back = QLayer.from_flat(flat)
    tb = []
    int_run_layer(back, cfg, quantize_input(xs, q, cfg), traces=tb)
    assert all(np.array_equal(a["y"], b["y"]) for a, b in zip(ti, tb))
