"""Model-stack configs and quickly quantised models shared by the stack's tests
(test_float_model.py, test_int_model.py, test_model_image.py)."""
from __future__ import annotations

from moekda.config import config_from_dict, load_config
from sim.models.params import random_model_params
from sim.models.quantize import calibration_tokens, quantize_model


def model_config(name: str = "model-tiny", **model):
    """A model config, with ``model`` fields changed (then named "t")."""
    if not model:
        return load_config(name)
    raw = load_config(name).to_dict()
    raw["model"].update(model)
    return config_from_dict({"name": "t", **raw})


def quick_model(cfg, seed: int):
    """(float params, integer model) quantised on short calibration sequences (fast; accuracy
    is not the point)."""
    mp = random_model_params(cfg, seed)
    return mp, quantize_model(mp, cfg, calibration_tokens(cfg, n_seq=2, n_tokens=48, model_seed=seed))
