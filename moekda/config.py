"""The one configuration every part of moekda reads: model sizes, hardware
parallelism, number formats and the clock.

A config is a TOML file under ``configs/`` (or any path).  ``load_config``
parses it, fills defaults, and validates every field; a bad value raises
``ConfigError`` whose message is one line naming the field and the allowed
range.  The command-line entry point turns that into a non-zero exit.

Each field is declared once below, with its type, default and allowed range,
so the checks, the defaults and ``moekda config --help-fields`` cannot drift
apart.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"


class ConfigError(ValueError):
    """A config value is missing, of the wrong type, or out of range."""


def _field(default, lo=None, hi=None, choices=None, doc=""):
    """A config field with its allowed range, kept next to its default."""
    return field(default=default, metadata={"lo": lo, "hi": hi, "choices": choices, "doc": doc})


LAYER_KINDS = ("kda", "mla")
K3_PLACEMENT = "k3"          # model.layers = "k3": k3_layers(n_layers)
MIXER_KINDS = ("moe", "dense")
GLU_KINDS = ("swiglu", "situ")
ATTN_RES_MODES = ("none", "full", "block")
WEIGHT_FORMATS = ("int8", "mxfp4")
EXPERT_INPUT_FORMATS = ("int8", "mxfp8_e4m3")


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = _field(16, 4, 4096, doc="model width")
    n_heads: int = _field(1, 1, 64, doc="KDA heads")
    head_dim: int = _field(16, 4, 256, doc="KDA head dimension (d_k = d_v)")
    n_experts: int = _field(4, 1, 1024, doc="routed experts E")
    top_k: int = _field(2, 1, 1024, doc="experts chosen per token (<= n_experts)")
    d_ff: int = _field(16, 4, 16384, doc="expert hidden width")
    n_shared: int = _field(1, 0, 8, doc="shared experts")
    conv_kernel: int = _field(4, 1, 8, doc="causal short-convolution taps")
    gate_rank: int = _field(4, 1, 1024, doc="rank of the low-rank decay and output-gate projections")
    decay_lower_bound: float = _field(-5.0, -5.0, -0.01, doc="lb of the bounded gate g = lb*sigmoid(..)")
    routed_scaling: float = _field(2.5, 0.01, 64.0, doc="routed_scaling_factor of the MoE")
    norm_eps: float = _field(1e-6, 1e-12, 1e-2, doc="RMSNorm epsilon")
    # ---- the model stack (issue 14).  Every layer has the sizes above; what differs per layer is
    # its kind and its channel mixer.  n_layers = 1 with vocab = 0 is the one-layer chip.
    n_layers: int = _field(1, 1, 64, doc="layers of the stack, run one after another")
    layers: tuple = _field(None, choices=LAYER_KINDS,
                           doc="kind of each layer, n_layers entries (omitted: all kda), or \"k3\": K3's "
                               "placement, mla at every fourth layer (3, 7, ...) and the last, kda elsewhere")
    mixers: tuple = _field(None, choices=MIXER_KINDS,
                           doc="channel mixer of each layer, n_layers entries (omitted: all moe); "
                               "dense = one SwiGLU of width d_ff_dense")
    d_ff_dense: int = _field(0, 0, 1 << 18,
                             doc="hidden width of a dense mixer, a multiple of d_ff (run as d_ff_dense/d_ff "
                                 "chunks on the shared-expert path); 0: (top_k + n_shared) * d_ff, K2's ratio")
    vocab: int = _field(0, 0, 65536, doc="vocabulary (16 to 65536): token id in, next token out; "
                                         "0: no embedding or LM head, residual streams in and out")
    tie_embedding: bool = _field(False, doc="LM head = embedding table transposed (needs vocab > 0)")
    # ---- K3's hybrid (issue 15): Gated MLA layers, Attention Residuals, LatentMoE.  An MLA
    # layer has n_heads heads of head_dim; the defaults are the chip without them.
    kv_rank: int = _field(0, 0, 4096, doc="Gated MLA's latent width, the one value per token its cache keeps "
                                          "(1 to 4096 when model.layers has an \"mla\"; 0: no MLA layer)")
    attn_res: str = _field("none", choices=ATTN_RES_MODES,
                           doc="Attention Residuals: none (the plain residual sum), full (every sub-layer's "
                               "input a softmax mix of all earlier outputs), block (of block summaries)")
    attn_res_block: int = _field(2, 1, 128, doc="block AttnRes: sub-layers (token mixer, channel mixer) per block")
    moe_latent: int = _field(0, 0, 4096, doc="LatentMoE: the routed experts' latent width, below d_model; "
                                             "0: the plain MoE")
    # ---- K3 as released (issue 47, difference 5): the gated unit of every expert, shared expert
    # and dense mixer.  swiglu: W_2 (SiLU(W_1 z) * W_3 z); situ: W_2 (SiTU(W_1 z) * 25 tanh(W_3 z / 25)),
    # SiTU(g) = 4 tanh(g / 4) sigmoid(g)
    glu: str = _field("swiglu", choices=GLU_KINDS,
                      doc="the experts' and dense mixer's gated unit: swiglu (SiLU(gate) * up) or situ "
                          "(K3's SiTU-GLU: 4 tanh(gate/4) sigmoid(gate) * 25 tanh(up/25))")
    # ---- K3 as released (issue 47, difference 4): LatentMoE's exit norm.  K3 computes
    # W_up RMSNorm(sum_i p_i E_i(z)) + Shared(x): the routed experts' latent sum is RMS-normalised
    # (with a weight of width moe_latent) before the up-projection, so its size no longer follows
    # the router's weights (K3 sets routed_scaling = 1.0; with the norm it only moves eps)
    latent_exit_norm: bool = _field(False, doc="LatentMoE: RMSNorm (weight of width moe_latent, eps norm_eps) on "
                                               "the routed experts' latent sum before lat_up, as Kimi K3 "
                                               "(needs model.moe_latent > 0)")

    def __post_init__(self):
        # the omitted per-layer lists and the dense width follow from the other fields
        for name, value in _stack_defaults(self).items():
            if name in ("layers", "mixers") and getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.layers == K3_PLACEMENT:
            object.__setattr__(self, "layers", k3_layers(self.n_layers))
        if self.d_ff_dense == 0:
            object.__setattr__(self, "d_ff_dense", (self.top_k + self.n_shared) * self.d_ff)

    @property
    def is_layer_chip(self) -> bool:
        """Today's one-layer chip: one KDA + MoE layer, residual streams in and out."""
        return self.n_layers == 1 and self.vocab == 0 and self.mixers == ("moe",) and self.layers == ("kda",)

    @property
    def dense_chunks(self) -> int:
        """A dense mixer as d_ff-wide SwiGLU chunks (the shared-expert path's width)."""
        return self.d_ff_dense // self.d_ff


