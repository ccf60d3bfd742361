"""The float model of the stack (model/float_model.py): embedding, L layers of
float_layer.layer_step, final RMSNorm, LM head, argmax; decode with state and reset;
the model parameter container and its files."""
import json
import struct

import numpy as np
import pytest

from moekda.config import load_config
from model import float_layer as fl
from model.float_model import (ModelState, argmax_lowest, generate, model_step, next_tokens, run_model,
                                    run_stack)
from model.params import (ModelParams, dense_chunks, load_model_params, random_inputs, random_model_params,
                               random_params, random_tokens, save_model_params)
from model.cases import model_config


def test_shapes_and_next_token():
    for name in ("model-tiny", "model-small"):
        cfg = model_config(name)
        mp = random_model_params(cfg, 0)
        assert [lp.mixer for lp in mp.layers] == list(cfg.model.mixers) == ["dense", "moe", "moe", "moe"]
        toks = random_tokens(cfg, 12, seed=1)
        assert toks.min() >= 0 and toks.max() < cfg.model.vocab
        logits = run_model(mp, cfg, toks)
        assert logits.shape == (12, cfg.model.vocab) and np.all(np.isfinite(logits))
        nxt = next_tokens(logits)
        assert np.array_equal(nxt, logits.argmax(axis=1))
        assert len(set(nxt.tolist())) > 1          # not a constant model


def test_argmax_tie_rule_lowest_index():
    assert argmax_lowest([1.0, 3.0, 3.0, 2.0]) == 1
    assert argmax_lowest([5.0, 5.0]) == 0
    assert argmax_lowest([-1.0, -2.0, -1.0]) == 0
    assert list(next_tokens(np.array([[0.0, 2.0, 2.0], [7.0, 1.0, 7.0]]))) == [1, 0]


def test_one_layer_stack_is_the_layer():
    """n_layers = 1 without a vocabulary: the stack is today's layer, seed for seed."""
    cfg = load_config("tiny")
    mp = random_model_params(cfg, 5)
    assert mp.embedding is None and mp.final_norm_w is None and mp.lm_head is None
    ref = random_params(cfg, 5)
    for k, v in ref.to_flat().items():
        assert np.array_equal(mp.layers[0].to_flat()[k], v)
    xs = random_inputs(cfg, 20, seed=2, model_seed=5)
    resets = [t == 9 for t in range(20)]
    assert np.array_equal(run_stack(mp, cfg, xs, resets), fl.run_layer(ref, cfg, xs, resets))


def test_stack_runs_layer_step_per_layer():
    """Each layer of the stack is float_layer.layer_step on the previous layer's output, with
    its own parameters and state; the head is RMSNorm + matrix."""
    cfg = model_config()
    mp = random_model_params(cfg, 2)
    toks = random_tokens(cfg, 6, seed=3, model_seed=2)
    traces = []
    logits = run_model(mp, cfg, toks, traces=traces)
    x = np.stack([mp.embedding[t] for t in toks])
    for l, lp in enumerate(mp.layers):
        x = fl.run_layer(lp, cfg, x)
        assert np.allclose(np.stack([t["layers"][l]["y"] for t in traces]), x, rtol=0, atol=1e-12)
    fn = fl.rmsnorm(x, mp.final_norm_w, cfg.model.norm_eps)
    assert np.allclose(logits, fn @ mp.embedding.T, atol=1e-12)     # model-tiny is tied


def test_tied_and_untied_head():
    tied, untied = model_config("model-tiny"), model_config("model-tiny", tie_embedding=False)
    mt, mu = random_model_params(tied, 0), random_model_params(untied, 0)
    assert mt.lm_head is None and mt.head() is mt.embedding
    assert mu.lm_head.shape == (64, 16) and not np.allclose(mu.head(), mu.embedding)
    assert "lm_head" not in mt.to_flat() and "lm_head" in mu.to_flat()
    # the same embedding and layers, only the head differs
    assert np.array_equal(mt.embedding, mu.embedding)


def test_reset_starts_a_new_sequence():
    cfg = model_config()
    mp = random_model_params(cfg, 1)
    toks = random_tokens(cfg, 16, seed=4, model_seed=1)
    k = 7
    resets = [t == k for t in range(16)]
    with_reset = run_model(mp, cfg, toks, resets)
    fresh = run_model(mp, cfg, toks[k:])
    assert np.array_equal(with_reset[k:], fresh)
    assert np.array_equal(with_reset[:k], run_model(mp, cfg, toks[:k]))
    # without the reset the state of tokens 0..k-1 changes the later logits (the state is carried)
    assert not np.allclose(run_model(mp, cfg, toks)[k:], fresh)
    with pytest.raises(ValueError, match="resets: 3 flags for 16 tokens"):
        run_model(mp, cfg, toks, [False] * 3)


