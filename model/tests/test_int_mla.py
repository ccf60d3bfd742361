"""Integer model of the Gated MLA token mixer (issue 15; model/int_mla.py, quantised by
model/quantize.py _quantize_mla; formats and measured error in docs/numerics.md
section 9): the online softmax against its token-by-token recurrence and against the exact
softmax of the same integer scores (at context 4096 too), the layer against the float
model, the cache, the flat names and the batch path."""
import math

import numpy as np
import pytest

from moekda.config import config_from_dict, load_config, require_chip_model
from moekda.formats import derived_widths, formats_for
from model import float_layer as fl
from model.int_layer import int_layer_step, int_mixer_state, int_run_layer, quantize_input
from model.int_mla import IntMLACache, int_mla_step, online_softmax
from model.int_model import int_run_model
from model.params import random_inputs, random_model_params, random_params, random_tokens
from model.qparams import QLayer, QModel
from model.quantize import quantize_layer, quantize_model
from model.cases import assert_traces_close, trace_moves


def hybrid(name="model-tiny", **model):
    base = load_config(name).to_dict()
    base["model"].update(model)
    base["name"] = f"{name}-mla"
    return config_from_dict(base)


def recurrence(u, c, fm):
    """The module docstring's recurrence, one token at a time (the hardware's order)."""
    F, table = fm.mla_exp_frac, fm.mla_exp2_table
    M, l, acc = None, 0, np.zeros(c.shape[1], dtype=np.int64)
    for uj, cj in zip(u.tolist(), c):
        whole = -((-uj) >> F)
        if M is None:
            M = whole
        elif whole > M:
            l, acc, M = l >> (whole - M), acc >> (whole - M), whole
        delta = (M << F) - uj
        p = int(table[delta & ((1 << F) - 1)]) >> min(delta >> F, 62)
        l, acc = l + p, acc + p * cj
    return np.array([int(np.sign(a)) * ((2 * abs(int(a)) + l) // (2 * l)) for a in acc])


def exact(u, c, fm):
    """softmax(u as base-2 scores) @ c in float64, from the same integers."""
    x = u / 2.0 ** fm.mla_exp_frac * math.log(2)
    w = np.exp(x - x.max())
    return (w / w.sum()) @ c


@pytest.mark.parametrize("T, spread, rising", [(1, 4, False), (7, 4, False), (300, 6, False), (300, 12, True),
                                               (4096, 8, False), (4096, 20, True)])
def test_online_softmax_is_its_recurrence_and_near_the_exact_softmax(T, spread, rising):
    fm = formats_for(load_config("tiny"))
    widths = derived_widths(load_config("tiny"))
    rng = np.random.default_rng(T + spread)
    u = rng.normal(0, spread, T) * 2 ** fm.mla_exp_frac
    if rising:                                 # the maximum grows often: many rescaling shifts
        u = u + np.linspace(0, 8 * spread, T) * 2 ** fm.mla_exp_frac
    u = np.round(u).astype(np.int64)
    c = rng.integers(-128, 128, (T, 8))
    got = online_softmax(u, c, fm, widths["mla_sum"], widths["mla_acc"], fm.act_bits)
    assert np.array_equal(got, recurrence(u, c, fm))
    # the table (2**-1/512 steps), the floor shifts and the final rounding: within 1 LSB
    assert np.max(np.abs(got - exact(u, c, fm))) <= 1.0


@pytest.fixture(scope="module")
def mla_layer():
    cfg = hybrid("small", n_layers=1, layers=["mla"], mixers=["moe"], kv_rank=32, vocab=0, tie_embedding=False)
    p = random_params(cfg, 23, kind="mla")
    return cfg, p, quantize_layer(p, cfg, model_seed=23)


def test_the_layer_follows_the_float_one(mla_layer):
    """One MLA layer on a fresh sequence: the cached latent, the query side, the softmax's
    weighted latent, the head outputs, the mixer's output and the residual after it,
    dequantised, against the float trace (measured on seeds 23-25, 128 tokens: mla_out cos
    min 0.975-0.989, mean 0.9965-0.9977)."""
    cfg, p, q = mla_layer
    xs = random_inputs(cfg, 96, seed=323, model_seed=23)
    tf, ti = [], []
    fl.run_layer(p, cfg, xs, traces=tf)
    int_run_layer(q, cfg, quantize_input(xs, q, cfg), traces=ti)
    w = np.tile(p.mla.kv_norm_w, p.mla.heads)
    folded = {"mla_qa": w, "mla_ctx": 1 / w}       # the norm weight is on the other side in the integer model
    assert_traces_close(tf, ti, q.scales, [("mla_c_unit", 0.99, 0.999), ("mla_qa", 0.99, 0.998),
                                           ("mla_ctx", 0.98, 0.997), ("mla_o", 0.98, 0.997),
                                           ("mla_out", 0.95, 0.994), ("h", 0.998, 0.9995)], fold=folded)


def test_a_wrong_score_multiplier_breaks_the_match(mla_layer):
    """The comparison can fail: scores at 4x their scale sharpen the softmax."""
    import dataclasses
    cfg, p, q = mla_layer
    bad = dataclasses.replace(q, mla=dataclasses.replace(q.mla, u_s=q.mla.u_s - 2))
    xs = quantize_input(random_inputs(cfg, 48, seed=324, model_seed=23), q, cfg)
    assert trace_moves(q, bad, cfg, xs, "mla_ctx") > 0.2


def test_the_cache_grows_by_one_int8_latent_and_resets(mla_layer):
    cfg, _, q = mla_layer
    fm = formats_for(cfg)
    xs = quantize_input(random_inputs(cfg, 6, seed=5, model_seed=23), q, cfg)
    st = int_mixer_state(q, cfg)
    for t, x in enumerate(xs):
        before = len(st.latents)
        st2, _ = int_layer_step(q, cfg, st, x)
        assert len(st.latents) == before                      # the state passed in is unchanged
        assert len(st2.latents) == t + 1 and st2.latents[-1].shape == (32,)
        assert np.abs(st2.latents[-1]).max() <= 127
        st = st2
    # a reset is a fresh run: the same outputs as the sequence alone
    ys = int_run_layer(q, cfg, np.concatenate([xs, xs]), resets=[False] * 6 + [True] + [False] * 5)
    assert np.array_equal(ys[6:], int_run_layer(q, cfg, xs))
    assert fm.act_bits == 8                                   # the cache is r bytes per token


def test_one_token_at_context_4096(mla_layer):
    """A token against 4096 cached latents (random int8, as a long sequence leaves them):
    the widths hold, and its softmax-weighted latent is the exact softmax's within 1 LSB."""
    cfg, _, q = mla_layer
    fm = formats_for(cfg)
    rng = np.random.default_rng(4096)
    cache = IntMLACache([rng.integers(-127, 128, 32) for _ in range(4095)])
    xn = rng.integers(-100, 101, cfg.model.d_model)
    tr = {}
    cache2, out = int_mla_step(q.mla, cfg, fm, cache, xn, tr)
    assert len(cache2.latents) == 4096 and out.shape == (cfg.model.d_model,)
    C = cache2.stacked()
    qa = tr["mla_qa"].reshape(cfg.model.n_heads, -1)
    from moekda.numerics import requantize
    for h in range(cfg.model.n_heads):
        u = requantize(C @ qa[h], q.mla.u_m, q.mla.u_s, fm.mla_u_bits)
        want = exact(u, C, fm)
        got = tr["mla_ctx"].reshape(cfg.model.n_heads, -1)[h]
        assert np.max(np.abs(got - want)) <= 1.0


def test_flat_names_round_trip_and_the_kda_layer_keeps_its_own(mla_layer):
    cfg, _, q = mla_layer
    back = QLayer.from_flat(q.to_flat())
    assert back.kind == "mla" and back.kda is None
    xs = quantize_input(random_inputs(cfg, 8, seed=6, model_seed=23), q, cfg)
    assert np.array_equal(int_run_layer(back, cfg, xs), int_run_layer(q, cfg, xs))
    plain = quantize_layer(random_params(load_config("tiny"), 3), load_config("tiny"), model_seed=3)
    assert plain.kind == "kda" and not [k for k in plain.to_flat() if k.startswith("mla.")]


def test_a_hybrid_model_batch_is_each_sequence_alone():
    cfg = hybrid(layers=["kda", "kda", "kda", "mla"], kv_rank=8, moe_latent=8)
    mp = random_model_params(cfg, 41)
    qm = quantize_model(mp, cfg, model_seed=41)
    assert [q.kind for q in qm.layers] == ["kda", "kda", "kda", "mla"]
    back = QModel.from_flat(qm.to_flat(), cfg.model.n_layers)
    seqs = np.stack([random_tokens(cfg, 10, seed=50 + i, model_seed=41) for i in range(3)])
    batch = int_run_model(qm, cfg, seqs)
    for s, got in zip(seqs, batch):
        assert np.array_equal(got, int_run_model(back, cfg, s))


def test_the_chip_takes_mla_layers_latent_moe_and_attn_res():
    require_chip_model(hybrid(layers=["kda", "kda", "kda", "mla"], kv_rank=8))
    cfg = hybrid(layers=["kda", "kda", "kda", "mla"], kv_rank=8, moe_latent=8)
    require_chip_model(cfg)
    require_chip_model(hybrid(layers=["kda", "kda", "kda", "mla"], kv_rank=8, attn_res="full"))