def k3_layers(n_layers: int) -> tuple:
    """Kimi K3's placement of its global (Gated MLA) layers (issue 47, difference 6): every
    fourth layer, 0-based 3, 7, 11, ..., and the last; KDA elsewhere.  K3's 93 layers give the
    24 global layers 3, 7, ..., 91 and 92; a 4-layer model gets kda, kda, kda, mla.
    ``model.layers = "k3"`` in a config is this list."""
    return tuple("mla" if (i % 4 == 3 or i == n_layers - 1) else "kda" for i in range(n_layers))


def _stack_defaults(m) -> dict:
    """What each stack field is when the TOML omits it (given the other fields)."""
    return {"n_layers": 1, "layers": ("kda",) * m.n_layers, "mixers": ("moe",) * m.n_layers,
            "d_ff_dense": (m.top_k + m.n_shared) * m.d_ff, "vocab": 0, "tie_embedding": False}


@dataclass(frozen=True)
class HwConfig:
    lanes: int = _field(4, 1, 256, doc="parallel int8 MAC lanes")
    weight_port_bytes: int = _field(4, 1, 256, doc="weight-memory port width in bytes per cycle")
    weight_port_latency: int = _field(4, 1, 64, doc="testbench weight-memory latency in cycles")
    clock_period_ns: float = _field(1.0, 0.3, 100.0, doc="target clock period in ns")
    state_lanes: int = _field(4, 1, 256, doc="KDA state entries read and updated per cycle (divides head_dim)")
    state_memory: str = _field("flops", choices=("flops", "sram"),
                               doc="where the KDA state and the short-convolution history live: flip-flops, "
                                   "or the platform's 1RW SRAM macros (fakeram45; the state in two banks by "
                                   "word parity, hw/kda/state.py; the history one word per channel, "
                                   "hw/kda/short_conv.py)")
    sequences: int = _field(1, 1, 4, doc="independent sequences the model chip interleaves through its "
                                         "two datapath stages (one token of each inside; KDA state per "
                                         "sequence; hw/chip/model.py)")


