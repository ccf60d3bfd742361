"""Where every quantised weight tensor of the layer lives in the weight memory.

One source of truth for addresses: the RTL generators bake the base
addresses from here, the testbench memory is filled with ``build_image``,
and the analytic byte counts in reports come from the same regions.

Layout rules:

* each tensor is an int8 matrix stored row-major, one row after the other;
* every row starts on a ``port_bytes`` boundary (rows are zero-padded to a
  whole number of port beats), so a row is a whole number of beats and the
  engine never has to realign bytes across lanes;
* tensors follow each other in the order listed by the ``*_tensors``
  functions below, each starting on a ``port_bytes`` boundary;
* the tensors of one routed expert (gate, up, down) are contiguous, so an
  expert chosen by the router is one block of memory.

The matrices start at ``base``, after the image header and the parameter
region (hw/image/format.py, hw/image/param_map.py): the small per-model values
(requantisation multipliers and shifts, tables, norm constants) are in the
same memory, read once by the chip's LOAD step.

To add a block's tensors, write a ``<block>_tensors(cfg)`` function and add it
to ``TENSOR_GROUPS`` (an additive edit).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from hw.image.param_map import EXPERT_MATS, KDA_MATRICES, MLA_MATRICES
from hw.stream.weight_port import beats_per_row, padded_row_bytes


@dataclass(frozen=True)
class TensorRegion:
    """One int8 matrix in the weight memory."""
    name: str
    rows: int
    cols: int
    addr: int        # byte address of row 0 (aligned to port_bytes)
    row_bytes: int   # padded row stride in bytes (a multiple of port_bytes)
    port_bytes: int

    @property
    def nbytes(self) -> int:
        """Bytes the region occupies, padding included: what a read fetches."""
        return self.rows * self.row_bytes

    @property
    def row_beats(self) -> int:
        return beats_per_row(self.cols, self.port_bytes)

    @property
    def beats(self) -> int:
        return self.rows * self.row_beats

    @property
    def end(self) -> int:
        return self.addr + self.nbytes

    def row_addr(self, row: int) -> int:
        if not 0 <= row < self.rows:
            raise IndexError(f"{self.name}: row {row} outside 0..{self.rows - 1}")
        return self.addr + row * self.row_bytes


# ---- the tensors of each block, in memory order ------------------------------

def moe_expert_names(prefix: str) -> list[str]:
    return [f"{prefix}.{mat}" for mat in EXPERT_MATS]


def expert_tensors(prefix: str, d_ff: int, width: int) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of one expert (EXPERT_MATS) on vectors of ``width``: gate and up
    d_ff x width, down width x d_ff."""
    return [(f"{prefix}.{mat}", *((width, d_ff) if mat == "down" else (d_ff, width))) for mat in EXPERT_MATS]


def moe_tensors(cfg) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of the MoE channel mixer.

    ``moe.router``            E x d_model, one score row per routed expert
    ``moe.expert{e}.gate|up`` d_ff x d_model
    ``moe.expert{e}.down``    d_model x d_ff
    ``moe.shared{s}.*``       the same shapes for each shared expert

    LatentMoE (``model.moe_latent`` = l > 0): ``moe.lat_down`` l x d_model and ``moe.lat_up``
    d_model x l after the router, and the routed experts at width l (gate, up d_ff x l, down
    l x d_ff); the shared experts keep the full width.
    """
    m = cfg.model
    d, lat = m.d_model, m.moe_latent
    out = [("moe.router", m.n_experts, d)]
    if lat:
        out += [("moe.lat_down", lat, d), ("moe.lat_up", d, lat)]
    for e in range(m.n_experts):
        out += expert_tensors(f"moe.expert{e}", m.d_ff, lat or d)   # LatentMoE: at the latent width
    for s in range(m.n_shared):
        out += expert_tensors(f"moe.shared{s}", m.d_ff, d)
    return out


def moe_token_regions(cfg, prefix: str = "", routed: int | None = None) -> list[str]:
    """The MoE matrices one token reads, each once: the router, a LatentMoE's two projections,
    the shared experts and ``routed`` routed experts (default top_k; all of one shape, so
    expert 0 stands for each chosen one; n_experts gives the dense equivalent).  ``prefix``:
    a model layer's (``layers.<l>.``).  The one list the analytic MAC and byte counts use."""
    m = cfg.model
    out = [prefix + "moe.router"]
    if m.moe_latent:
        out += [prefix + "moe.lat_down", prefix + "moe.lat_up"]
    out += [prefix + f"moe.shared{s}.{t}" for s in range(m.n_shared) for t in EXPERT_MATS]
    out += [prefix + f"moe.expert0.{t}" for _ in range(m.top_k if routed is None else routed)
            for t in EXPERT_MATS]
    return out


