"""Model-stack configs and quickly quantised models shared by the stack's tests
(test_float_model.py, test_int_model.py, test_model_image.py)."""
from __future__ import annotations

from moekda.config import config_from_dict, load_config
from model.params import random_model_params
from model.quantize import calibration_tokens, quantize_model


def model_config(name: str = "model-tiny", **model):
    """A model config, with ``model`` fields changed (then named "t")."""
    if not model:
        return load_config(name)
    raw = load_config(name).to_dict()
    raw["model"].update(model)
    return config_from_dict({"name": "t", **raw})


def hybrid_model_config(name: str = "model-tiny", **model):
    """``model_config`` with a Gated MLA last layer (model-tiny: layers kda, kda, kda, mla;
    kv_rank 8), no Attention Residuals or LatentMoE: a model the memory image holds."""
    model = {"layers": ["kda", "kda", "kda", "mla"], "kv_rank": 8, **model}
    return model_config(name, **model)


def quick_model(cfg, seed: int):
    """(float params, integer model) quantised on short calibration sequences (fast; accuracy
    is not the point)."""
    mp = random_model_params(cfg, seed)
    return mp, quantize_model(mp, cfg, calibration_tokens(cfg, n_seq=2, n_tokens=48, model_seed=seed))


def assert_traces_close(tf, ti, scales, bounds, fold=None, rows=None):
    """Every tensor ``name`` of the float traces ``tf`` against the integer traces ``ti`` (times
    its scale): per token (row) cosine at least ``bound_min``, on average ``bound_mean``.
    ``bounds``: (name, bound_min, bound_mean); ``fold[name]``: a factor on the float side (a
    weight the integer model folds elsewhere); ``rows``: the tokens compared (default all)."""
    import numpy as np
    fold = fold or {}
    for name, bound_min, bound_mean in bounds:
        f = (np.stack([t[name] for t in tf]) * fold.get(name, 1.0))[rows if rows is not None else slice(None)]
        i = (np.stack([t[name] for t in ti]) * scales[name])[rows if rows is not None else slice(None)]
        cos = np.sum(f * i, 1) / np.linalg.norm(f, axis=1) / np.linalg.norm(i, axis=1)
        assert cos.min() >= bound_min and cos.mean() >= bound_mean, (name, cos.min(), cos.mean())


def trace_moves(good, bad, cfg, xs, name):
    """How far a tensor ``name`` moves when layer ``bad`` replaces ``good`` on the same inputs:
    |bad - good| / |good| over the run (shows a comparison against it can fail)."""
    import numpy as np
    from model.int_layer import int_run_layer
    tg, tb = [], []
    int_run_layer(good, cfg, xs, traces=tg)
    int_run_layer(bad, cfg, xs, traces=tb)
    g = np.stack([t[name] for t in tg]).astype(float)
    b = np.stack([t[name] for t in tb]).astype(float)
    return np.linalg.norm(b - g) / np.linalg.norm(g)