# fields whose default is the chip as it was before the field existed: left out of
# Config.to_dict at that default, so older configs keep their hash (and cache keys)
_HW_LATER_DEFAULTS = {"state_memory": "flops", "sequences": 1}
_MODEL_LATER_DEFAULTS = {"kv_rank": 0, "attn_res": "none", "attn_res_block": 2, "moe_latent": 0,
                         "glu": "swiglu", "latent_exit_norm": False}
_PNR_LATER_DEFAULTS = {"macro_placement": "column", "macro_halo_um": 5.0, "antenna_diodes": "ports+macros"}
ANTENNA_DIODE_NETS = ("none", "ports", "ports+macros")
_FORMATS_LATER_DEFAULTS = {"routed_expert_weights": "int8", "shared_expert_weights": "int8",
                           "expert_inputs": "int8"}


@dataclass(frozen=True)
class FormatsConfig:
    act_bits: int = _field(8, choices=(8,), doc="activation width (signed)")
    weight_bits: int = _field(8, choices=(8,), doc="weight width (signed)")
    acc_bits: int = _field(32, 24, 48, doc="accumulator width (signed)")
    requant_mult_bits: int = _field(16, 8, 31, doc="requantisation multiplier width (unsigned)")
    state_bits: int = _field(16, 12, 32, doc="KDA state entry width (signed)")
    lut_in_bits: int = _field(8, 6, 12, doc="input width of the sigmoid/SiLU/exp tables")
    # ---- K3's number formats (issue 48; moekda/mx.py, docs/numerics.md section 11): per matrix
    # class, int8 (one scale per matrix, as before) or MXFP4 (E2M1 in blocks of 32 along the
    # input, one E8M0 scale byte a block).  Numpy models only so far: the chip refuses them.
    routed_expert_weights: str = _field("int8", choices=WEIGHT_FORMATS,
                                        doc="routed experts' W1/W2/W3 (gate, up, down): int8 or mxfp4")
    shared_expert_weights: str = _field("int8", choices=WEIGHT_FORMATS,
                                        doc="shared experts' and the dense layer's W1/W2/W3: int8 or mxfp4")
    expert_inputs: str = _field("int8", choices=EXPERT_INPUT_FORMATS,
                                doc="routed experts' input (into W1/W3): int8, or mxfp8_e4m3 (E4M3 in blocks "
                                    "of 32 of a 16-bit input; needs routed_expert_weights = mxfp4)")


