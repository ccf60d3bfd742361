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
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, fields
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
class LayerParams:
    attn_norm_w: np.ndarray  # (d,)
    kda: KDAParams
    mlp_norm_w: np.ndarray   # (d,)
    moe: MoEParams

    # -- flat name <-> array view, the one serialisation of the parameters --
    def to_flat(self) -> dict[str, np.ndarray]:
        flat = {"attn_norm_w": self.attn_norm_w, "mlp_norm_w": self.mlp_norm_w}
        for prefix, part in (("kda", self.kda), ("moe", self.moe)):
            for f in fields(part):
                flat[f"{prefix}.{f.name}"] = getattr(part, f.name)
        return flat

    @classmethod
    def from_flat(cls, flat: dict[str, np.ndarray]) -> "LayerParams":
        def part(prefix, kind):
            missing = [f.name for f in fields(kind) if f"{prefix}.{f.name}" not in flat]
            if missing:
                raise ValueError(f"parameters: missing {prefix}.{missing[0]}")
            return kind(**{f.name: np.asarray(flat[f"{prefix}.{f.name}"], dtype=np.float64)
                           for f in fields(kind)})
        for name in ("attn_norm_w", "mlp_norm_w"):
            if name not in flat:
                raise ValueError(f"parameters: missing {name}")
        return cls(attn_norm_w=np.asarray(flat["attn_norm_w"], np.float64), kda=part("kda", KDAParams),
                   mlp_norm_w=np.asarray(flat["mlp_norm_w"], np.float64), moe=part("moe", MoEParams))


def expected_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    m = cfg.model
    d, H, dk, r, K = m.d_model, m.n_heads, m.head_dim, m.gate_rank, m.conv_kernel
    hk = hv = H * dk
    E, f, S = m.n_experts, m.d_ff, m.n_shared
    return {
        "attn_norm_w": (d,), "mlp_norm_w": (d,),
        "kda.w_q": (hk, d), "kda.w_k": (hk, d), "kda.w_v": (hv, d),
        "kda.conv_q": (hk, K), "kda.conv_k": (hk, K), "kda.conv_v": (hv, K),
        "kda.w_f_down": (r, d), "kda.w_f_up": (hk, r), "kda.a_log": (H,), "kda.dt_bias": (hk,),
        "kda.w_b": (H, d), "kda.o_norm_w": (dk,), "kda.w_g_down": (r, d), "kda.w_g_up": (hv, r),
        "kda.w_o": (d, hv),
        "moe.w_router": (E, d), "moe.router_bias": (E,),
        "moe.w_gate": (E, f, d), "moe.w_up": (E, f, d), "moe.w_down": (E, d, f),
        "moe.sh_gate": (S, f, d), "moe.sh_up": (S, f, d), "moe.sh_down": (S, d, f),
    }


def check_shapes(params: LayerParams, cfg: Config) -> None:
    flat = params.to_flat()
    for name, shape in expected_shapes(cfg).items():
        if tuple(flat[name].shape) != shape:
            raise ValueError(f"parameter {name}: shape {tuple(flat[name].shape)}, config {cfg.name} needs {shape}")


def random_params(cfg: Config, seed: int = 0) -> LayerParams:
    """Seedable parameters with trained-layer-like scales (see module doc)."""
    rng = np.random.default_rng(seed)
    m = cfg.model
    d, H, dk, r = m.d_model, m.n_heads, m.head_dim, m.gate_rank
    shapes = expected_shapes(cfg)

    def dense(name, gain=1.0):
        shape = shapes[name]
        return rng.normal(0.0, gain / np.sqrt(shape[-1]), size=shape)

    def norm_w(n):
        w = 1.0 + rng.normal(0.0, 0.1, size=n)
        big = rng.choice(n, size=max(1, n // 16), replace=False)
        w[big] *= rng.uniform(2.0, 4.0, size=big.size)   # a few outlier channels
        return w

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
    moe = MoEParams(
        w_router=dense("moe.w_router", 2.0), router_bias=rng.normal(0.0, 0.05, size=m.n_experts),
        w_gate=dense("moe.w_gate"), w_up=dense("moe.w_up"), w_down=dense("moe.w_down", 0.5),
        sh_gate=dense("moe.sh_gate"), sh_up=dense("moe.sh_up"), sh_down=dense("moe.sh_down", 0.5),
    )
    p = LayerParams(attn_norm_w=norm_w(d), kda=kda, mlp_norm_w=norm_w(d), moe=moe)
    check_shapes(p, cfg)
    return p


def random_inputs(cfg: Config, n_tokens: int, seed: int = 1, model_seed: int = 0) -> np.ndarray:
    """Residual-stream-like inputs (n_tokens, d): per-channel scales (log-normal,
    a few outlier channels as in real residual streams) and slow drift so the
    KDA state sees correlated tokens.  The channel profile belongs to the model
    (``model_seed``, like ``random_params``'s seed), the tokens to ``seed``: the
    calibration and evaluation sequences share outlier channels, as real text does."""
    d = cfg.model.d_model
    crng = np.random.default_rng([model_seed, 7])
    chan = np.exp(crng.normal(0.0, 0.4, size=d))
    chan[crng.choice(d, size=max(1, d // 32), replace=False)] *= 4.0
    rng = np.random.default_rng(seed)
    drift = np.cumsum(rng.normal(0.0, 0.15, size=(n_tokens, d)), axis=0)
    x = rng.normal(0.0, 1.0, size=(n_tokens, d)) + 0.5 * np.tanh(drift)  # tanh keeps the random walk bounded
    return x * chan


# ---- file I/O --------------------------------------------------------------------------

def save_params(params: LayerParams, path: Path) -> None:
    np.savez(path, **params.to_flat())


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Minimal reader of the safetensors layout (8-byte LE header size, JSON header, raw data),
    for float16/32/64 and bfloat16 tensors: enough for a checkpoint, no extra dependency."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    dtypes = {"F64": np.float64, "F32": np.float32, "F16": np.float16}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        lo, hi = meta["data_offsets"]
        buf = raw[base + lo:base + hi]
        if meta["dtype"] == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif meta["dtype"] in dtypes:
            arr = np.frombuffer(buf, dtype=np.dtype(dtypes[meta["dtype"]]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {meta['dtype']}")
        out[name] = arr.reshape(meta["shape"]).astype(np.float64)
    return out


def load_params(path: Path, cfg: Config) -> LayerParams:
    """Parameters from .npz or .safetensors, with the flat names of LayerParams.to_flat()."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path) as z:
            flat = {k: z[k] for k in z.files}
    elif path.suffix == ".safetensors":
        flat = _read_safetensors(path)
    else:
        raise ValueError(f"{path}: parameters must be .npz or .safetensors")
    p = LayerParams.from_flat(flat)
    check_shapes(p, cfg)
    return p
