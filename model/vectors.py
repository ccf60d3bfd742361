"""Test vectors: integer parameters, inputs and expected outputs, per block and for the layer.

Layout of a vectors directory (all .npz, integer arrays unless noted):

  params.npz   the integer parameters, QLayer.to_flat() names ("kda.q_proj.w", ...),
               plus "formats.<field>" (every width of moekda.formats.Formats) and
               "meta.config" (the config as JSON text) and "meta.config_hash"
  layer.npz    x (T, d) resid_bits input, resets (T,) bool (state cleared before
               token t), y (T, d) expected output, and "trace.<name>" (T, ...) for
               every intermediate tensor of the integer model
  norm.npz     attn_x -> attn_xn and mlp_h -> mlp_hn (RMSNorm in and out)
  kda.npz      xn (T, d) input, resets, kda_out (T, d) expected, S (T, H, dk, dv)
               state after each token, and the KDA intermediates
  moe.npz      hn (T, d) input, moe_out (T, d) expected, idx (T, top_k) experts in
               selection order, w (T, top_k) their weights, and the expert tensors
               ("expert.<gate|act|up|hid|hid_shift|out>" (T, top_k + n_shared, .): the chosen
               experts in selection order, then the shared ones)

The input sequence is random residual-stream-like data with corner tokens
(all zero, full-scale positive, full-scale negative) and a state reset half way.
``load_vectors`` is the one reader (cocotb tests, a future driver).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from moekda.config import Config, config_from_dict
from moekda.formats import formats_for
from model.int_layer import int_run_layer, quantize_input
from model.params import random_inputs
from model.qparams import QLayer
from model.quantize import quantize_random_layer

KDA_TENSORS = ("a_q", "a_k", "a_v", "c_q", "c_k", "c_v", "q_s", "k_s", "v", "q", "k", "fd", "z", "alpha",
               "b_logit", "beta", "S_decayed", "kS", "u", "o_acc", "o16", "S", "on", "gd", "g_logit", "gate", "zo")
MOE_TENSORS = ("r_logit", "score", "moe_acc")
EXPERT_TENSORS = ("gate", "act", "up", "hid", "hid_shift", "out")


def vector_inputs(cfg: Config, qp: QLayer, n_tokens: int, seed: int, model_seed: int = 0):
    """Quantised inputs with corner tokens, and the reset pattern.  ``model_seed``: the
    channel profile ``qp`` was calibrated on (the seed of its random parameters)."""
    fm = formats_for(cfg)
    xs = quantize_input(random_inputs(cfg, n_tokens, seed=seed, model_seed=model_seed), qp, cfg)
    hi, lo = (1 << (fm.resid_bits - 1)) - 1, -(1 << (fm.resid_bits - 1))
    for t, value in ((1, 0), (2, hi), (3, lo)):
        if t < n_tokens:
            xs[t] = value
    resets = np.zeros(n_tokens, bool)
    if n_tokens >= 8:
        resets[n_tokens // 2] = True
    return xs, resets


def export_vectors(cfg: Config, n_tokens: int, out_dir: Path, param_seed: int = 0, seed: int = 1,
                   qp: QLayer | None = None) -> dict[str, Path]:
    """``qp`` None: the random layer of ``param_seed``, calibrated on its own channel
    profile.  A given ``qp`` (a checkpoint's) must be calibrated on profile ``param_seed``:
    the inputs are drawn with it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if qp is None:
        qp = quantize_random_layer(cfg, param_seed)
    xs, resets = vector_inputs(cfg, qp, n_tokens, seed, model_seed=param_seed)
    traces = []
    ys = int_run_layer(qp, cfg, xs, resets, traces=traces)
    stack = lambda name: np.stack([np.asarray(t[name], dtype=np.int64) for t in traces])

    params = qp.to_flat()
    params.update({f"formats.{f.name}": np.int64(getattr(formats_for(cfg), f.name))
                   for f in dataclasses.fields(formats_for(cfg))})
    params["meta.config"] = np.array(json.dumps({"name": cfg.name, **cfg.to_dict()}))
    params["meta.config_hash"] = np.array(cfg.hash())
    files = {"params": params,
             "layer": {"x": xs, "resets": resets, "y": ys,
                       **{f"trace.{k}": stack(k) for k in traces[0] if k not in ("experts",)}},
             "norm": {"attn_x": xs, "attn_xn": stack("xn_unit"), "mlp_h": stack("h"), "mlp_hn": stack("hn_unit")},
             "kda": {"xn": stack("xn_unit"), "resets": resets, "kda_out": stack("kda_out"),
                     **{k: stack(k) for k in KDA_TENSORS}},
             "moe": {"hn": stack("hn_unit"), "moe_out": stack("moe_out"), "idx": stack("idx"), "w": stack("w"),
                     **{k: stack(k) for k in MOE_TENSORS},
                     **{f"expert.{k}": np.stack([np.stack([e[k] for e in t["experts"]]) for t in traces])
                        for k in EXPERT_TENSORS}}}
    paths = {}
    for name, arrays in files.items():
        paths[name] = out_dir / f"{name}.npz"
        np.savez_compressed(paths[name], **arrays)
    return paths


def load_vectors(directory: Path) -> dict:
    """{'cfg': Config, 'qparams': QLayer, 'formats': {...}, 'layer'|'norm'|'kda'|'moe': {name: array}}."""
    directory = Path(directory)
    missing = [n for n in ("params", "layer", "norm", "kda", "moe") if not (directory / f"{n}.npz").is_file()]
    if missing:
        raise FileNotFoundError(f"{directory}: no {missing[0]}.npz (export with `moekda vectors`)")
    from model.params import read_npz
    out = {}
    params = directory / "params.npz"
    flat = read_npz(params, "vectors file")        # damaged files: ValueError naming the file
    try:
        raw = json.loads(str(flat.pop("meta.config")))
        out["cfg"] = config_from_dict(raw, source=str(params))
        out["config_hash"] = str(flat.pop("meta.config_hash"))
        out["formats"] = {k[len("formats."):]: int(flat.pop(k)) for k in list(flat) if k.startswith("formats.")}
        out["qparams"] = QLayer.from_flat(flat)
    except KeyError as e:
        raise ValueError(f"{params}: no {e.args[0] if e.args else e} (export with `moekda vectors`)") from None
    except (ValueError, TypeError, IndexError, AttributeError) as e:
        # ConfigError is a ValueError: a bad meta.config is named with its field
        raise ValueError(f"{params}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    for n in ("layer", "norm", "kda", "moe"):
        out[n] = read_npz(directory / f"{n}.npz", "vectors file")
    return out