@dataclass(frozen=True)
class PnrConfig:
    """Floorplan and placement knobs of `moekda pnr` (OpenROAD); ORFS's names in the docs."""
    core_utilization: float = _field(0.5, 0.1, 0.9, doc="cell area / core area at floorplan (ORFS CORE_UTILIZATION/100)")
    aspect_ratio: float = _field(1.0, 0.25, 4.0, doc="core height / width (CORE_ASPECT_RATIO)")
    core_margin_um: float = _field(2.0, 0.0, 100.0, doc="space between core and die edge in um (CORE_MARGIN)")
    place_density: float = _field(0.6, 0.15, 0.95, doc="global placement target density (PLACE_DENSITY)")
    tapcell_distance_um: float = _field(120.0, 10.0, 500.0, doc="well-tap spacing along a row in um")
    macro_placement: str = _field("column", doc="SRAM macros: \"column\" (flow/macros.py, along the core's "
                                  "left edge), \"auto\" (rtl_macro_placer) or a committed Tcl file of place_macro lines")
    macro_halo_um: float = _field(5.0, 0.0, 50.0, doc="space kept free around each SRAM macro in um (MACRO_PLACE_HALO)")
    antenna_diodes: str = _field("ports+macros", choices=ANTENNA_DIODE_NETS,
                                 doc="an antenna diode before global routing on each net the layout gives no "
                                     "n-diffusion: the block's input ports, and the SRAM macros' outputs "
                                     "(OpenLane's DIODE_ON_PORTS; the KLayout deck skips a net with a diode)")


