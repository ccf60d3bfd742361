"""The integer model: hand-worked cases of the delta rule and routing, properties, reset, formats."""
from types import SimpleNamespace

import numpy as np
import pytest

from moekda.config import config_from_dict, load_config
from moekda.formats import derived_widths, formats_for
from moekda.numerics import lut_lookup, requantize, round_shift
from model.int_kda import IntKDAState, int_delta_rule, int_kda_step
from model.int_layer import int_run_layer, quantize_input
from model.int_moe import int_moe_step, int_route
from model.params import random_inputs, random_params
from model.quantize import calibration_sequences, quantize_layer


def small_calib(cfg, model_seed):
    return calibration_sequences(cfg, n_seq=2, n_tokens=64, model_seed=model_seed)


@pytest.fixture(scope="module")
def tiny():
    cfg = load_config("tiny")
    p = random_params(cfg, seed=0)
    return cfg, p, quantize_layer(p, cfg, small_calib(cfg, 0))


@pytest.fixture(scope="module")
def odd():
    cfg = config_from_dict({"name": "odd", "model": dict(d_model=24, n_heads=3, head_dim=8, n_experts=6, top_k=3,
                                                         d_ff=12, n_shared=2, gate_rank=5), "hw": {"lanes": 8, "weight_port_bytes": 8}})
    p = random_params(cfg, seed=1)
    return cfg, p, quantize_layer(p, cfg, small_calib(cfg, 1))


def test_delta_rule_unit_key_beta_one_reads_back_value():
    """k one-hot with value 1.0 (f_k = 6: 64), beta = 1.0 (256), no decay, S = 0: o = v exactly."""
    fm = formats_for(load_config("tiny"))
    q = SimpleNamespace(f_k=6, f_s=10, f_v=10, o_shift=6)
    H, dk = 1, 4
    k = np.zeros((H, dk), np.int64); k[0, 1] = 64
    v = np.array([[300, -7, 0, 1023]])
    alpha = np.full((H, dk), (1 << fm.alpha_frac) - 1)
    S, o = int_delta_rule(q, fm, np.zeros((H, dk, dk), np.int64), k, k, v, alpha, np.array([1 << fm.unit_frac]))
    assert np.array_equal(S[0, 1], v[0]) and not S[0, [0, 2, 3]].any()
    assert np.array_equal(o, v)


def test_delta_rule_replaces_old_value_under_same_key():
    fm = formats_for(load_config("tiny"))
    q = SimpleNamespace(f_k=6, f_s=10, f_v=10, o_shift=6)
    k = np.zeros((1, 4), np.int64); k[0, 3] = 64
    S0 = np.zeros((1, 4, 4), np.int64); S0[0, 3] = [5, 6, 7, 8]; S0[0, 0] = [1, 2, 3, 4]
    alpha = np.full((1, 4), 1 << (fm.alpha_frac - 1))            # decay by exactly 1/2
    v = np.array([[100, 200, -300, 0]])
    S, o = int_delta_rule(q, fm, S0, k, k, v, alpha, np.array([256]))
    assert np.array_equal(S[0, 3], v[0])                         # replaced, not added
    assert np.array_equal(S[0, 0], round_shift(S0[0, 0] * alpha[0, 0], fm.alpha_frac))  # only decayed
    assert np.array_equal(o[0], v[0])


def test_zero_input_state_only_decays(tiny):
    cfg, p, qp = tiny
    fm = formats_for(cfg)
    rng = np.random.default_rng(3)
    st = IntKDAState.zeros(cfg)
    st.S = rng.integers(-20000, 20000, st.S.shape)
    st2, out = int_kda_step(qp.kda, cfg, fm, st, np.zeros(cfg.model.d_model, np.int64))
    # x = 0: every projection is 0 except the decay's bias, so alpha = table(requantize(bias))
    code = requantize(qp.kda.f_up.bias, qp.kda.f_up.m, qp.kda.f_up.s, fm.lut_in_bits)
    alpha = lut_lookup(qp.kda.alpha.table, code, fm.lut_in_bits).reshape(st.S.shape[:2])
    assert np.array_equal(st2.S, round_shift(st.S * alpha[:, :, None], fm.alpha_frac))
    assert not out.any()


