"""The float model against hand-worked cases and properties of the reference math."""
import numpy as np
import pytest

from moekda.config import config_from_dict, load_config
from model import float_layer as fl
from model.params import random_inputs, random_params


@pytest.fixture(scope="module")
def tiny():
    cfg = load_config("tiny")
    return cfg, random_params(cfg, seed=3)


def odd_cfg(**model):
    """A config with several heads / experts to check nothing assumes H == 1 or k == 2."""
    base = dict(d_model=24, n_heads=3, head_dim=8, n_experts=6, top_k=3, d_ff=12, n_shared=2, gate_rank=5)
    base.update(model)
    return config_from_dict({"name": "odd", "model": base, "hw": {"lanes": 8, "weight_port_bytes": 8}})


def test_rmsnorm_hand_case():
    x = np.array([3.0, 4.0])                      # mean square 12.5
    y = fl.rmsnorm(x, np.array([1.0, 2.0]), eps=0.0)
    assert np.allclose(y, [3 / np.sqrt(12.5), 8 / np.sqrt(12.5)])


def test_l2norm_gives_unit_vectors_and_zero_stays_zero():
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    y = fl.l2norm(x)
    assert np.allclose(y[0], [0.6, 0.8], atol=1e-6) and np.all(y[1] == 0)


def test_causal_conv_hand_case():
    hist = np.array([[1.0], [2.0], [3.0]])       # tokens t-3, t-2, t-1 of one channel
    w = np.array([[1.0, 10.0, 100.0, 1000.0]])   # tap 3 multiplies the current token
    hist2, out = fl.causal_conv_step(hist, np.array([4.0]), w)
    assert out[0] == 1 * 1 + 10 * 2 + 100 * 3 + 1000 * 4
    assert hist2[:, 0].tolist() == [2.0, 3.0, 4.0]


def test_gate_is_bounded_by_lower_bound():
    f = np.linspace(-5, 5, 101)
    g = fl.kda_gate(f, np.array([np.log(3.0)]), np.zeros(101), -5.0, 101)
    assert np.all(g < 0) and np.all(g > -5.0)
    assert np.isclose(fl.kda_gate(np.zeros(1), np.zeros(1), np.zeros(1), -4.0, 1)[0], -2.0)  # sigmoid(0) = 1/2


def test_zero_input_state_only_decays(tiny):
    """x = 0 with an empty conv history: q = k = v = 0, so S' = diag(exp g) S exactly."""
    cfg, p = tiny
    rng = np.random.default_rng(0)
    st = fl.KDAState.zeros(cfg)
    st.S[...] = rng.normal(size=st.S.shape)
    st2, out = fl.kda_step(p.kda, cfg, st, np.zeros(cfg.model.d_model))
    H, dk = cfg.model.n_heads, cfg.model.head_dim
    a = np.repeat(np.exp(p.kda.a_log), dk)
    alpha = np.exp(cfg.model.decay_lower_bound / (1 + np.exp(-a * p.kda.dt_bias)))  # f = 0
    assert np.allclose(st2.S, st.S * alpha.reshape(H, dk, 1))
    assert np.all(out == 0)   # q = 0 reads nothing


def test_beta_one_unit_key_reads_back_written_value():
    H, dk = 1, 4
    rng = np.random.default_rng(1)
    S0 = rng.normal(size=(H, dk, dk))
    k = np.zeros((H, dk)); k[0, 2] = 1.0
    v = rng.normal(size=(H, dk))
    g = np.zeros((H, dk))                      # no decay: exp(0) = 1
    S, o = fl.delta_rule_step(S0, k, k, v, g, np.ones(H))
    assert np.allclose(o, v)                   # the old content under key 2 was replaced
    others = [0, 1, 3]
    assert np.allclose(S[0, others], S0[0, others])   # other key rows untouched