@dataclass(frozen=True)
class Config:
    name: str
    model: ModelConfig
    hw: HwConfig
    formats: FormatsConfig
    source: str = ""  # the file it came from, for messages
    # optional: tiny/small TOMLs may omit [pnr] and get the defaults
    pnr: PnrConfig = field(default_factory=PnrConfig)

    def to_dict(self) -> dict:
        """The values, as TOML/JSON would hold them.  A stack field (model.n_layers, layers,
        mixers, d_ff_dense, vocab, tie_embedding) is listed only where it differs from what
        omitting it gives: a one-layer config's dict, and so its hash, is what it was before
        the stack fields existed, and the dict still loads back to the same config."""
        d = dataclasses.asdict(self)
        d.pop("source")
        for name, default in _stack_defaults(self.model).items():
            if d["model"][name] == default:
                del d["model"][name]
            elif isinstance(d["model"][name], tuple):
                d["model"][name] = list(d["model"][name])
        # the same for fields added later at a default that is what the chip was before them
        for section, later in (("hw", _HW_LATER_DEFAULTS), ("model", _MODEL_LATER_DEFAULTS),
                               ("pnr", _PNR_LATER_DEFAULTS), ("formats", _FORMATS_LATER_DEFAULTS)):
            for name, default in later.items():
                if d[section][name] == default:
                    del d[section][name]
        return d

    def hash(self) -> str:
        """Stable short hash of the values (not the file text): a cache key."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def clock_mhz(self) -> float:
        return 1000.0 / self.hw.clock_period_ns


SECTIONS = {"model": ModelConfig, "hw": HwConfig, "formats": FormatsConfig, "pnr": PnrConfig}


def _check_value(section: str, f: dataclasses.Field, value):
    name = f"{section}.{f.name}"
    meta = f.metadata
    if f.type == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} = {value!r}: must be an integer")
    elif f.type == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} = {value!r}: must be a number")
        value = float(value)
    elif f.type == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{name} = {value!r}: must be true or false")
    elif f.type == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{name} = {value!r}: must be a string")
    elif f.type == "tuple":
        if name == "model.layers" and value == K3_PLACEMENT:
            return value          # expanded by ModelConfig once n_layers is known
        if not isinstance(value, (list, tuple)) or not value:
            k3 = f'"{K3_PLACEMENT}" or ' if name == "model.layers" else ""
            raise ConfigError(f"{name} = {value!r}: must be {k3}a non-empty list of "
                              f"{', '.join(map(repr, meta['choices']))}, one per layer")
        for i, v in enumerate(value):
            if v not in meta["choices"]:
                raise ConfigError(f"{name}[{i}] = {v!r}: allowed values are {', '.join(meta['choices'])}")
        return tuple(value)
    if meta["choices"] is not None and value not in meta["choices"]:
        allowed = ", ".join(str(c) for c in meta["choices"])
        raise ConfigError(f"{name} = {value!r}: allowed values are {allowed}")
    lo, hi = meta["lo"], meta["hi"]
    if lo is not None and not (lo <= value <= hi):
        raise ConfigError(f"{name} = {value!r}: allowed range is {lo} to {hi}")
    return value


def _build_section(section: str, cls, raw: dict):
    if not isinstance(raw, dict):
        raise ConfigError(f"[{section}] must be a table")
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            raise ConfigError(f"{section}.{key}: unknown field (known: {', '.join(known)})")
    values = {}
    for name, f in known.items():
        values[name] = _check_value(section, f, raw[name]) if name in raw else f.default
    return cls(**values)


# resource limits: a config past them is refused before anything is generated (numpy arrays,
# RTL, simulation memories), so a typo gets one line instead of a memory error minutes later
MAX_WEIGHT_BYTES = 64 << 20      # the weight matrices of the model (every layer, embedding, LM head)
MAX_STATE_BITS = 1 << 20         # the KDA state of every layer (flip-flops or SRAM)
MAX_CELLS = 5_000_000            # a rough cell estimate: past it synthesis does not fit this machine


def layer_weight_bytes(cfg: Config, mixer: str = "moe", kind: str = "kda") -> int:
    """int8 weight elements of one layer of token mixer ``kind`` and channel mixer ``mixer``
    (padding not counted)."""
    m = cfg.model
    d, hk, r, E, F = m.d_model, m.n_heads * m.head_dim, m.gate_rank, m.n_experts, m.d_ff
    if kind == "mla":        # w_q, w_g, w_o; the latent down-projection; W_uk and W_uv per head
        tok = 3 * hk * d + m.kv_rank * d + 2 * hk * m.kv_rank
    else:
        tok = 3 * hk * d + 2 * r * d + m.n_heads * d + 2 * hk * r + d * hk
    if mixer == "dense":
        return tok + 3 * m.d_ff_dense * d
    lat = m.moe_latent      # LatentMoE: routed experts at width lat, two projections at full width
    routed = E * 3 * F * (lat or d) + (2 * lat * d if lat else 0)
    return tok + E * d + routed + m.n_shared * 3 * F * d


def resource_estimate(cfg: Config) -> dict[str, int]:
    """Weight bytes, state bits and a cell estimate of the chip (order of magnitude:
    ~12 cells per state or parameter bit with its muxes, ~3 000 per MAC lane).  A stack
    counts every layer's weights, state and parameters, the embedding table and an untied
    LM head."""
    m, hw = cfg.model, cfg.hw
    d, hk = m.d_model, m.n_heads * m.head_dim
    weights = sum(layer_weight_bytes(cfg, mx, kind) for mx, kind in zip(m.mixers, m.layers))
    weights += m.vocab * d * (1 if m.tie_embedding else 2)
    state = m.layers.count("kda") * m.n_heads * m.head_dim * m.head_dim * cfg.formats.state_bits
    params = m.n_layers * (8 * (3 * hk * m.conv_kernel + 4 * hk) + 8 * 16 * (1 << cfg.formats.lut_in_bits))
    return {"weight_bytes": weights, "state_bits": state,
            "cells": 12 * (state + params) + 3000 * hw.lanes + 40 * d * 8}


def _check_resources(cfg: Config):
    m = cfg.model
    est = resource_estimate(cfg)
    shape = f"model.d_model = {m.d_model}, model.d_ff = {m.d_ff}, model.n_experts = {m.n_experts}"
    what = "the layer's" if m.is_layer_chip else "the model's"
    if not m.is_layer_chip:
        shape += f", model.n_layers = {m.n_layers}, model.vocab = {m.vocab}"
    if est["weight_bytes"] > MAX_WEIGHT_BYTES:
        raise ConfigError(f"{shape}: {what} weights would be {est['weight_bytes']:,} bytes, "
                          f"the limit is {MAX_WEIGHT_BYTES:,} (64 MiB)")
    if est["state_bits"] > MAX_STATE_BITS:
        layers = f" in {m.n_layers} layers" if m.n_layers > 1 else ""
        raise ConfigError(f"model.head_dim = {m.head_dim} with model.n_heads = {m.n_heads}{layers}: the KDA state "
                          f"would be {est['state_bits']:,} bits, the limit is {MAX_STATE_BITS:,}")
    if est["cells"] > MAX_CELLS:
        raise ConfigError(f"{shape}, hw.lanes = {cfg.hw.lanes}: about {est['cells']:,} cells, "
                          f"the limit is {MAX_CELLS:,}")


def _check_stack(cfg: Config):
    """The stack fields against each other (before the resource estimate, which reads them)."""
    m = cfg.model
    for name in ("layers", "mixers"):
        n = len(getattr(m, name))
        if n != m.n_layers:
            raise ConfigError(f"model.{name} has {n} entr{'y' if n == 1 else 'ies'}: must have one per layer, "
                              f"model.n_layers = {m.n_layers}")
    if m.d_ff_dense % m.d_ff:
        raise ConfigError(f"model.d_ff_dense = {m.d_ff_dense}: must be a multiple of model.d_ff ({m.d_ff}), "
                          f"the dense mixer runs as d_ff-wide chunks on the shared-expert path (0: the default)")
    if 0 < m.vocab < 16:
        raise ConfigError(f"model.vocab = {m.vocab}: allowed values are 0 (no embedding or LM head) "
                          f"or 16 to 65536")
    if m.tie_embedding and m.vocab == 0:
        raise ConfigError("model.tie_embedding = True: needs a vocabulary (model.vocab 16 to 65536)")
    if "mla" in m.layers and m.kv_rank == 0:
        raise ConfigError("model.kv_rank = 0: an \"mla\" layer in model.layers needs its latent width "
                          "(allowed range 1 to 4096)")
    if m.moe_latent >= m.d_model:
        raise ConfigError(f"model.moe_latent = {m.moe_latent}: allowed range is 1 to model.d_model - 1 "
                          f"({m.d_model - 1}), or 0 for the plain MoE")
    if m.moe_latent and "moe" not in m.mixers:
        raise ConfigError(f"model.moe_latent = {m.moe_latent}: no \"moe\" in model.mixers to make latent")
    if m.latent_exit_norm and not m.moe_latent:
        raise ConfigError("model.latent_exit_norm = true: needs a LatentMoE (model.moe_latent 1 to "
                          "model.d_model - 1); allowed with the plain MoE: false")
    f = cfg.formats
    if f.expert_inputs != "int8" and f.routed_expert_weights != "mxfp4":
        raise ConfigError(f'formats.expert_inputs = "{f.expert_inputs}": needs formats.routed_expert_weights = '
                          f'"mxfp4" (MXFP8 inputs feed the MXFP4 engine; allowed with int8 weights: int8)')


def hybrid_parts(m) -> list[str]:
    """The parts of K3's hybrid (issue 15) a model config uses: each as its config field."""
    parts = []
    if "mla" in m.layers:
        parts.append('model.layers "mla"')
    if m.attn_res != "none":
        parts.append(f'model.attn_res = "{m.attn_res}"')
    if m.moe_latent:
        parts.append(f"model.moe_latent = {m.moe_latent}")
    return parts


