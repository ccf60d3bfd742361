"""Integer model of LatentMoE (issue 15): the routed experts on an int8 latent of width
model.moe_latent, the router and the shared experts at full width (model/int_moe.py,
quantised by model/quantize.py _quantize_latent_moe; formats in docs/numerics.md)."""
import numpy as np
import pytest

from moekda.config import config_from_dict, load_config
from model import float_layer as fl
from model.int_layer import int_run_layer, quantize_input
from model.int_model import int_run_model
from model.params import random_inputs, random_model_params, random_params, random_tokens
from model.qparams import QLayer, QModel
from model.quantize import quantize_layer, quantize_model
from model.cases import assert_traces_close, trace_moves


def latent(name="model-tiny", **model):
    base = load_config(name).to_dict()
    base["model"].update(model)
    base["name"] = f"{name}-latent"
    return config_from_dict(base)


@pytest.fixture(scope="module")
def tiny_latent():
    cfg = latent(moe_latent=8)
    mp = random_model_params(cfg, 31)
    return cfg, mp, quantize_model(mp, cfg, model_seed=31)


def test_shapes_and_flat_round_trip(tiny_latent):
    cfg, mp, qm = tiny_latent
    m, l = cfg.model, cfg.model.moe_latent
    moe_layers = [q for q, kind in zip(qm.layers, m.mixers) if kind == "moe"]
    assert moe_layers and all(q.moe.lat_down is not None for q in moe_layers)
    q = moe_layers[0].moe
    assert q.lat_down.w.shape == (l, m.d_model) and q.lat_up.w.shape == (m.d_model, l)
    assert q.routed.gate_w.shape == (m.n_experts, m.d_ff, l) and q.routed.down_w.shape == (m.n_experts, l, m.d_ff)
    assert q.shared.gate_w.shape == (m.n_shared, m.d_ff, m.d_model)        # shared experts: full width
    assert isinstance(q.lat_m, int) and isinstance(q.lat_s, int)
    back = QModel.from_flat(qm.to_flat(), m.n_layers)
    toks = random_tokens(cfg, 16, seed=5, model_seed=31)
    assert np.array_equal(int_run_model(back, cfg, toks), int_run_model(qm, cfg, toks))


def test_the_plain_moe_keeps_its_names():
    """A plain MoE layer has no latent fields, in the object or in its flat names (the memory
    image and the test vectors are built from those)."""
    cfg = load_config("tiny")
    q = quantize_layer(random_params(cfg, 3), cfg, model_seed=3)
    assert q.moe.lat_down is None and q.moe.lat_m is None
    assert not [k for k in q.to_flat() if ".lat_" in k]
    assert QLayer.from_flat(q.to_flat()).moe.lat_up is None


def test_a_batch_of_sequences_is_each_sequence_alone(tiny_latent):
    """The batched MoE path (expert by expert over the tokens that chose it) at the latent
    width gives each sequence's logits exactly."""
    cfg, _, qm = tiny_latent
    seqs = np.stack([random_tokens(cfg, 10, seed=40 + i, model_seed=31) for i in range(4)])
    batch = int_run_model(qm, cfg, seqs)
    for s, got in zip(seqs, batch):
        assert np.array_equal(got, int_run_model(qm, cfg, s))


def test_the_latent_path_follows_the_float_one():
    """One LatentMoE layer on a fresh sequence: the integer latent z, the weighted latent sum,
    the mixer's output and the layer's output, dequantised, against the float trace, on the
    tokens whose experts are the float model's (a routing flip is a different sum; the
    measured flips and cosines, plain MoE beside, are in docs/numerics.md)."""
    cfg = latent("small", moe_latent=32)
    p = random_params(cfg, 23)
    assert p.lmoe is not None
    q = quantize_layer(p, cfg, model_seed=23)
    xs = random_inputs(cfg, 64, seed=323, model_seed=23)
    tf, ti = [], []
    fl.run_layer(p, cfg, xs, traces=tf)
    int_run_layer(q, cfg, quantize_input(xs, q, cfg), traces=ti)
    same = np.array([set(map(int, a["idx"])) == set(map(int, b["idx"])) for a, b in zip(tf, ti)])
    assert same.mean() > 0.8
    assert_traces_close(tf, ti, q.scales, [("lat_z", 0.99, 0.998)])
    assert_traces_close(tf, ti, q.scales, [("lat_routed", 0.95, 0.99), ("moe_out", 0.95, 0.99), ("y", 0.99, 0.998)],
                        rows=same)


def test_a_wrong_latent_multiplier_breaks_the_match():
    """The comparison above can fail: the latent sum's requantiser off by 2x moves the output."""
    import dataclasses
    cfg = latent("small", moe_latent=32)
    p = random_params(cfg, 23)
    q = quantize_layer(p, cfg, model_seed=23)
    bad = dataclasses.replace(q, moe=dataclasses.replace(q.moe, lat_s=q.moe.lat_s - 1))
    xs = quantize_input(random_inputs(cfg, 16, seed=324, model_seed=23), q, cfg)
    assert trace_moves(q, bad, cfg, xs, "moe_out") > 0.3
