"""Test cases of the MoE unit: config, quantised parameters, tokens and the
integer model's answers, written to one .npz the cocotb bench reads.

Built by sim/tests/block/test_moe.py (pytest side), read by sim/cocotb/tb_moe.py
(simulator side); the expected outputs come from model.int_moe only.  The
model reaches the RTL as the weight image and the value of the ``params`` port
(``moe_params``): the RTL itself is the config's.

Tokens (the MoE input hn, int8): first the corner tokens (all zero -> equal
router scores; all +127 / all -128 / alternating -> saturated engine
outputs), then tokens taken from the integer layer model running on
residual-stream-like inputs (the distribution the router really sees), then
uniform random int8 vectors.

A model's case (``build_model_case``, issue 14): tokens of every layer of the
stack in a mixed order, each with its layer index; the weight memory is the
model's image (every layer's matrices at their addresses), the ports carry the
token's layer's values (``params`` of a MoE layer, ``dense_params`` of a dense
one), and the expected output is int_moe_step or int_dense_step of that layer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hw.image.memory_map import build_image, memory_map, qlayer_tensors
from hw.image.param_map import param_layout, region_value
from moekda.config import Config, config_from_dict, load_config
from moekda.formats import formats_for
from model.image import qmodel_image
from model.int_layer import int_run_layer, quantize_input
from model.int_model import int_run_model
from model.int_moe import int_dense_step, int_moe_step
from model.params import random_inputs, random_params
from model.quantize import quantize_layer


@dataclass
class MoECase:
    cfg: Config
    qlayer: object
    tokens: np.ndarray      # (T, d) int8
    expected: np.ndarray    # (T, d) int8
    idx: np.ndarray         # (T, k) chosen experts, rank order
    choice: np.ndarray      # (T, E) router choice values (score + bias)
    score: np.ndarray       # (T, E)
    saturated: np.ndarray   # (T,) engine outputs of this token hit the int8 rails
    image: bytes
    # a model's case: the layer of each token, and per layer the value of each parameter
    # port (None where the layer has no such mixer); None on the layer chip
    layers: np.ndarray | None = None
    layer_ports: list | None = None


def make_config(base: str = "tiny", **model) -> Config:
    raw = load_config(base).to_dict()
    raw.pop("pnr", None)
    raw["name"] = f"{base}_" + "_".join(f"{k}{v}" for k, v in sorted(model.items())) if model else base
    raw["model"].update(model)
    return config_from_dict(raw)


def layer_hn(qlayer, cfg: Config, n: int, seed: int) -> np.ndarray:
    """hn (the MoE input) of n tokens of the integer layer on realistic inputs."""
    if n <= 0:
        return np.zeros((0, cfg.model.d_model), dtype=np.int64)
    xs = quantize_input(random_inputs(cfg, n, seed=seed), qlayer, cfg)
    traces: list = []
    int_run_layer(qlayer, cfg, xs, traces=traces)
    return np.array([t["hn_unit"] for t in traces], dtype=np.int64)


def build_case(cfg: Config, n_tokens: int, seed: int = 0, zero_bias: bool = False,
               paired_bias: bool = False) -> MoECase:
    """``zero_bias``: all choices equal their scores (the all-zero token ties all E);
    ``paired_bias``: experts 2i and 2i+1 share a bias, so equal scores of a pair
    (saturated router codes) tie in the choice while the bias still reorders experts."""
    fm = formats_for(cfg)
    params = random_params(cfg, seed=seed)
    q = quantize_layer(params, cfg)
    if zero_bias:   # every choice equals its score: an all-zero token ties all E experts
        q.moe.bias = np.zeros_like(q.moe.bias)
    if paired_bias:
        q.moe.bias = q.moe.bias.copy()
        q.moe.bias[1::2] = q.moe.bias[0:len(q.moe.bias) - 1:2]
    d = cfg.model.d_model
    rng = np.random.default_rng(seed + 7)
    corners = [np.zeros(d), np.full(d, 127), np.full(d, -128), np.where(np.arange(d) % 2, 127, -128)]
    n_layer = max(0, (n_tokens - len(corners)) * 3 // 4)
    n_rand = max(0, n_tokens - len(corners) - n_layer)
    tokens = np.concatenate([np.array(corners, dtype=np.int64), layer_hn(q, cfg, n_layer, seed + 1),
                             rng.integers(-128, 128, size=(n_rand, d))])[:n_tokens].astype(np.int64)
    exp, idx, choice, score, sat = [], [], [], [], []
    for hn in tokens:
        t: dict = {}
        out, (i, _w) = int_moe_step(q.moe, cfg, fm, hn, trace=t)
        exp.append(out)
        idx.append(i)
        score.append(t["score"])
        choice.append(t["score"] + q.moe.bias)
        sat.append(_saturated(t, fm))
    image = build_image(cfg, qlayer_tensors(q), memory_map(cfg))
    return MoECase(cfg, q, tokens, np.array(exp), np.array(idx), np.array(choice), np.array(score),
                   np.array(sat), image)


def _saturated(t: dict, fm) -> bool:
    lo, hi = -(1 << (fm.act_bits - 1)), (1 << (fm.act_bits - 1)) - 1
    vals = np.concatenate([np.concatenate([e["gate"], e["up"], e["hid"], e["out"]]) for e in t["experts"]])
    return bool(np.any((vals == lo) | (vals == hi)))


def build_model_case(cfg: Config, qm, per_layer: int, seed: int = 0, zero_bias: bool = False,
                     paired_bias: bool = False) -> MoECase:
    """``per_layer`` tokens of each layer of the quantised model ``qm`` (model.qparams.QModel),
    in a shuffled order: per layer the all-zero and the alternating corner, hn of the integer
    model's own forward pass (the layer's real input distribution), one uniform random vector.
    ``idx`` is -1 and ``choice``/``score`` 0 for a dense layer's tokens (no router).
    ``zero_bias`` / ``paired_bias`` as for build_case, applied to every MoE layer of ``qm``
    (changed in place, before the expected values and the image are made)."""
    fm, m = formats_for(cfg), cfg.model
    for q in qm.layers:
        if q.moe is not None and zero_bias:
            q.moe.bias = np.zeros_like(q.moe.bias)
        elif q.moe is not None and paired_bias:
            q.moe.bias = q.moe.bias.copy()
            q.moe.bias[1::2] = q.moe.bias[0:len(q.moe.bias) - 1:2]
    d, L, rng = m.d_model, m.n_layers, np.random.default_rng(seed + 7)
    traces: list = []
    int_run_model(qm, cfg, rng.integers(0, m.vocab, size=max(0, per_layer - 3)), traces=traces)
    corners = [np.zeros(d), np.where(np.arange(d) % 2, 127, -128)]
    hn = {l: np.concatenate([np.array(corners, dtype=np.int64),
                             np.array([t["layers"][l]["hn_unit"] for t in traces], dtype=np.int64).reshape(-1, d),
                             rng.integers(-128, 128, size=(1, d))])[:per_layer] for l in range(L)}
    order = [(l, i) for l in range(L) for i in range(per_layer)]
    order = [order[j] for j in rng.permutation(len(order))]
    tokens, layers, exp, idx, choice, score, sat = [], [], [], [], [], [], []
    for l, i in order:
        q, x = qm.layers[l], hn[l][i]
        t: dict = {}
        if q.mixer == "dense":
            out = int_dense_step(q.dense, cfg, fm, x, trace=t)
            idx.append(np.full(m.top_k, -1))
            score.append(np.zeros(m.n_experts, dtype=np.int64))
            choice.append(np.zeros(m.n_experts, dtype=np.int64))
        else:
            out, (sel, _w) = int_moe_step(q.moe, cfg, fm, x, trace=t)
            idx.append(sel)
            score.append(t["score"])
            choice.append(t["score"] + q.moe.bias)
        tokens.append(x)
        layers.append(l)
        exp.append(out)
        sat.append(_saturated(t, fm))
    ports = []
    for q in qm.layers:
        flat = q.to_flat()
        ports.append({"params": region_value(cfg, flat, "moe") if q.mixer == "moe" else None,
                      "dense_params": region_value(cfg, flat, "dense", mixer="dense") if q.mixer == "dense"
                      else None})
    return MoECase(cfg, qm, np.array(tokens, dtype=np.int64), np.array(exp), np.array(idx), np.array(choice),
                   np.array(score), np.array(sat), qmodel_image(cfg, qm), np.array(layers), ports)


def moe_params(case: MoECase) -> int:
    """The value of the unit's ``params`` port for the case's model (hw/image/param_map.py)."""
    return region_value(case.cfg, case.qlayer.to_flat(), "moe")


def save_case(case: MoECase, path: Path, *, req_stall: float, resp_stall: float, in_stall: float,
              out_stall: float, reset_after: int, seed: int, bytes_per_token: int, out_bits: int) -> None:
    """The bench's whole input: vectors, image and knobs (stall probabilities, a
    reset after ``reset_after`` tokens of a first pass (0: none))."""
    cfg = case.cfg
    meta = {"d": cfg.model.d_model, "E": cfg.model.n_experts, "port_bytes": cfg.hw.weight_port_bytes,
            "latency": cfg.hw.weight_port_latency, "req_stall": req_stall, "resp_stall": resp_stall,
            "in_stall": in_stall, "out_stall": out_stall, "reset_after": reset_after, "seed": seed,
            "bytes_per_token": bytes_per_token, "out_bits": out_bits,
            # the MoE's slice of the parameter bank for this model, as hex (wider than json ints)
            "params": None if case.layers is not None else format(moe_params(case), "x")}
    if case.layers is not None:
        # a model: each token's layer, and per layer each port's value (hex) or None (the
        # bench drives random bits there: the unit must not read it), and the ports' widths
        meta.update({
            "layers": [int(l) for l in case.layers], "n_layers": cfg.model.n_layers,
            "layer_ports": [{k: (None if v is None else format(v, "x")) for k, v in p.items()}
                            for p in case.layer_ports],
            "port_bits": {"params": param_layout(cfg, "moe").size,
                          "dense_params": param_layout(cfg, "dense", mixer="dense").size}})
    np.savez(path, tokens=case.tokens, expected=case.expected, idx=case.idx,
             image=np.frombuffer(case.image, dtype=np.uint8), meta=json.dumps(meta))
