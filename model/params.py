"""Float parameters of one KDA + MoE layer: container, realistic random init, .npz/.safetensors I/O.

Shapes follow the reference math (docs/numerics.md, kimi-layer-math): a matrix
``W`` maps a column vector, ``y = W @ x``, so ``W`` has shape (out, in).
The random init aims at the statistics of a trained layer rather than of a
fresh one, because the integer formats are calibrated on it:

* projections ~ N(0, 1/fan_in), so activations keep unit-ish RMS;
* norm weights ~ 1 + N(0, 0.1) with a few larger channels (trained RMSNorm
  weights are far from flat, and the folded int8 weights must cope);
* A_log = log U(1, 16) per head (as flash-linear-attention), dt_bias chosen so
  that A * dt_bias ~ U(-10, -1): decays from ~0.08 (short memory) to ~0.9999
  (long memory), the spread a trained KDA shows;
* router bias ~ N(0, 0.05) (DeepSeek-V3's aux-free bias is small).

A model (``ModelParams``, issue 14) is a stack of such layers, each with its own
parameters and channel mixer (MoE, or one dense SwiGLU: ``DenseParams``), plus an
embedding table, a final RMSNorm and an LM head (its own matrix, or the embedding
table when ``model.tie_embedding``).
"""
from __future__ import annotations

import json
import struct
from dataclasses import MISSING, dataclass, fields
from typing import Optional
from pathlib import Path

import numpy as np

from moekda.config import Config


@dataclass
class KDAParams:
    w_q: np.ndarray        # (H*dk, d)
    w_k: np.ndarray        # (H*dk, d)
    w_v: np.ndarray        # (H*dv, d)
    conv_q: np.ndarray     # (H*dk, K): tap j weights the input of token t-(K-1)+j
    conv_k: np.ndarray     # (H*dk, K)
    conv_v: np.ndarray     # (H*dv, K)
    w_f_down: np.ndarray   # (r, d)   low-rank decay projection
    w_f_up: np.ndarray     # (H*dk, r)
    a_log: np.ndarray      # (H,)
    dt_bias: np.ndarray    # (H*dk,)
    w_b: np.ndarray        # (H, d)   beta projection
    o_norm_w: np.ndarray   # (dv,)    shared by all heads (as fla's FusedRMSNormGated)
    w_g_down: np.ndarray   # (r, d)   low-rank output gate
    w_g_up: np.ndarray     # (H*dv, r)
    w_o: np.ndarray        # (d, H*dv)


@dataclass
class MoEParams:
    w_router: np.ndarray     # (E, d)
    router_bias: np.ndarray  # (E,) selection-only bias
    w_gate: np.ndarray       # (E, d_ff, d)
    w_up: np.ndarray         # (E, d_ff, d)
    w_down: np.ndarray       # (E, d, d_ff)
    sh_gate: np.ndarray      # (n_shared, d_ff, d)
    sh_up: np.ndarray        # (n_shared, d_ff, d)
    sh_down: np.ndarray      # (n_shared, d, d_ff)


@dataclass
class DenseParams:
    """A dense channel mixer: one SwiGLU of width F = model.d_ff_dense (a multiple of d_ff).
    ``dense_chunks`` cuts it into F / d_ff SwiGLUs of width d_ff whose outputs sum to it
    exactly: the shape the MoE unit's shared-expert path runs."""
    w_gate: np.ndarray       # (F, d)
    w_up: np.ndarray         # (F, d)
    w_down: np.ndarray       # (d, F)


def dense_chunks(p: DenseParams, cfg: Config):
    """(gate (C, d_ff, d), up (C, d_ff, d), down (C, d, d_ff)): chunk c is hidden units
    c*d_ff .. (c+1)*d_ff - 1 (rows of gate/up, columns of down), C = cfg.model.dense_chunks."""
    m = cfg.model
    C, f, d = m.dense_chunks, m.d_ff, m.d_model
    return (p.w_gate.reshape(C, f, d), p.w_up.reshape(C, f, d),
            p.w_down.reshape(d, C, f).transpose(1, 0, 2))