def mx_formats(cfg: Config) -> list[str]:
    """The formats fields of a config that are not int8 (issue 48), each as ``field = "value"``."""
    return [f'formats.{name} = "{getattr(cfg.formats, name)}"' for name in _FORMATS_LATER_DEFAULTS
            if getattr(cfg.formats, name) != "int8"]


def require_image_model(cfg: Config) -> None:
    """ConfigError unless the memory image (hw/image/: memory map, parameter map, pack and
    unpack) holds this model: every model the config schema allows (kda and Gated MLA layers,
    MoE and LatentMoE mixers, Attention Residuals) so far, in int8; the one place to refuse a
    part the image does not hold yet (MXFP4 and MXFP8 formats, issue 48)."""
    require_chip_formats(cfg)


def require_chip_formats(cfg: Config) -> None:
    """ConfigError unless every number format of the config is one the chip (RTL, image) builds:
    int8 only so far; MXFP4 / MXFP8 (issue 48) run in the numpy models alone.  Called by every
    command that builds or runs the chip (rtl, synth, pnr, power, orfs, run, image, bench)."""
    mx = mx_formats(cfg)
    if mx:
        raise ConfigError(f"config {cfg.name}: {mx[0]}: the chip's MXFP4 engine is not built yet (issue 48 "
                          f"item 3; the numpy float and integer models run it); allowed on the chip: int8")