def test_delta_rule_matches_paper_form():
    """S_t = (I - beta k k^T) Diag(alpha) S_{t-1} + beta k v^T."""
    rng = np.random.default_rng(2)
    H, dk, dv = 2, 5, 3
    S0 = rng.normal(size=(H, dk, dv))
    q, k = rng.normal(size=(H, dk)), fl.l2norm(rng.normal(size=(H, dk)))
    v, g, beta = rng.normal(size=(H, dv)), -rng.uniform(0, 2, (H, dk)), rng.uniform(0, 1, H)
    S, o = fl.delta_rule_step(S0, q, k, v, g, beta)
    for h in range(H):
        ref = (np.eye(dk) - beta[h] * np.outer(k[h], k[h])) @ np.diag(np.exp(g[h])) @ S0[h] \
            + beta[h] * np.outer(k[h], v[h])
        assert np.allclose(S[h], ref)
        assert np.allclose(o[h], ref.T @ q[h])


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_chunked_and_recurrent_forms_agree(chunk):
    rng = np.random.default_rng(4)
    T, H, dk = 37, 2, 6
    S0 = rng.normal(size=(H, dk, dk))
    q, k = fl.l2norm(rng.normal(size=(T, H, dk))), fl.l2norm(rng.normal(size=(T, H, dk)))
    v, g, beta = rng.normal(size=(T, H, dk)), -rng.uniform(0, 5, (T, H, dk)), rng.uniform(0, 1, (T, H))
    S = S0
    o_rec = []
    for t in range(T):
        S, o = fl.delta_rule_step(S, q[t], k[t], v[t], g[t], beta[t])
        o_rec.append(o)
    S_ch, o_ch = fl.delta_rule_chunked(S0, q, k, v, g, beta, chunk=chunk)
    assert np.allclose(o_ch, np.array(o_rec), atol=1e-10)
    assert np.allclose(S_ch, S, atol=1e-10)


def test_router_ties_go_to_lowest_index():
    scores = np.array([0.5, 0.7, 0.7, 0.7, 0.1])
    idx, w = fl.moe_route(scores, np.zeros(5), 2, 1.0)
    assert idx.tolist() == [1, 2]
    assert np.allclose(w, [0.5, 0.5])


def test_router_bias_selects_but_does_not_weight():
    scores = np.array([0.9, 0.2, 0.3])
    idx, w = fl.moe_route(scores, np.array([0.0, 1.0, 0.0]), 2, 3.0)
    assert idx.tolist() == [1, 0]                 # expert 1 chosen only through its bias
    assert np.allclose(w, 3.0 * np.array([0.2, 0.9]) / 1.1)


def test_routing_weights_sum_to_scaling_factor():
    cfg = odd_cfg()
    p = random_params(cfg, seed=5)
    for x in random_inputs(cfg, 20, seed=6):
        tr = {}
        fl.moe_step(p.moe, cfg, fl.rms_unit(x, 1e-6), tr)
        assert np.isclose(tr["w"].sum(), cfg.model.routed_scaling)
        assert len(set(tr["idx"].tolist())) == cfg.model.top_k


def test_moe_all_experts_zero_bias_is_dense_weighted_sum():
    cfg = odd_cfg(top_k=6)
    p = random_params(cfg, seed=7)
    p.moe.router_bias[:] = 0.0
    x = random_inputs(cfg, 1, seed=8)[0]
    out, _ = fl.moe_step(p.moe, cfg, x)
    m = p.moe
    s = fl.sigmoid(m.w_router @ x)
    expert = lambda wg, wu, wd: wd @ (fl.silu(wg @ x) * (wu @ x))
    dense = sum(s[e] * expert(m.w_gate[e], m.w_up[e], m.w_down[e]) for e in range(6)) / s.sum()
    dense = dense * cfg.model.routed_scaling + sum(expert(m.sh_gate[j], m.sh_up[j], m.sh_down[j]) for j in range(2))
    assert np.allclose(out, dense)


def test_sequence_reset_equals_fresh_runs():
    cfg = odd_cfg()
    p = random_params(cfg, seed=9)
    xs = random_inputs(cfg, 12, seed=10)
    resets = np.zeros(12, bool); resets[7] = True
    ys = fl.run_layer(p, cfg, xs, resets)
    assert np.allclose(ys[:7], fl.run_layer(p, cfg, xs[:7]))
    assert np.allclose(ys[7:], fl.run_layer(p, cfg, xs[7:]))
    # without the reset the second part differs: the state really is carried
    assert not np.allclose(fl.run_layer(p, cfg, xs)[7:], ys[7:])


def test_layer_is_causal(tiny):
    cfg, p = tiny
    xs = random_inputs(cfg, 10, seed=11)
    ys = fl.run_layer(p, cfg, xs)
    xs2 = xs.copy(); xs2[6:] += 5.0
    ys2 = fl.run_layer(p, cfg, xs2)
    assert np.allclose(ys[:6], ys2[:6]) and not np.allclose(ys[6:], ys2[6:])


def test_params_roundtrip_npz(tmp_path, tiny):
    from model.params import load_params, save_params
    cfg, p = tiny
    save_params(p, tmp_path / "p.npz")
    q = load_params(tmp_path / "p.npz", cfg)
    for name, arr in p.to_flat().items():
        assert np.array_equal(arr, q.to_flat()[name])


def test_params_wrong_shape_is_one_line_error(tmp_path, tiny):
    from model.params import load_params, save_params
    cfg, p = tiny
    save_params(p, tmp_path / "p.npz")
    with pytest.raises(ValueError, match=r"parameter \w+: shape .* config odd needs"):
        load_params(tmp_path / "p.npz", odd_cfg())