@dataclass
class MLAParams:
    """A Gated MLA token mixer (issue 15; model/float_mla.py): n_heads heads of head_dim,
    a latent of kv_rank values per token."""
    w_q: np.ndarray        # (H*dh, d)
    w_dkv: np.ndarray      # (r, d)       down-projection to the latent
    kv_norm_w: np.ndarray  # (r,)         the latent's RMSNorm weight
    w_uk: np.ndarray       # (H, dh, r)   key up-projection per head
    w_uv: np.ndarray       # (H, dh, r)   value up-projection per head
    w_g: np.ndarray        # (H*dh, d)    output gate
    w_o: np.ndarray        # (d, H*dh)

    @property
    def heads(self) -> int:
        return self.w_uk.shape[0]

    @property
    def head_dim(self) -> int:
        return self.w_uk.shape[1]

    @property
    def kv_rank(self) -> int:
        return self.w_dkv.shape[0]


@dataclass
class LatentMoEParams:
    """LatentMoE (issue 15; model/float_latent_moe.py): routed experts at width l."""
    w_router: np.ndarray     # (E, d)
    router_bias: np.ndarray  # (E,)   selection only
    w_lat_down: np.ndarray   # (l, d)
    w_lat_up: np.ndarray     # (d, l)
    w_gate: np.ndarray       # (E, d_ff, l)
    w_up: np.ndarray         # (E, d_ff, l)
    w_down: np.ndarray       # (E, l, d_ff)
    sh_gate: np.ndarray      # (n_shared, d_ff, d)
    sh_up: np.ndarray        # (n_shared, d_ff, d)
    sh_down: np.ndarray      # (n_shared, d, d_ff)
    # K3's exit norm (model.latent_exit_norm, issue 47 difference 4): the weight of the RMSNorm
    # on the routed latent sum, before w_lat_up; None (and no flat name) without it
    exit_norm_w: Optional[np.ndarray] = None   # (l,)


# flat-name prefix of each part a layer can have, and its container
PARTS = {"kda": KDAParams, "mla": MLAParams, "moe": MoEParams, "lmoe": LatentMoEParams, "dense": DenseParams}


@dataclass
class LayerParams:
    """One layer: a token mixer, ``kda`` or (issue 15) ``mla``, and a channel mixer, ``moe``,
    ``dense`` or (LatentMoE) ``lmoe``; the parts a layer lacks are None, and its flat names
    say which it has (``kda.*``, ``mla.*``, ``moe.*``, ``dense.*``, ``lmoe.*``)."""
    attn_norm_w: np.ndarray  # (d,)
    kda: Optional[KDAParams]
    mlp_norm_w: np.ndarray   # (d,)
    moe: Optional[MoEParams]
    dense: Optional[DenseParams] = None
    mla: Optional[MLAParams] = None
    lmoe: Optional[LatentMoEParams] = None

    @property
    def mixer(self) -> str:
        return "dense" if self.dense is not None else "moe"

    @property
    def kind(self) -> str:
        """The token mixer: "kda" or "mla"."""
        return "mla" if self.mla is not None else "kda"

    # -- flat name <-> array view, the one serialisation of the parameters --
    def to_flat(self) -> dict[str, np.ndarray]:
        flat = {"attn_norm_w": self.attn_norm_w, "mlp_norm_w": self.mlp_norm_w}
        for prefix in PARTS:
            part = getattr(self, prefix)
            if part is None:
                continue
            for f in fields(part):
                if getattr(part, f.name) is not None:     # an optional part's field it lacks
                    flat[f"{prefix}.{f.name}"] = getattr(part, f.name)
        return flat

    @classmethod
    def from_flat(cls, flat: dict[str, np.ndarray], prefix: str = "") -> "LayerParams":
        """From flat names (``prefix`` before each, e.g. ``layers.2.`` in a model file).
        A dense layer is one with ``dense.*`` names, an MLA layer one with ``mla.*``, a
        LatentMoE one with ``lmoe.*``."""
        def part(name, kind):
            # a field with a default (None) is optional: LatentMoE's exit norm weight
            missing = [f.name for f in fields(kind) if f"{prefix}{name}.{f.name}" not in flat and f.default is MISSING]
            if missing:
                raise ValueError(f"parameters: missing {prefix}{name}.{missing[0]}")
            return kind(**{f.name: np.asarray(flat[f"{prefix}{name}.{f.name}"], dtype=np.float64)
                           for f in fields(kind) if f"{prefix}{name}.{f.name}" in flat})
        for name in ("attn_norm_w", "mlp_norm_w"):
            if prefix + name not in flat:
                raise ValueError(f"parameters: missing {prefix}{name}")
        has = {name: any(k.startswith(f"{prefix}{name}.") for k in flat) for name in PARTS}
        token = "mla" if has["mla"] else "kda"
        channel = "dense" if has["dense"] else "lmoe" if has["lmoe"] else "moe"
        parts = {name: part(name, PARTS[name]) if name in (token, channel) else None for name in PARTS}
        return cls(attn_norm_w=np.asarray(flat[prefix + "attn_norm_w"], np.float64),
                   mlp_norm_w=np.asarray(flat[prefix + "mlp_norm_w"], np.float64), **parts)