def kda_tensors(cfg) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of the KDA token mixer, in the order the unit uses
    them within a token, so one read request streams them all:

    ``kda.w_q|w_k|w_v``   H*d_k x d_model (q, k, v projections, before the short conv)
    ``kda.w_f_down``      r x d_model, ``kda.w_g_down`` r x d_model, ``kda.w_b`` H x d_model
    ``kda.w_f_up``        H*d_k x r (decay), ``kda.w_g_up`` H*d_v x r (output gate)
    ``kda.w_o``           d_model x H*d_v
    """
    m = cfg.model
    dims = {"d": m.d_model, "hk": m.n_heads * m.head_dim, "r": m.gate_rank, "H": m.n_heads}
    return [(f"kda.{region}", dims[rows], dims[cols]) for region, _, rows, cols in KDA_MATRICES]


def mla_tensors(cfg) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of a Gated MLA token mixer (QMLA, model/int_mla.py), in the
    order the unit uses them within a token:

    ``mla.w_dkv``  r x d_model (the latent's down-projection, r = kv_rank)
    ``mla.w_q``    H*dh x d_model, ``mla.w_g`` H*dh x d_model (query, output gate)
    ``mla.w_uk``   H*r x dh: row h*r + i is QMLA.uk.w[h, i, :] (uk.w is (H, r, dh))
    ``mla.w_uv``   H*dh x r: row h*dh + j is QMLA.uv.w[h, j, :] (uv.w is (H, dh, r))
    ``mla.w_o``    d_model x H*dh
    """
    m = cfg.model
    H, dh, r = m.n_heads, m.head_dim, m.kv_rank
    dims = {"d": m.d_model, "r": r, "dh": dh, "Hdh": H * dh, "Hr": H * r}
    return [(f"mla.{region}", dims[rows], dims[cols]) for region, _, rows, cols in MLA_MATRICES]


def token_mixer_tensors(cfg, kind: str) -> list[tuple[str, int, int]]:
    """The token mixer's tensors of a layer of ``kind`` ("kda" or "mla")."""
    return mla_tensors(cfg) if kind == "mla" else kda_tensors(cfg)


TENSOR_GROUPS = [moe_tensors, kda_tensors]


def dense_tensors(cfg) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of a dense channel mixer (QDense), chunk after chunk, each one
    shared expert's shapes: ``dense.chunk{c}.gate|up`` d_ff x d_model, ``.down`` d_model x d_ff."""
    m = cfg.model
    return [t for c in range(m.dense_chunks) for t in expert_tensors(f"dense.chunk{c}", m.d_ff, m.d_model)]