def test_router_ties_lowest_index_and_weights(tiny):
    cfg, p, qp = tiny
    fm = formats_for(cfg)
    moe = SimpleNamespace(**{**qp.moe.__dict__, "bias": np.zeros(4, np.int64)})
    idx, wt = int_route(moe, cfg, fm, np.array([100, 20000, 20000, 20000]))
    assert idx.tolist() == [1, 2]
    rs = qp.moe.rs
    assert wt.tolist() == [round_shift((1 << fm.wn_frac) // 2 * rs, fm.rs_frac)] * 2
    idx, wt = int_route(moe, cfg, fm, np.zeros(4, np.int64))   # all scores 0: weights 0, no division by 0
    assert idx.tolist() == [0, 1] and not wt.any()


def test_routing_weights_sum_to_scaling_factor(odd):
    cfg, p, qp = odd
    fm = formats_for(cfg)
    target = cfg.model.routed_scaling * (1 << fm.wn_frac)
    xs = quantize_input(random_inputs(cfg, 30, seed=4, model_seed=1), qp, cfg)
    traces = []
    int_run_layer(qp, cfg, xs, traces=traces)
    for t in traces:
        # floor division loses < 1 LSB per expert, the scaling rounds once per expert
        assert abs(int(t["w"].sum()) - target) <= cfg.model.top_k * (1 + qp.moe.rs / (1 << fm.rs_frac))
        assert len(set(t["idx"].tolist())) == cfg.model.top_k


def test_moe_picks_by_choice_but_weights_by_score(tiny):
    cfg, p, qp = tiny
    fm = formats_for(cfg)
    moe = SimpleNamespace(**{**qp.moe.__dict__, "bias": np.array([0, 30000, 0, 0])})
    idx, wt = int_route(moe, cfg, fm, np.array([20000, 100, 10000, 0]))
    assert idx.tolist() == [1, 0]
    assert wt[0] < wt[1]          # expert 1 chosen by its bias, weighted by its small score


def test_sequence_reset_equals_fresh_runs(odd):
    cfg, p, qp = odd
    xs = quantize_input(random_inputs(cfg, 10, seed=5, model_seed=1), qp, cfg)
    resets = np.zeros(10, bool); resets[6] = True
    ys = int_run_layer(qp, cfg, xs, resets)
    assert np.array_equal(ys[:6], int_run_layer(qp, cfg, xs[:6]))
    assert np.array_equal(ys[6:], int_run_layer(qp, cfg, xs[6:]))
    assert not np.array_equal(int_run_layer(qp, cfg, xs)[6:], ys[6:])


def test_every_tensor_is_integer_and_in_its_format(odd):
    cfg, p, qp = odd
    fm = formats_for(cfg)
    xs = quantize_input(random_inputs(cfg, 20, seed=6, model_seed=1), qp, cfg)
    xs[3] = 0                                   # corner tokens: all zero, full scale
    xs[4] = (1 << (fm.resid_bits - 1)) - 1
    xs[5] = -(1 << (fm.resid_bits - 1))
    traces = []
    int_run_layer(qp, cfg, xs, traces=traces)
    widths = {"y": fm.resid_bits, "h": fm.resid_bits, "S": fm.state_bits, "o16": fm.o_bits,
              "kda_out": fm.act_bits, "moe_out": fm.resid_bits, "xn_unit": fm.act_bits, "q": fm.qk_bits,
              "k": fm.qk_bits, "v": fm.qkv_bits, "zo": fm.act_bits, "z": fm.lut_in_bits}
    for t in traces:
        for name, bits in widths.items():
            a = np.asarray(t[name])
            assert a.dtype.kind == "i", name
            assert a.min() >= -(1 << (bits - 1)) and a.max() < (1 << (bits - 1)), name
        assert 0 <= t["beta"].min() and t["beta"].max() <= 1 << fm.unit_frac
        assert 1 <= t["alpha"].min() and t["alpha"].max() < 1 << fm.alpha_frac
    assert not traces[3]["xn_unit"].any()       # RMSNorm of zero is zero
    dw = derived_widths(cfg)
    for t in traces:                            # the stated intermediate widths hold
        for name, bits in (("o_acc", dw["o_acc"]), ("kS", fm.state_bits), ("u", fm.state_bits),
                           ("moe_acc", dw["moe_combine_acc"])):
            a = np.asarray(t[name])
            assert a.min() >= -(1 << (bits - 1)) and a.max() < (1 << (bits - 1)), name
        for e in t["experts"]:
            assert 0 <= int(e["hid_shift"]) <= fm.act_bits


def test_moe_step_is_deterministic_and_integer(tiny):
    cfg, p, qp = tiny
    fm = formats_for(cfg)
    hn = np.random.default_rng(7).integers(-128, 128, cfg.model.d_model)
    a, (ia, wa) = int_moe_step(qp.moe, cfg, fm, hn)
    b, (ib, wb) = int_moe_step(qp.moe, cfg, fm, hn)
    assert np.array_equal(a, b) and np.array_equal(ia, ib) and a.dtype.kind == "i"


def test_layer_input_outside_format_is_an_error(tiny):
    cfg, p, qp = tiny
    with pytest.raises(OverflowError, match="layer input"):
        int_run_layer(qp, cfg, np.full((1, cfg.model.d_model), 1 << 20))
