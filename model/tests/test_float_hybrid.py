"""The float model of K3's hybrid stack (issue 15): Gated MLA layers, Attention Residuals and
LatentMoE inside model/float_model.py, checked against the parts' own models
(float_mla.mla_reference, float_attn_res.run_stack, float_latent_moe) and against the
chip's stack where the hybrid's parts are absent."""
import dataclasses

import numpy as np
import pytest

from moekda.config import config_from_dict, load_config
from model import float_model as fm
from model.float_attn_res import run_stack as attn_res_stack
from model.float_latent_moe import latent_moe_step
from model.float_layer import KDAState, moe_step, rms_unit
from model.float_mla import MLACache, mla_reference
from model.params import ModelParams, check_model_shapes, random_model_params


def hybrid(**model):
    base = load_config("model-tiny").to_dict()
    base["model"].update(model)
    base["name"] = "hybrid"
    return config_from_dict(base)


def test_the_hybrid_path_is_the_chip_stack_without_hybrid_parts():
    cfg = load_config("model-tiny")
    mp = random_model_params(cfg, 3)
    toks = np.random.default_rng(4).integers(0, cfg.model.vocab, 24)
    st_a = st_b = fm.ModelState.zeros(cfg)
    for tok in toks:
        st_a, xa = fm.stack_step(mp, cfg, st_a, fm.embed(mp, cfg, tok))
        st_b, xb = fm.stack_step(mp, cfg, st_b, fm.embed(mp, cfg, tok), hybrid=True)
        np.testing.assert_allclose(xb, xa, rtol=1e-12, atol=1e-12)


def test_an_mla_layer_is_its_textbook_form_with_the_residuals():
    cfg = hybrid(n_layers=1, layers=["mla"], mixers=["moe"], kv_rank=8, vocab=0, tie_embedding=False)
    mp = random_model_params(cfg, 5)
    lp = mp.layers[0]
    xs = np.random.default_rng(6).standard_normal((20, cfg.model.d_model)) * 2
    resets = np.zeros(20, bool)
    resets[[0, 11]] = True
    eps = cfg.model.norm_eps
    attn = mla_reference(lp.mla, rms_unit(xs, eps) * lp.attn_norm_w, eps, resets)
    hs = xs + attn
    want = np.stack([h + moe_step(lp.moe, cfg, rms_unit(h, eps) * lp.mlp_norm_w)[0] for h in hs])
    np.testing.assert_allclose(fm.run_stack(mp, cfg, xs, resets), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode,block", [("full", 2), ("block", 2), ("block", 3)])
def test_attention_residuals_mix_the_sub_layers(mode, block):
    cfg = hybrid(layers=["kda", "kda", "kda", "mla"], kv_rank=8, attn_res=mode, attn_res_block=block)
    mp = random_model_params(cfg, 7)
    x0 = fm.embed(mp, cfg, 9)
    subs = []
    for lp in mp.layers:   # one token from an empty state: each sub-layer a function of its input
        st0 = MLACache() if lp.kind == "mla" else KDAState.zeros(cfg)
        subs.append(lambda h, lp=lp, st0=st0: fm.token_mix(lp, cfg, st0, rms_unit(h, 1e-6) * lp.attn_norm_w, {})[1])
        subs.append(lambda h, lp=lp: fm.channel_mix(lp, cfg, rms_unit(h, 1e-6) * lp.mlp_norm_w, {}))
    want = attn_res_stack(mode, x0, subs, mp.res_queries, cfg.model.norm_eps, block)
    _, got = fm.stack_step(mp, cfg, fm.ModelState.zeros(cfg), x0)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    plain = hybrid(layers=["kda", "kda", "kda", "mla"], kv_rank=8)
    mp_plain = dataclasses.replace(mp, res_queries=None)
    _, other = fm.stack_step(mp_plain, plain, fm.ModelState.zeros(plain), x0)
    assert not np.allclose(got, other)          # AttnRes is not the plain residual


def test_latent_moe_layer_and_context_growth():
    cfg = hybrid(layers=["kda", "kda", "kda", "mla"], kv_rank=8, moe_latent=8)
    mp = random_model_params(cfg, 8)
    assert mp.layers[1].lmoe is not None and mp.layers[1].moe is None and mp.layers[0].dense is not None
    h = np.random.default_rng(9).standard_normal(cfg.model.d_model)
    want = latent_moe_step(mp.layers[1].lmoe, h, cfg.model.top_k, cfg.model.routed_scaling)[0]
    np.testing.assert_allclose(fm.channel_mix(mp.layers[1], cfg, h, {}), want, rtol=1e-12)
    toks = np.random.default_rng(10).integers(0, cfg.model.vocab, 12)
    st = fm.ModelState.zeros(cfg)
    for t, tok in enumerate(toks):
        st, logits = fm.model_step(mp, cfg, st, tok)
        assert len(st.layers[3].latents) == t + 1                   # the MLA cache grows per token
        assert st.layers[0].S.shape == KDAState.zeros(cfg).S.shape  # the KDA state does not
    assert np.isfinite(logits).all()


def test_hybrid_parameters_round_trip_and_are_checked():
    cfg = hybrid(layers=["kda", "mla", "kda", "mla"], kv_rank=6, attn_res="full", moe_latent=4)
    mp = random_model_params(cfg, 11)
    back = ModelParams.from_flat(mp.to_flat(), cfg)
    for k, v in mp.to_flat().items():
        np.testing.assert_array_equal(back.to_flat()[k], v)
    assert [lp.kind for lp in back.layers] == list(cfg.model.layers)
    flat = mp.to_flat()
    del flat["attn_res.queries"]
    with pytest.raises(ValueError, match="attn_res.queries missing"):
        ModelParams.from_flat(flat, cfg)
    kda_only = hybrid(attn_res="full")
    with pytest.raises(ValueError, match="layer 1 is a mla layer"):
        check_model_shapes(ModelParams.from_flat(mp.to_flat(), kda_only), kda_only)


def test_the_chip_takes_the_hybrid():
    from moekda.config import require_chip_model
    require_chip_model(hybrid(layers=["kda", "kda", "kda", "mla"], kv_rank=8, attn_res="full"))
