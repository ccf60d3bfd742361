"""train/model.py against model/'s float model: the same numbers on random parameters
(float64, max |difference| <= 1e-5 absolute; measured ~3e-14 on logits of size ~80), the
same sequence restarts, gradients through the chosen experts only, and an exact
parameter round trip.  Skipped when the training extra (JAX) is not installed."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

from moekda.config import load_config  # noqa: E402
from model import float_layer as fl, float_model as fm  # noqa: E402
from model.params import (random_inputs, random_model_params, random_params,  # noqa: E402
                               random_tokens)
from model.cases import model_config  # noqa: E402
from train import model as tm  # noqa: E402

ATOL = 1e-5   # absolute, on logits (|logit| up to ~100) and on residual streams

# model-tiny (a dense layer 0, three MoE layers, tied head), an untied variant with two
# heads, three of five experts, no shared expert and the dense layer second
CONFIGS = {
    "model-tiny": lambda: model_config("model-tiny"),
    "model-tiny-2h-untied": lambda: model_config("model-tiny", n_heads=2, head_dim=8, n_experts=5, top_k=3,
                                                 n_shared=0, tie_embedding=False,
                                                 mixers=["moe", "dense", "moe", "moe"]),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_model_logits_equal_float_model_with_restart(name):
    cfg = CONFIGS[name]()
    mp = random_model_params(cfg, 3)
    T = 40
    toks = random_tokens(cfg, T, seed=2, model_seed=3)
    resets = np.array([t == 17 for t in range(T)])
    ref = fm.run_model(mp, cfg, toks, resets)
    # compiled, as training runs it (and one compilation is faster than op-by-op dispatch)
    run = jax.jit(lambda tree, toks, resets: tm.run_model(tree, cfg, toks, resets))
    tree = tm.to_tree(mp)
    got = np.asarray(run(tree, toks, resets))
    assert np.max(np.abs(got - ref)) <= ATOL, np.max(np.abs(got - ref))
    # the restart is one: from token 17 on, the logits are a fresh run's on the tail, and
    # they differ from the run without the restart
    tail = np.asarray(tm.run_model(tree, cfg, toks[17:]))
    assert np.max(np.abs(got[17:] - tail)) <= ATOL
    no_reset = np.asarray(run(tree, toks, np.zeros(T, bool)))
    assert np.max(np.abs(no_reset[17:] - got[17:])) > 1e-3


def test_one_layer_chip_equals_float_layer():
    """tiny (the one-layer chip, vocab 0): a LayerParams tree through run_layer, and the same
    layer as a one-layer model tree through run_stack, against float_layer.run_layer."""
    cfg = load_config("tiny")
    p = random_params(cfg, 4)
    T = 30
    xs = random_inputs(cfg, T, seed=1, model_seed=4)
    resets = np.array([t == 11 for t in range(T)])
    ref = fl.run_layer(p, cfg, xs, resets)
    got = np.asarray(tm.run_layer(tm.to_tree(p), cfg, xs, resets))
    assert np.max(np.abs(got - ref)) <= ATOL
    stack = np.asarray(tm.run_stack(tm.to_tree(random_model_params(cfg, 4)), cfg, xs, resets))
    assert np.max(np.abs(stack - ref)) <= ATOL


def test_routing_choice_ties_lowest_index():
    """route() picks as float_layer.moe_route: ties of scores + bias to the lowest index."""
    scores = np.array([[0.5, 0.7, 0.7, 0.2], [0.9, 0.1, 0.9, 0.9], [0.3, 0.3, 0.3, 0.3]])
    bias = np.array([0.0, 0.0, 0.0, 0.0])
    gates = np.asarray(tm.route(jnp.asarray(scores), jnp.asarray(bias), 2, 2.5))
    for row, gate in zip(scores, gates):
        idx, w = fl.moe_route(row, bias, 2, 2.5)
        want = np.zeros(4)
        want[idx] = w
        assert np.array_equal(np.nonzero(gate)[0], np.sort(idx))
        assert np.allclose(gate, want, rtol=0, atol=1e-15)


def test_gradients_through_chosen_experts_and_router():
    """An expert no token chose gets no gradient, a chosen one does, the router matrix does
    (through the gating weights), the selection-only bias does not; and the gradient is the
    derivative: a central difference along a random direction agrees."""
    cfg = load_config("tiny")
    tree = tm.to_tree(random_params(cfg, 6))
    xs = jnp.asarray(random_inputs(cfg, 1, seed=2, model_seed=6))   # one token: two of four experts unchosen
    loss = jax.jit(lambda tr: jnp.sum(jnp.sin(tm.run_layer(tr, cfg, xs))))
    grads = jax.jit(jax.grad(loss))(tree)
    traces = []
    fl.run_layer(tm.layer_from_tree(tree, cfg), cfg, np.asarray(xs), traces=traces)
    chosen = {int(e) for tr in traces for e in tr["idx"]}
    assert chosen != set(range(cfg.model.n_experts)), "the case needs an expert nobody chose"
    for e in range(cfg.model.n_experts):
        g = np.abs(np.asarray(grads["moe.w_gate"][e])).max()
        assert (g > 0) == (e in chosen), (e, g)
    assert np.abs(np.asarray(grads["moe.w_router"])).max() > 0
    assert np.abs(np.asarray(grads["moe.router_bias"])).max() == 0
    rng = np.random.default_rng(0)
    direction = {k: jnp.asarray(rng.normal(size=v.shape)) for k, v in tree.items()}
    eps = 1e-6
    shift = lambda s: {k: tree[k] + s * direction[k] for k in tree}
    numeric = (loss(shift(eps)) - loss(shift(-eps))) / (2 * eps)
    analytic = sum(jnp.sum(grads[k] * direction[k]) for k in tree)
    assert abs(float(numeric) - float(analytic)) <= 1e-5 * max(1.0, abs(float(analytic)))


@pytest.mark.parametrize("name", ["model-tiny", "model-tiny-untied"])
def test_model_tree_round_trip_exact(name):
    cfg = model_config("model-tiny", tie_embedding=(name == "model-tiny"))
    mp = random_model_params(cfg, 9)
    back = tm.model_from_tree(tm.to_tree(mp), cfg)
    flat, again = mp.to_flat(), back.to_flat()
    assert sorted(flat) == sorted(again)
    assert ("lm_head" in again) == (name != "model-tiny")
    for k in flat:
        assert again[k].dtype == np.float64 and np.array_equal(again[k], flat[k]), k
    assert [lp.mixer for lp in back.layers] == list(cfg.model.mixers)
    # a float32 tree (training's) widens exactly: float64 -> float32 rounding only
    narrow = tm.model_from_tree(tm.to_tree(mp, jnp.float32), cfg).to_flat()
    for k in flat:
        assert np.array_equal(narrow[k], flat[k].astype(np.float32).astype(np.float64)), k


def test_layer_tree_round_trip_exact_and_checked():
    cfg = load_config("tiny")
    p = random_params(cfg, 2)
    back = tm.layer_from_tree(tm.to_tree(p), cfg).to_flat()
    for k, v in p.to_flat().items():
        assert np.array_equal(back[k], v), k
    tree = tm.to_tree(p)
    tree["kda.w_q"] = tree["kda.w_q"][:, :-1]
    with pytest.raises(ValueError, match="kda.w_q"):
        tm.layer_from_tree(tree, cfg)
    cfg_m = model_config("model-tiny")
    tree = tm.to_tree(random_model_params(cfg_m, 1))
    del tree["layers.3.moe.w_router"]
    with pytest.raises(ValueError, match="layers.3.moe.w_router"):
        tm.model_from_tree(tree, cfg_m)


def test_gla_baseline_is_plain_gated_linear_attention():
    """rule="gla": S = diag(exp g) S + k v^T (no delta correction, no beta), zeroed at a
    restart; the delta rule on the same inputs differs."""
    rng = np.random.default_rng(5)
    T, H, dk, dv = 9, 2, 3, 4
    q, k, g = (rng.standard_normal((T, H, dk)) for _ in range(3))
    g = -np.abs(g)
    v, beta = rng.standard_normal((T, H, dv)), rng.random((T, H))
    starts = np.zeros(T, bool)
    starts[[0, 5]] = True
    S = np.zeros((H, dk, dv))
    want = np.zeros((T, H, dv))
    for t in range(T):
        if starts[t]:
            S[:] = 0
        S = S * np.exp(g[t])[:, :, None] + k[t][:, :, None] * v[t][:, None, :]
        want[t] = np.einsum("hkv,hk->hv", S, q[t])
    got = tm.delta_rule(*(jnp.asarray(a) for a in (q, k, v, g, beta, starts)), rule="gla")
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-12)
    delta = tm.delta_rule(*(jnp.asarray(a) for a in (q, k, v, g, beta, starts)))
    assert np.abs(np.asarray(delta) - want).max() > 1e-3
    with pytest.raises(ValueError, match="allowed are delta, gla"):
        tm.delta_rule(*(jnp.asarray(a) for a in (q, k, v, g, beta, starts)), rule="linear")