def model_tensors(cfg) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of every matrix of the config, in memory order.  The layer chip:
    TENSOR_GROUPS (today's map).  A model: layer 0 .. L-1, each its channel mixer's tensors
    (moe_tensors or dense_tensors) then its token mixer's (kda_tensors, or mla_tensors for an
    "mla" layer of model.layers), named ``layers.<l>.<name>``; then, with Attention Residuals,
    ``attn_res.queries`` ((2 L + 1) x d_model: row n - 1 is sub-layer n's pseudo-query, the
    last row the output's; the depth unit, hw/attnres/, reads one row per mix); then, with a
    vocabulary, ``embedding`` (V x d_model: row t is token t's x_0) and, untied, ``lm_head``
    (V x d_model)."""
    m = cfg.model
    if m.is_layer_chip:
        return [t for group in TENSOR_GROUPS for t in group(cfg)]
    out = []
    for l, (kind, mx) in enumerate(zip(m.layers, m.mixers)):
        mix = moe_tensors(cfg) if mx == "moe" else dense_tensors(cfg)
        out += [(f"layers.{l}.{n}", r, c) for n, r, c in mix + token_mixer_tensors(cfg, kind)]
    if m.attn_res != "none":
        out.append(("attn_res.queries", 2 * m.n_layers + 1, m.d_model))
    if m.vocab:
        out.append(("embedding", m.vocab, m.d_model))
        if not m.tie_embedding:
            out.append(("lm_head", m.vocab, m.d_model))
    return out


# ---- the map -----------------------------------------------------------------

@dataclass(frozen=True)
class MemoryMap:
    port_bytes: int
    regions: dict[str, TensorRegion]
    base: int = 0            # address of the first matrix: header and parameters come first

    @property
    def size(self) -> int:
        return max((r.end for r in self.regions.values()), default=0)

    def __getitem__(self, name: str) -> TensorRegion:
        try:
            return self.regions[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in the memory map") from None

    def __contains__(self, name: str) -> bool:
        return name in self.regions

    def span(self, names) -> tuple[int, int]:
        """(addr, bytes) of consecutive regions, checked to be contiguous."""
        regs = [self[n] for n in names]
        for a, b in zip(regs, regs[1:]):
            if a.end != b.addr:
                raise ValueError(f"{a.name} and {b.name} are not contiguous")
        return regs[0].addr, regs[-1].end - regs[0].addr

    def describe(self) -> str:
        lines = [f"{'tensor':<24} {'addr':>10} {'rows':>6} {'cols':>6} {'stride':>7} {'bytes':>9}"]
        for r in self.regions.values():
            lines.append(f"{r.name:<24} {r.addr:#10x} {r.rows:>6} {r.cols:>6} {r.row_bytes:>7} {r.nbytes:>9}")
        lines.append(f"total {self.size} bytes, port {self.port_bytes} bytes")
        return "\n".join(lines)


# The image's address plan: header, parameter region, matrices.  The header's fields are
# the file format's (hw/image/format.py); its size is fixed here, where the regions start.
HEADER_MIN_BYTES = 32          # 8 words: room for later fields without moving the regions


def header_bytes(port_bytes: int) -> int:
    """The header's bytes: HEADER_MIN_BYTES rounded up to a whole port beat."""
    return -(-HEADER_MIN_BYTES // port_bytes) * port_bytes


def memory_map(cfg) -> MemoryMap:
    from hw.image.param_map import params_bytes
    from moekda.config import require_image_model
    require_image_model(cfg)
    pb = cfg.hw.weight_port_bytes
    regions: dict[str, TensorRegion] = {}
    base = addr = header_bytes(pb) + params_bytes(cfg)
    for name, rows, cols in model_tensors(cfg):
        if name in regions:
            raise ValueError(f"tensor {name!r} listed twice in the memory map")
        reg = TensorRegion(name, rows, cols, addr, padded_row_bytes(cols, pb), pb)
        regions[name] = reg
        addr = reg.end
    return MemoryMap(pb, regions, base)


def build_image(cfg, tensors: Mapping[str, np.ndarray], mmap: MemoryMap | None = None) -> bytes:
    """Memory contents with every matrix at its address and zeros below ``base``: what the
    block benches (KDA, MoE alone, which take their parameters on a port) read.  The chip's
    image, header and parameters included, is hw.image.format.pack_image."""
    mmap = mmap or memory_map(cfg)
    return bytes(mmap.base) + build_weights(cfg, tensors, mmap)


def build_weights(cfg, tensors: Mapping[str, np.ndarray], mmap: MemoryMap | None = None) -> bytes:
    """The matrices' span ``[base, size)``: every tensor of the map, int8, at its address.

    ``tensors`` maps each region name to an integer array of the region's
    shape with values in the int8 range; a missing, misshapen or out-of-range
    tensor is an error (a silently zero weight would hide bugs).
    """
    mmap = mmap or memory_map(cfg)
    image = np.zeros(mmap.size - mmap.base, dtype=np.uint8)
    missing = [n for n in mmap.regions if n not in tensors]
    if missing:
        raise KeyError(f"build_image: no values for {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    for name, reg in mmap.regions.items():
        w = np.asarray(tensors[name])
        if w.shape != (reg.rows, reg.cols):
            raise ValueError(f"build_image: {name} has shape {w.shape}, the map expects {(reg.rows, reg.cols)}")
        if w.size and (w.min() < -128 or w.max() > 127):
            raise ValueError(f"build_image: {name} has values outside the int8 range")
        block = np.zeros((reg.rows, reg.row_bytes), dtype=np.uint8)
        block[:, :reg.cols] = w.astype(np.int64) & 0xFF
        image[reg.addr - mmap.base:reg.end - mmap.base] = block.reshape(-1)
    return image.tobytes()


def read_weights(mmap: MemoryMap, image: bytes) -> dict[str, np.ndarray]:
    """Every region's int8 matrix read back from an image (the inverse of ``build_weights``)."""
    raw = np.frombuffer(image, dtype=np.int8)
    out = {}
    for name, reg in mmap.regions.items():
        block = raw[reg.addr:reg.end].reshape(reg.rows, reg.row_bytes)
        out[name] = block[:, :reg.cols].astype(np.int64)
    return out


def tensor_sources(n_experts: int, n_shared: int, latent: bool = False) -> dict[str, tuple[str, int | None]]:
    """Region name -> (dotted QLayer.to_flat() name, index into a bank of experts or None);
    ``latent``: a LatentMoE's two projections too."""
    out = {"moe.router": ("moe.router.w", None)}
    if latent:
        out.update({"moe.lat_down": ("moe.lat_down.w", None), "moe.lat_up": ("moe.lat_up.w", None)})
    for bank, prefix, n in (("routed", "moe.expert", n_experts), ("shared", "moe.shared", n_shared)):
        for e in range(n):
            for mat in EXPERT_MATS:
                out[f"{prefix}{e}.{mat}"] = (f"moe.{bank}.{mat}_w", e)
    for region, field, _, _ in KDA_MATRICES:
        out[f"kda.{region}"] = (f"kda.{field}.w", None)
    return out


def flat_tensors(flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every region's matrix from the flat integer parameters (QLayer.to_flat())."""
    n_routed, n_shared = (len(flat.get(f"moe.{b}.gate_w", ())) for b in ("routed", "shared"))
    return {region: (np.asarray(flat[name]) if e is None else np.asarray(flat[name])[e])
            for region, (name, e) in tensor_sources(n_routed, n_shared, "moe.lat_down.w" in flat).items()}


def tensors_flat(cfg, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of ``flat_tensors``: the matrices under their QLayer.to_flat() names."""
    out: dict[str, list | np.ndarray] = {}
    for region, (name, e) in tensor_sources(cfg.model.n_experts, cfg.model.n_shared,
                                            bool(cfg.model.moe_latent)).items():
        if e is None:
            out[name] = np.asarray(tensors[region], dtype=np.int64)
        else:
            out.setdefault(name, []).append(np.asarray(tensors[region], dtype=np.int64))
    return {k: (np.stack(v) if isinstance(v, list) else v) for k, v in out.items()}


def qlayer_tensors(q) -> dict[str, np.ndarray]:
    """Every region's int8 matrix from the quantised layer (model.qparams.QLayer):
    the input of ``build_image``."""
    return flat_tensors(q.to_flat())


# ---- the model stack (issue 14) ---------------------------------------------------------

def mla_tensor_sources() -> dict[str, tuple[str, int | None]]:
    """An MLA layer's regions -> (dotted QLayer.to_flat() name, None)."""
    return {f"mla.{region}": (f"mla.{field}.w", None) for region, field, _, _ in MLA_MATRICES}


def model_tensor_sources(cfg) -> dict[str, tuple[str, int | None]]:
    """Region name -> (dotted QModel.to_flat() name, index into a bank or None), for every
    region of ``model_tensors`` (the layer chip: ``tensor_sources``, QLayer names)."""
    m = cfg.model
    if m.is_layer_chip:
        return tensor_sources(m.n_experts, m.n_shared, bool(m.moe_latent))
    out = {}
    for l, (kind, mx) in enumerate(zip(m.layers, m.mixers)):
        src = tensor_sources(m.n_experts, m.n_shared, bool(m.moe_latent))
        if mx == "dense":
            src = {k: v for k, v in src.items() if k.startswith("kda.")}
            for c in range(m.dense_chunks):
                for mat in EXPERT_MATS:
                    src[f"dense.chunk{c}.{mat}"] = (f"dense.chunks.{mat}_w", c)
        if kind == "mla":
            src = {k: v for k, v in src.items() if not k.startswith("kda.")} | mla_tensor_sources()
        out.update({f"layers.{l}.{k}": (f"layers.{l}.{n}", e) for k, (n, e) in src.items()})
    if m.attn_res != "none":
        out["attn_res.queries"] = ("attn_res.queries", None)
    if m.vocab:
        out["embedding"] = ("head.emb", None)
        if not m.tie_embedding:
            out["lm_head"] = ("head.lm_head", None)
    return out


def model_source_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Region name -> the shape of its source array, for the regions whose matrix is the
    source reshaped (row-major) rather than the source itself: an MLA layer's per-head
    ``mla.w_uk`` (QMLA.uk.w, (H, r, dh)) and ``mla.w_uv`` (QMLA.uv.w, (H, dh, r))."""
    m = cfg.model
    if m.is_layer_chip:
        return {}
    H, dh, r = m.n_heads, m.head_dim, m.kv_rank
    out = {}
    for l, kind in enumerate(m.layers):
        if kind == "mla":
            out[f"layers.{l}.mla.w_uk"] = (H, r, dh)
            out[f"layers.{l}.mla.w_uv"] = (H, dh, r)
    return out


def _to_region(region: str, x: np.ndarray, shapes: Mapping[str, tuple]) -> np.ndarray:
    if region not in shapes:
        return x
    if x.shape != shapes[region]:
        raise ValueError(f"{region}: source has shape {x.shape}, the config's is {shapes[region]}")
    return x.reshape(x.shape[0] * x.shape[1], x.shape[2])


def model_flat_tensors(cfg, flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every region's matrix from the flat integer parameters (QModel.to_flat(), or
    QLayer.to_flat() for the layer chip); a per-head source (``model_source_shapes``) as its
    rows, head after head."""
    shapes = model_source_shapes(cfg)
    return {region: _to_region(region, np.asarray(flat[name]) if e is None else np.asarray(flat[name])[e], shapes)
            for region, (name, e) in model_tensor_sources(cfg).items()}


def model_tensors_flat(cfg, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of ``model_flat_tensors``."""
    shapes = model_source_shapes(cfg)
    out: dict[str, list | np.ndarray] = {}
    for region, (name, e) in model_tensor_sources(cfg).items():
        if region in shapes:
            out[name] = np.asarray(tensors[region], dtype=np.int64).reshape(shapes[region])
        elif e is None:
            out[name] = np.asarray(tensors[region], dtype=np.int64)
        else:
            out.setdefault(name, []).append(np.asarray(tensors[region], dtype=np.int64))
    return {k: (np.stack(v) if isinstance(v, list) else v) for k, v in out.items()}


# ---- per-layer addressing: what a block on the shared datapath needs to know of the stack ---
# The layer chip is a stack of one layer whose names carry no prefix; a model's layer l has
# its matrices (and parameter block, hw/image/format.py param_blocks) under ``layers.<l>.``.
# A block that runs every layer (KdaUnit, MoEUnit) takes the layer's index on a ``layer``
# port of ``layer_bits(cfg)`` bits and bakes one address per layer from ``layer_prefix``.

def layer_count(cfg) -> int:
    """Layers the datapath runs per token (1 on the layer chip)."""
    return 1 if cfg.model.is_layer_chip else cfg.model.n_layers


def layer_bits(cfg) -> int:
    """Width of a ``layer`` index port (at least 1 bit, so the port exists on the layer chip)."""
    return max(1, (layer_count(cfg) - 1).bit_length())


def sequence_slots(cfg) -> int:
    """Independent sequences the model chip interleaves through its two datapath stages
    (``hw.sequences``; the layer chip: 1).  Each has its own KDA state per layer."""
    return 1 if cfg.model.is_layer_chip else cfg.hw.sequences


def slot_bits(cfg) -> int:
    """Width of a ``slot`` index (at least 1 bit)."""
    return max(1, (sequence_slots(cfg) - 1).bit_length())


def mixer_layers(cfg, kind: str) -> list[int]:
    """The layers whose token mixer is ``kind`` ("kda" or "mla"), in order: the k-th of them
    is the mixer's k-th layer, which numbers its state or cache contexts.  The layer chip's
    one layer is a KDA layer."""
    if cfg.model.is_layer_chip:
        return [0] if kind == "kda" else []
    return [l for l, k in enumerate(cfg.model.layers) if k == kind]


def state_contexts(cfg) -> int:
    """KDA states (and short-convolution histories) the chip keeps: one per KDA layer and
    sequence slot, context ``slot * K + k`` for the k-th of the K KDA layers."""
    return len(mixer_layers(cfg, "kda")) * sequence_slots(cfg)


def layer_prefix(cfg, l: int) -> str:
    """The memory-map (and parameter) name prefix of layer ``l``."""
    if not 0 <= l < layer_count(cfg):
        raise ValueError(f"layer {l}: this config has {layer_count(cfg)} layers")
    return "" if cfg.model.is_layer_chip else f"layers.{l}."


def layer_mixer(cfg, l: int) -> str:
    """Channel mixer kind of layer ``l``: "moe" or "dense"."""
    layer_prefix(cfg, l)
    return cfg.model.mixers[l]


def layer_kind(cfg, l: int) -> str:
    """Token mixer kind of layer ``l``: "kda" or "mla" (model.layers)."""
    layer_prefix(cfg, l)
    return cfg.model.layers[l]