def expected_shapes(cfg: Config, mixer: str = "moe", kind: str = "kda") -> dict[str, tuple[int, ...]]:
    """Flat name -> shape of one layer whose token mixer is ``kind`` ("kda" or "mla") and
    channel mixer ``mixer`` ("moe", LatentMoE when model.moe_latent > 0, or "dense")."""
    m = cfg.model
    d, H, dk, r, K = m.d_model, m.n_heads, m.head_dim, m.gate_rank, m.conv_kernel
    hk = hv = H * dk
    E, f, S = m.n_experts, m.d_ff, m.n_shared
    shapes = {"attn_norm_w": (d,), "mlp_norm_w": (d,)}
    if kind == "mla":
        R = m.kv_rank
        shapes |= {"mla.w_q": (hk, d), "mla.w_dkv": (R, d), "mla.kv_norm_w": (R,), "mla.w_uk": (H, dk, R),
                   "mla.w_uv": (H, dk, R), "mla.w_g": (hk, d), "mla.w_o": (d, hk)}
    else:
        shapes |= {
            "kda.w_q": (hk, d), "kda.w_k": (hk, d), "kda.w_v": (hv, d),
            "kda.conv_q": (hk, K), "kda.conv_k": (hk, K), "kda.conv_v": (hv, K),
            "kda.w_f_down": (r, d), "kda.w_f_up": (hk, r), "kda.a_log": (H,), "kda.dt_bias": (hk,),
            "kda.w_b": (H, d), "kda.o_norm_w": (dk,), "kda.w_g_down": (r, d), "kda.w_g_up": (hv, r),
            "kda.w_o": (d, hv),
        }
    if mixer == "moe" and m.moe_latent:
        L = m.moe_latent
        if m.latent_exit_norm:
            shapes["lmoe.exit_norm_w"] = (L,)
        return shapes | {
            "lmoe.w_router": (E, d), "lmoe.router_bias": (E,), "lmoe.w_lat_down": (L, d), "lmoe.w_lat_up": (d, L),
            "lmoe.w_gate": (E, f, L), "lmoe.w_up": (E, f, L), "lmoe.w_down": (E, L, f),
            "lmoe.sh_gate": (S, f, d), "lmoe.sh_up": (S, f, d), "lmoe.sh_down": (S, d, f),
        }
    if mixer == "dense":
        F = m.d_ff_dense
        return shapes | {"dense.w_gate": (F, d), "dense.w_up": (F, d), "dense.w_down": (d, F)}
    return shapes | {
        "moe.w_router": (E, d), "moe.router_bias": (E,),
        "moe.w_gate": (E, f, d), "moe.w_up": (E, f, d), "moe.w_down": (E, d, f),
        "moe.sh_gate": (S, f, d), "moe.sh_up": (S, f, d), "moe.sh_down": (S, d, f),
    }