def require_chip_model(cfg: Config) -> None:
    """ConfigError unless the chip (the RTL: hw/chip/model.py, hw/tops.py) builds this model:
    kda and mla layers, MoE and LatentMoE mixers, Attention Residuals on the model chip (the
    depth unit sits between the model chip's stages; the layer chip has no place for it)."""
    require_image_model(cfg)
    if cfg.model.attn_res != "none" and cfg.model.vocab == 0:
        raise ConfigError(f"config {cfg.name}: model.attn_res = \"{cfg.model.attn_res}\" runs on the model chip "
                          f"only, which needs model.vocab (16 to 65536)")


def _check_relations(cfg: Config):
    """Constraints between fields, each reported against the field to change."""
    _check_stack(cfg)
    _check_resources(cfg)
    m, hw = cfg.model, cfg.hw
    if m.top_k > m.n_experts:
        raise ConfigError(f"model.top_k = {m.top_k}: allowed range is 1 to model.n_experts ({m.n_experts})")
    if m.n_heads * m.head_dim > 4 * m.d_model:
        raise ConfigError(
            f"model.head_dim = {m.head_dim}: n_heads*head_dim must be at most 4*d_model ({4 * m.d_model})")
    if m.gate_rank > m.d_model:
        raise ConfigError(f"model.gate_rank = {m.gate_rank}: allowed range is 1 to model.d_model ({m.d_model})")
    if hw.lanes > max(m.d_model, m.d_ff, m.n_heads * m.head_dim):
        raise ConfigError(
            f"hw.lanes = {hw.lanes}: allowed range is 1 to the widest vector "
            f"({max(m.d_model, m.d_ff, m.n_heads * m.head_dim)})")
    f = cfg.formats
    # the requantiser's product acc*M is computed in int64 by the model and as one word by the RTL
    if f.acc_bits + f.requant_mult_bits > 61:
        raise ConfigError(
            f"formats.requant_mult_bits = {f.requant_mult_bits}: acc_bits + requant_mult_bits must be at most 61 "
            f"(allowed range here 8 to {61 - f.acc_bits})")
    if hw.lanes & (hw.lanes - 1):
        raise ConfigError(f"hw.lanes = {hw.lanes}: must be a power of two (1, 2, 4, ... 256)")
    if hw.weight_port_bytes & (hw.weight_port_bytes - 1):
        raise ConfigError(f"hw.weight_port_bytes = {hw.weight_port_bytes}: must be a power of two (1 to 256)")
    # the engine multiplies one weight-port beat per cycle, one byte per lane (hw/arith/matvec.py)
    if hw.lanes != hw.weight_port_bytes:
        raise ConfigError(f"hw.lanes = {hw.lanes}: must equal hw.weight_port_bytes ({hw.weight_port_bytes}); "
                          f"the engine takes one port beat per cycle, one byte per lane")
    if m.head_dim % hw.state_lanes:
        raise ConfigError(f"hw.state_lanes = {hw.state_lanes}: must divide model.head_dim ({m.head_dim})")
    if hw.sequences > 1 and m.is_layer_chip:
        raise ConfigError(f"hw.sequences = {hw.sequences}: more than one sequence needs the model chip "
                          f"(model.vocab > 0); the layer chip runs one (allowed: 1)")
    # a macro placement is a method, or a committed Tcl file of the repository
    mp = cfg.pnr.macro_placement
    if mp not in ("column", "auto") and not (mp.endswith(".tcl") and (REPO_ROOT / mp).is_file()):
        raise ConfigError(f"pnr.macro_placement = {mp!r}: allowed are \"column\", \"auto\" or the path of a "
                          "Tcl file of place_macro lines in the repository")
    # global placement cannot spread cells thinner than they sit in the core
    if cfg.pnr.place_density < round(cfg.pnr.core_utilization + 0.05, 9):
        raise ConfigError(
            f"pnr.place_density = {cfg.pnr.place_density}: allowed range is pnr.core_utilization + 0.05 "
            f"({cfg.pnr.core_utilization + 0.05:g}) to 0.95")