def test_generate_is_greedy_decode():
    cfg = model_config()
    mp = random_model_params(cfg, 3)
    prompt = [5, 17, 2]
    out = generate(mp, cfg, prompt, 5)
    assert len(out) == 5 and out == generate(mp, cfg, prompt, 5)
    logits = run_model(mp, cfg, prompt + out)
    assert list(next_tokens(logits)[len(prompt) - 1:-1]) == out


def test_token_out_of_range():
    cfg = model_config()
    mp = random_model_params(cfg, 0)
    with pytest.raises(ValueError, match=r"token id 64: allowed range is 0 to 63"):
        model_step(mp, cfg, ModelState.zeros(cfg), 64)


def test_dense_mixer_is_the_sum_of_its_chunks():
    """The dense SwiGLU of width d_ff_dense equals the sum of d_ff-wide SwiGLUs (the shape the
    shared-expert path runs), with the chunks dense_chunks cuts."""
    cfg = model_config("model-small")
    p = random_model_params(cfg, 0).layers[0]
    assert p.mixer == "dense" and p.moe is None
    g, u, dn = dense_chunks(p.dense, cfg)
    assert g.shape == (3, 64, 64) and dn.shape == (3, 64, 64)
    hn = np.random.default_rng(0).normal(size=64)
    whole = fl.dense_step(p.dense, cfg, hn)
    parts = sum(fl.swiglu(g[c], u[c], dn[c], hn) for c in range(3))
    assert np.allclose(whole, parts, atol=1e-12)
    with pytest.raises(ValueError, match="select given for a dense layer"):
        fl.layer_step(p, cfg, fl.KDAState.zeros(cfg), hn, select=[0, 1])


def _write_safetensors(path, flat):
    header, blobs, off = {}, [], 0
    for k, v in flat.items():
        b = np.asarray(v, "<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(np.shape(v)), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_params_files_round_trip_and_errors(tmp_path):
    cfg = model_config()
    mp = random_model_params(cfg, 4)
    f = tmp_path / "m.npz"
    save_model_params(mp, f)
    back = load_model_params(f, cfg)
    assert back.to_flat().keys() == mp.to_flat().keys()
    assert all(np.array_equal(back.to_flat()[k], v) for k, v in mp.to_flat().items())
    st = tmp_path / "m.safetensors"
    _write_safetensors(st, mp.to_flat())
    back = load_model_params(st, cfg)
    assert np.allclose(back.layers[2].moe.w_router, mp.layers[2].moe.w_router, rtol=1e-6)

    def bad(flat, needle, config=cfg):
        p = tmp_path / "bad.npz"
        np.savez(p, **flat)
        with pytest.raises(ValueError) as e:
            load_model_params(p, config)
        assert needle in str(e.value) and "\n" not in str(e.value) and str(p) in str(e.value)

    flat = mp.to_flat()
    bad({k: v for k, v in flat.items() if k != "layers.3.kda.w_q"}, "missing layers.3.kda.w_q")
    bad({k: v for k, v in flat.items() if k != "embedding"}, "missing embedding")
    bad(flat | {"layers.1.kda.w_q": np.zeros((3, 3))}, "parameter layers.1.kda.w_q: shape (3, 3)")
    bad(flat | {"lm_head": np.zeros((64, 16))}, "lm_head given, but config model-tiny has none (the LM head is tied")
    bad(flat | {"layers.4.attn_norm_w": np.zeros(16)}, "layers.4 but config")
    # layer 0 is dense in the config: a MoE layer there is refused by kind
    moe0 = {k: v for k, v in flat.items() if not k.startswith("layers.0.")}
    moe0 |= {f"layers.0.{k}": v for k, v in random_params(cfg, 0).to_flat().items()}
    bad(moe0, "layer 0 has a moe mixer, config model-tiny says dense")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable .npz parameter file"):
        load_model_params(tmp_path / "junk.npz", cfg)
    with pytest.raises(ValueError, match="no such file"):
        load_model_params(tmp_path / "none.npz", cfg)


def test_model_params_from_flat_of_a_layer_stack():
    cfg = model_config("tiny", n_layers=2)
    mp = random_model_params(cfg, 0)
    assert set(mp.to_flat()) == {f"layers.{l}.{k}" for l in range(2) for k in random_params(cfg, 0).to_flat()}
    back = ModelParams.from_flat(mp.to_flat(), cfg)
    assert back.embedding is None and len(back.layers) == 2


def test_random_tokens_text_like():
    cfg = model_config("model-small")
    t = random_tokens(cfg, 4096, seed=1)
    counts = np.sort(np.bincount(t, minlength=256))[::-1]
    assert counts[0] > 10 * np.median(counts)            # Zipf: a few frequent ids
    assert np.array_equal(t, random_tokens(cfg, 4096, seed=1))
    assert not np.array_equal(t[:64], random_tokens(cfg, 64, seed=2))
    with pytest.raises(ValueError, match="vocab = 0"):
        random_tokens(load_config("tiny"), 4)