def check_shapes(params: LayerParams, cfg: Config, what: str = "parameter ") -> None:
    flat = params.to_flat()
    for name, shape in expected_shapes(cfg, params.mixer, params.kind).items():
        if name not in flat:
            raise ValueError(f"{what}{name}: missing (config {cfg.name} needs it, shape {shape})")
        if tuple(flat[name].shape) != shape:
            raise ValueError(f"{what}{name}: shape {tuple(flat[name].shape)}, config {cfg.name} needs {shape}")


def random_params(cfg: Config, seed=0, mixer: str = "moe", kind: str = "kda") -> LayerParams:
    """Seedable parameters with trained-layer-like scales (see module doc).  ``seed``: an int
    or a sequence of ints (numpy's seed sequences).  ``mixer="dense"`` draws the same KDA
    part and a dense SwiGLU (``DenseParams``) in place of the MoE; ``kind="mla"`` a Gated
    MLA token mixer in place of KDA; model.moe_latent > 0 a LatentMoE in place of the MoE."""
    rng = np.random.default_rng(seed)
    m = cfg.model
    d, H, dk, r = m.d_model, m.n_heads, m.head_dim, m.gate_rank
    shapes = expected_shapes(cfg, mixer, kind)

    def dense(name, gain=1.0):
        shape = shapes[name]
        return rng.normal(0.0, gain / np.sqrt(shape[-1]), size=shape)

    def norm_w(n):
        w = 1.0 + rng.normal(0.0, 0.1, size=n)
        big = rng.choice(n, size=max(1, n // 16), replace=False)
        w[big] *= rng.uniform(2.0, 4.0, size=big.size)   # a few outlier channels
        return w

    if kind == "mla":
        return _random_mla(cfg, rng, mixer, dense, norm_w)
    conv_shape = shapes["kda.conv_q"]

    def conv():
        # most weight on the current token, decaying into the past (a smoothing conv)
        taps = np.exp(-np.arange(conv_shape[1])[::-1] * 0.7)
        return rng.normal(1.0, 0.3, size=conv_shape) * taps * 0.8

    a = rng.uniform(1.0, 16.0, size=H)
    kda = KDAParams(
        w_q=dense("kda.w_q"), w_k=dense("kda.w_k"), w_v=dense("kda.w_v", 1.5),
        conv_q=conv(), conv_k=conv(), conv_v=conv(),
        w_f_down=dense("kda.w_f_down"), w_f_up=dense("kda.w_f_up", 0.3),
        a_log=np.log(a), dt_bias=rng.uniform(-10.0, -1.0, size=H * dk) / np.repeat(a, dk),
        w_b=dense("kda.w_b", 2.0), o_norm_w=norm_w(dk),
        w_g_down=dense("kda.w_g_down"), w_g_up=dense("kda.w_g_up", 2.0),
        w_o=dense("kda.w_o", 0.5),
    )
    return _with_channel_mixer(cfg, rng, mixer, dense, norm_w, kda=kda)


def _with_channel_mixer(cfg: Config, rng, mixer: str, dense, norm_w, **token_mixer) -> LayerParams:
    """The layer of the given token mixer with a random channel mixer (drawn first) and its
    two norm weights."""
    m, d = cfg.model, cfg.model.d_model
    if mixer == "dense":
        # the down projection's gain: a MoE layer's output is ~ (routed_scaling + n_shared)
        # SwiGLUs of width d_ff at gain 0.5; the dense one sums d_ff_dense / d_ff chunks
        ch = {"moe": None, "dense": DenseParams(w_gate=dense("dense.w_gate"), w_up=dense("dense.w_up"),
                                                w_down=dense("dense.w_down", 0.5))}
    elif m.moe_latent:   # LatentMoE at the MoE's scales; the latent projections keep the RMS
        ch = {"moe": None, "lmoe": LatentMoEParams(
            w_router=dense("lmoe.w_router", 2.0), router_bias=rng.normal(0.0, 0.05, size=m.n_experts),
            w_lat_down=dense("lmoe.w_lat_down"), w_lat_up=dense("lmoe.w_lat_up"),
            w_gate=dense("lmoe.w_gate"), w_up=dense("lmoe.w_up"), w_down=dense("lmoe.w_down", 0.5),
            sh_gate=dense("lmoe.sh_gate"), sh_up=dense("lmoe.sh_up"), sh_down=dense("lmoe.sh_down", 0.5))}
    else:
        ch = {"moe": MoEParams(
            w_router=dense("moe.w_router", 2.0), router_bias=rng.normal(0.0, 0.05, size=m.n_experts),
            w_gate=dense("moe.w_gate"), w_up=dense("moe.w_up"), w_down=dense("moe.w_down", 0.5),
            sh_gate=dense("moe.sh_gate"), sh_up=dense("moe.sh_up"), sh_down=dense("moe.sh_down", 0.5))}
    token_mixer.setdefault("kda", None)
    p = LayerParams(attn_norm_w=norm_w(d), mlp_norm_w=norm_w(d), **token_mixer, **ch)
    if mixer != "dense" and m.moe_latent and m.latent_exit_norm:
        # drawn last, so a model without the exit norm keeps every other parameter of its seed
        p.lmoe.exit_norm_w = norm_w(m.moe_latent)
    check_shapes(p, cfg)
    return p


def _random_mla(cfg: Config, rng, mixer: str, dense, norm_w) -> LayerParams:
    """An MLA layer: 1/sqrt(fan-in) projections (the output's at gain 0.5, as KDA's w_o), the
    latent's norm weight like the other norm weights; its channel mixer as a KDA layer's."""
    mla = MLAParams(w_q=dense("mla.w_q"), w_dkv=dense("mla.w_dkv"), kv_norm_w=norm_w(cfg.model.kv_rank),
                    w_uk=dense("mla.w_uk"), w_uv=dense("mla.w_uv", 1.5), w_g=dense("mla.w_g", 2.0),
                    w_o=dense("mla.w_o", 0.5))
    return _with_channel_mixer(cfg, rng, mixer, dense, norm_w, mla=mla)


# ---- the model stack (issue 14) ---------------------------------------------------------

@dataclass
class ModelParams:
    """A whole model: ``layers[l]`` (one LayerParams per layer, channel mixer as
    ``cfg.model.mixers[l]``), and, when ``cfg.model.vocab > 0``, the embedding table
    (V, d), the final RMSNorm weight (d,) and the LM head (V, d); ``lm_head`` is None
    when tied (the LM head is then ``embedding``).  With vocab = 0 the three are None
    (a stack of layers, residual streams in and out).

    Flat names: ``embedding``, ``final_norm_w``, ``lm_head``, and ``layers.<l>.<name>``
    with the layer's own flat names (``layers.0.kda.w_q``, ``layers.1.moe.w_router``)."""
    layers: list
    embedding: Optional[np.ndarray] = None     # (V, d)
    final_norm_w: Optional[np.ndarray] = None  # (d,)
    lm_head: Optional[np.ndarray] = None       # (V, d); None: tied to the embedding
    # Attention Residuals (issue 15, model.attn_res != "none"): one pseudo-query per sub-layer
    # (layer l's token mixer 2l, its channel mixer 2l + 1) and one for the stack's output
    res_queries: Optional[np.ndarray] = None   # (2 L + 1, d)

    def head(self) -> np.ndarray:
        """The LM head matrix (V, d) the logits are computed with."""
        return self.embedding if self.lm_head is None else self.lm_head

    def to_flat(self) -> dict[str, np.ndarray]:
        flat = {}
        for name in ("embedding", "final_norm_w", "lm_head"):
            if getattr(self, name) is not None:
                flat[name] = getattr(self, name)
        if self.res_queries is not None:
            flat[RES_QUERIES] = self.res_queries
        for l, lp in enumerate(self.layers):
            flat.update({f"layers.{l}.{k}": v for k, v in lp.to_flat().items()})
        return flat

    @classmethod
    def from_flat(cls, flat: dict[str, np.ndarray], cfg: Config) -> "ModelParams":
        m = cfg.model
        layers = [LayerParams.from_flat(flat, f"layers.{l}.") for l in range(m.n_layers)]
        extra = sorted({k.split(".")[1] for k in flat if k.startswith("layers.")} - {str(l) for l in range(m.n_layers)})
        if extra:
            raise ValueError(f"parameters: layers.{extra[0]} but config {cfg.name} has {m.n_layers} layers")
        top = {}
        for name in ("embedding", "final_norm_w", "lm_head"):
            needed = m.vocab > 0 and not (name == "lm_head" and m.tie_embedding)
            if needed and name not in flat:
                raise ValueError(f"parameters: missing {name}")
            if not needed and name in flat:
                why = "the LM head is tied to the embedding" if name == "lm_head" and m.vocab else "vocab = 0"
                raise ValueError(f"parameters: {name} given, but config {cfg.name} has none ({why})")
            top[name] = np.asarray(flat[name], np.float64) if needed else None
        if (m.attn_res != "none") != (RES_QUERIES in flat):
            raise ValueError(f"parameters: {RES_QUERIES} " + ("missing" if m.attn_res != "none" else
                             f"given, but config {cfg.name} has model.attn_res = \"none\""))
        top["res_queries"] = np.asarray(flat[RES_QUERIES], np.float64) if RES_QUERIES in flat else None
        return cls(layers=layers, **top)


RES_QUERIES = "attn_res.queries"


def model_expected_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    m = cfg.model
    out = {}
    if m.vocab:
        out["embedding"] = (m.vocab, m.d_model)
        out["final_norm_w"] = (m.d_model,)
        if not m.tie_embedding:
            out["lm_head"] = (m.vocab, m.d_model)
    if m.attn_res != "none":
        out[RES_QUERIES] = (2 * m.n_layers + 1, m.d_model)
    for l, (mixer, kind) in enumerate(zip(m.mixers, m.layers)):
        out.update({f"layers.{l}.{k}": v for k, v in expected_shapes(cfg, mixer, kind).items()})
    return out


def check_model_shapes(mp: ModelParams, cfg: Config) -> None:
    """ValueError (one line, naming the tensor) unless ``mp`` fits ``cfg``: layer count, each
    layer's mixer kind, every shape."""
    m = cfg.model
    if len(mp.layers) != m.n_layers:
        raise ValueError(f"parameters: {len(mp.layers)} layers, config {cfg.name} has {m.n_layers}")
    for l, (lp, mixer, kind) in enumerate(zip(mp.layers, m.mixers, m.layers)):
        if lp.mixer != mixer:
            raise ValueError(f"parameters: layer {l} has a {lp.mixer} mixer, config {cfg.name} says {mixer}")
        if lp.kind != kind:
            raise ValueError(f"parameters: layer {l} is a {lp.kind} layer, config {cfg.name} says {kind}")
    flat = mp.to_flat()
    for name, shape in model_expected_shapes(cfg).items():
        if name not in flat:
            raise ValueError(f"parameters: missing {name}")
        if tuple(flat[name].shape) != shape:
            raise ValueError(f"parameter {name}: shape {tuple(flat[name].shape)}, config {cfg.name} needs {shape}")


def layer_seed(seed: int, layer: int):
    """The seed of layer ``layer`` of model ``seed``: layer 0 is ``seed`` itself (a one-layer
    model of seed s is the layer random_params(cfg, s)), layer l > 0 the sequence [s, l]."""
    return seed if layer == 0 else [seed, layer]


def channel_profile(cfg: Config, model_seed: int = 0) -> np.ndarray:
    """Per-channel scales (d,) of the residual stream of model ``model_seed``: log-normal, a
    few 4x outlier channels (random_inputs and the embedding share it)."""
    d = cfg.model.d_model
    crng = np.random.default_rng([model_seed, 7])
    chan = np.exp(crng.normal(0.0, 0.4, size=d))
    chan[crng.choice(d, size=max(1, d // 32), replace=False)] *= 4.0
    return chan


# the untied LM head's gain: logits ~ N(0, LM_HEAD_GAIN^2) for a unit-RMS final hidden vector,
# the spread of a trained small LM's logits
LM_HEAD_GAIN = 3.0


def random_model_params(cfg: Config, seed: int = 0) -> ModelParams:
    """Seeded model: layer l is ``random_params(cfg, layer_seed(seed, l), cfg.model.mixers[l])``;
    the embedding rows are N(0, 1) times the model's channel profile (``channel_profile``:
    the outlier channels of a residual stream start in the embedding); the final norm weight
    like the layers' norm weights; an untied LM head ~ N(0, LM_HEAD_GAIN^2 / d)."""
    m = cfg.model
    layers = [random_params(cfg, layer_seed(seed, l), mixer, kind)
              for l, (mixer, kind) in enumerate(zip(m.mixers, m.layers))]
    emb = fnw = head = None
    if m.vocab:
        rng = np.random.default_rng([seed, 1 << 20])
        d = m.d_model
        emb = rng.normal(0.0, 1.0, size=(m.vocab, d)) * channel_profile(cfg, seed)[None, :]
        fnw = 1.0 + rng.normal(0.0, 0.1, size=d)
        big = rng.choice(d, size=max(1, d // 16), replace=False)
        fnw[big] *= rng.uniform(2.0, 4.0, size=big.size)
        if not m.tie_embedding:
            head = rng.normal(0.0, LM_HEAD_GAIN / np.sqrt(d), size=(m.vocab, d))
    res_q = None
    if m.attn_res != "none":   # pseudo-queries ~ N(0, 1/d): logits of order 1 over unit-RMS keys
        res_q = np.random.default_rng([seed, 1 << 21]).normal(0.0, 1.0 / np.sqrt(m.d_model),
                                                             size=(2 * m.n_layers + 1, m.d_model))
    mp = ModelParams(layers=layers, embedding=emb, final_norm_w=fnw, lm_head=head, res_queries=res_q)
    check_model_shapes(mp, cfg)
    return mp


def random_tokens(cfg: Config, n_tokens: int, seed: int = 1, model_seed: int = 0) -> np.ndarray:
    """Token ids (n_tokens,) of a text-like sequence: unigram frequencies ~ 1/rank (Zipf) over
    the model's own ranking of the vocabulary (``model_seed``: the language belongs to the
    model, like the channel profile), and, as in text, repeats: a quarter of the tokens copy
    one of the last 16.  ``seed`` picks the sequence."""
    V = cfg.model.vocab
    if V == 0:
        raise ValueError(f"config {cfg.name}: vocab = 0, a layer stack has no tokens (use random_inputs)")
    ranking = np.random.default_rng([model_seed, 11]).permutation(V)
    p = 1.0 / np.arange(1, V + 1)
    rng = np.random.default_rng(seed)
    toks = ranking[rng.choice(V, size=n_tokens, p=p / p.sum())]
    for t in range(1, n_tokens):
        if rng.random() < 0.25:
            toks[t] = toks[t - 1 - rng.integers(min(t, 16))]
    return toks.astype(np.int64)


def random_inputs(cfg: Config, n_tokens: int, seed: int = 1, model_seed: int = 0) -> np.ndarray:
    """Residual-stream-like inputs (n_tokens, d): per-channel scales (log-normal,
    a few outlier channels as in real residual streams) and slow drift so the
    KDA state sees correlated tokens.  The channel profile belongs to the model
    (``model_seed``, like ``random_params``'s seed), the tokens to ``seed``: the
    calibration and evaluation sequences share outlier channels, as real text does."""
    d = cfg.model.d_model
    chan = channel_profile(cfg, model_seed)
    rng = np.random.default_rng(seed)
    drift = np.cumsum(rng.normal(0.0, 0.15, size=(n_tokens, d)), axis=0)
    x = rng.normal(0.0, 1.0, size=(n_tokens, d)) + 0.5 * np.tanh(drift)  # tanh keeps the random walk bounded
    return x * chan


# ---- file I/O --------------------------------------------------------------------------

def save_params(params: LayerParams, path: Path) -> None:
    np.savez(path, **params.to_flat())


# The readers refuse a damaged file with ValueError, one line naming the file and what is
# wrong: a checkpoint comes from outside, and `moekda accuracy --params`, `moekda image
# --params` and `moekda vectors` / `run --vectors` turn that into one line and exit 2.

def _real_array(path: Path, name: str, arr: np.ndarray) -> np.ndarray:
    """A parameter is a finite real number: bool, integer or float, no NaN or infinity (the
    quantiser's calibration would turn those into meaningless scales or fail deep inside)."""
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{path}: tensor {name} has dtype {arr.dtype}, not a real number type")
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise ValueError(f"{path}: tensor {name} holds NaN or infinite values")
    return arr


def read_npz(path: Path, what: str = "file") -> dict[str, np.ndarray]:
    """Every array of an .npz file (no pickled objects), numeric or not; ``what`` names the
    kind of file in the error ("parameter file")."""
    import zipfile
    import zlib
    path = Path(path)
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError("a single .npy array, not an .npz archive")
        with z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: a directory, not an .npz file") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError, TypeError,
            NotImplementedError, UnicodeDecodeError) as e:
        # numpy's ValueError covers a pickle refused, a bad .npy header and a truncated array
        raise ValueError(f"{path}: not a readable .npz {what} ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'damaged'})") from None


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Minimal reader of the safetensors layout (8-byte LE header size, JSON header, raw data),
    for float16/32/64 and bfloat16 tensors: enough for a checkpoint, no extra dependency."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file ({len(raw)} bytes, shorter than its header size)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: not a safetensors file (header of {n} bytes in a {len(raw)}-byte file)")
    try:
        header = json.loads(raw[8:8 + n])
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file (its header is not a JSON object)")
    base = 8 + n
    dtypes = {"F64": np.float64, "F32": np.float32, "F16": np.float16}
    sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = meta["dtype"], [int(d) for d in meta["shape"]], meta["data_offsets"]
            lo, hi = int(lo), int(hi)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor {name}: header entry needs dtype, shape and two data_offsets") from None
        if dtype not in sizes:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dtype} (F16, BF16, F32, F64)")
        count = int(np.prod(shape, dtype=object)) if shape else 1
        if min(shape, default=0) < 0 or not 0 <= lo <= hi <= len(raw) - base or hi - lo != count * sizes[dtype]:
            raise ValueError(f"{path}: tensor {name}: shape {shape} of {dtype} does not fit its data "
                             f"offsets {lo}..{hi} (file data {len(raw) - base} bytes)")
        buf = raw[base + lo:base + hi]
        if dtype == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=np.dtype(dtypes[dtype]).newbyteorder("<"))
        with np.errstate(invalid="ignore", over="ignore"):   # NaN/inf are refused just below
            wide = arr.reshape(shape).astype(np.float64)
        out[name] = _real_array(path, name, wide)
    return out


def _read_flat(path: Path) -> dict[str, np.ndarray]:
    path = Path(path)
    if path.suffix == ".npz":
        return {k: _real_array(path, k, v) for k, v in read_npz(path, "parameter file").items()}
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    raise ValueError(f"{path}: parameters must be .npz or .safetensors")


def load_params(path: Path, cfg: Config) -> LayerParams:
    """Parameters from .npz or .safetensors, with the flat names of LayerParams.to_flat().
    ValueError, one line naming the file, on a damaged file or a missing or misshapen tensor."""
    path = Path(path)
    flat = _read_flat(path)
    try:
        p = LayerParams.from_flat(flat)
        check_shapes(p, cfg)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return p


def save_model_params(mp: ModelParams, path: Path) -> None:
    np.savez(path, **mp.to_flat())


def load_model_params(path: Path, cfg: Config) -> ModelParams:
    """A model from .npz or .safetensors with the flat names of ModelParams.to_flat().
    ValueError, one line naming the file and the tensor, on a missing, extra or misshapen
    tensor, a layer of the wrong mixer kind, or a file that is not a parameter file."""
    path = Path(path)
    flat = _read_flat(path)     # its errors name the file and what is wrong
    try:
        mp = ModelParams.from_flat(flat, cfg)
        check_model_shapes(mp, cfg)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return mp