def config_from_dict(raw: dict, source: str = "<dict>") -> Config:
    raw = dict(raw)
    name = raw.pop("name", None)
    if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"name = {name!r}: must be a non-empty name of letters, digits, '-' or '_'")
    for key in raw:
        if key not in SECTIONS:
            raise ConfigError(f"[{key}]: unknown section (known: {', '.join(SECTIONS)})")
    parts = {sec: _build_section(sec, cls, raw.get(sec, {})) for sec, cls in SECTIONS.items()}
    cfg = Config(name=name, source=source, **parts)
    _check_relations(cfg)
    return cfg


def resolve_config_path(name_or_path: str | Path) -> Path:
    """`tiny` means configs/tiny.toml; anything with a slash or suffix is a path."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or len(p.parts) > 1:
        return p
    return CONFIG_DIR / f"{name_or_path}.toml"


def load_config(name_or_path: str | Path) -> Config:
    path = resolve_config_path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(q.stem for q in CONFIG_DIR.glob("*.toml")))
        raise ConfigError(f"config {name_or_path!s}: no such file {path} (known configs: {known})")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"config {path}: not UTF-8 text (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config {path}: not valid TOML: {e}") from None
    return config_from_dict(raw, source=str(path))


def with_settings(cfg: Config, settings) -> Config:
    """``cfg`` with fields replaced by ``section.field=value`` strings (the value in TOML:
    ``model.moe_latent=8``, ``model.layers=["kda","mla"]``), checked like a config file."""
    raw = cfg.to_dict()
    raw["name"] = cfg.name
    for item in settings:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"--set {item!r}: must be section.field=value (for example model.moe_latent=8)")
        if section not in SECTIONS:
            raise ConfigError(f"--set {item!r}: unknown section {section!r} (known: {', '.join(SECTIONS)})")
        try:
            raw.setdefault(section, {})[name] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            raise ConfigError(f"--set {item!r}: the value is not a TOML value (a number, true/false, "
                              f"\"text\" or a list)") from None
    return config_from_dict(raw, source=cfg.source)


def describe_fields() -> str:
    """Every field with its default and range, for --help-fields and the docs."""
    lines = []
    for sec, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            m = f.metadata
            if f.type == "tuple":
                rng = "list of " + "|".join(m["choices"])
            elif f.type == "bool":
                rng = "true or false"
            else:
                rng = ("one of " + ", ".join(map(str, m["choices"]))) if m["choices"] else f"{m['lo']} to {m['hi']}"
            default = "(see doc)" if f.default is None else f.default
            lines.append(f"{sec}.{f.name:<20} default {default!s:<8} {rng:<16} {m['doc']}")
    return "\n".join(lines)
