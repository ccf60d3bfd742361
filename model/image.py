"""Models to memory images and back: the quantiser's output as the chip's data.

    model (float LayerParams or integer QLayer) -> quantiser -> QLayer -> image bytes

The image format, its header and its checks are hw/image/format.py; this
module only connects it to the models (sim/ may use hw/, never the reverse).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hw.image.format import ImageError, pack_image, read_image
from hw.image.memory_map import qlayer_tensors, tensors_flat
from moekda.config import Config
from model.qparams import QLayer


def qlayer_image(cfg: Config, q: QLayer) -> bytes:
    """The chip's memory image of a quantised layer."""
    return pack_image(cfg, q.to_flat(), qlayer_tensors(q))


def random_layer_image(config: str, seed: int):
    """(config, quantised seeded random layer, its image): the tests' model at hand."""
    from moekda.config import load_config
    from model.quantize import quantize_random_layer
    cfg = load_config(config)
    q = quantize_random_layer(cfg, seed)
    return cfg, q, qlayer_image(cfg, q)


def qlayer_from_image(cfg: Config, image: bytes, what: str = "image") -> QLayer:
    """The quantised layer an image holds (checked: ImageError if it is not for ``cfg``).
    Of the tensor scales only the input's and the output's are in the image (the host's
    conversion, in the header): ``scales`` has ``x`` and ``y``."""
    params, tensors = read_image(cfg, image, what)
    return QLayer.from_flat({**params, **tensors_flat(cfg, tensors)})


def read_image_file(cfg: Config, path) -> QLayer:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ImageError(f"image {path}: {e.strerror}") from None
    return qlayer_from_image(cfg, raw, f"image {path}")


def model_from_file(cfg: Config, path, model_seed: int = 0) -> QLayer:
    """A quantised layer from a parameter file: an .npz of integer parameters
    (QLayer.to_flat() names, as `moekda vectors` writes params.npz) is taken as it is;
    float parameters (.npz or .safetensors, LayerParams.to_flat() names) are quantised,
    calibrated on sequences with the channel profile of ``model_seed``.
    ValueError (one line, naming the file) on a file that is neither."""
    from model.params import load_params, read_npz
    from model.quantize import quantize_layer
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        if path.suffix == ".npz":
            flat = read_npz(path, "parameter file")     # a damaged file: ValueError naming it
            if "kda.q_proj.m" in flat:
                return QLayer.from_flat(flat)
        return quantize_layer(load_params(path, cfg), cfg)
    except KeyError as e:
        raise ValueError(f"{path}: {e.args[0] if e.args else e}") from None


# ---- the model stack (issue 14) ---------------------------------------------------------

def qmodel_image(cfg: Config, qm) -> bytes:
    """The memory image of a quantised model (model.qparams.QModel): per-layer parameter
    blocks and the head's, every layer's matrices (a KDA or a Gated MLA token mixer's), the
    embedding and an untied LM head (hw/image/param_map.model_param_maps,
    hw/image/memory_map.model_tensors).  ConfigError (one line) for Attention Residuals or
    LatentMoE, which no image holds yet (moekda.config.require_image_model)."""
    from hw.image.memory_map import model_flat_tensors
    from moekda.config import require_image_model
    require_image_model(cfg)
    if cfg.model.is_layer_chip:
        return qlayer_image(cfg, qm.layers[0])
    flat = qm.to_flat()
    return pack_image(cfg, flat, model_flat_tensors(cfg, flat))


def qmodel_from_image(cfg: Config, image: bytes, what: str = "image"):
    """The QModel an image holds (checked: ImageError if it is not for ``cfg``).  Scales: only
    the header's (the logits', or the stack's input and output)."""
    from hw.image.memory_map import model_tensors_flat
    from moekda.config import require_image_model
    from model.qparams import QModel
    require_image_model(cfg)
    if cfg.model.is_layer_chip:
        return QModel(layers=[qlayer_from_image(cfg, image, what)])
    params, tensors = read_image(cfg, image, what)
    return QModel.from_flat({**params, **model_tensors_flat(cfg, tensors)}, cfg.model.n_layers)


def random_model_image(config: str, seed: int):
    """(config, quantised seeded random model, its image)."""
    from moekda.config import load_config
    from model.quantize import quantize_random_model
    cfg = load_config(config)
    qm = quantize_random_model(cfg, seed)
    return cfg, qm, qmodel_image(cfg, qm)


# damaged images for the chip's LOAD tests: kind -> (what is done, the LOAD_ERRORS bits expected)
DAMAGE_KINDS = ("magic", "version", "config", "length", "checksum", "truncated")


def with_word(image: bytes, offset: int, value: int) -> bytes:
    """``image`` with the 32-bit little-endian word at ``offset`` replaced by ``value``."""
    b = bytearray(image)
    b[offset:offset + 4] = int(value & 0xFFFF_FFFF).to_bytes(4, "little")
    return bytes(b)


def damaged_image(image: bytes, kind: str) -> tuple[bytes, int]:
    """``image`` with one kind of damage, and the LOAD_ERRORS bits the chip must report.
    Changing a header word also breaks the checksum (the words no longer sum to 0).
    ``truncated`` keeps the first three quarters and zero-fills the rest (what an
    erased memory past a short write holds)."""
    from hw.chip.loader import ERR

    def word(n):
        return int.from_bytes(image[4 * n:4 * n + 4], "little")

    if kind == "magic":
        return with_word(image, 0, 0x4F4F4F4F), ERR["MAGIC"] | ERR["CHECKSUM"]
    if kind == "version":
        return with_word(image, 4, word(1) + 1), ERR["VERSION"] | ERR["CHECKSUM"]
    if kind == "config":
        return with_word(image, 8, ~word(2)), ERR["CONFIG_HASH"] | ERR["CHECKSUM"]
    if kind == "length":
        return with_word(image, 12, len(image) - 4), ERR["LENGTH"] | ERR["CHECKSUM"]
    b = bytearray(image)
    if kind == "checksum":
        b[len(b) // 2] ^= 0x10          # one bit of one byte in the middle (parameters or matrices)
        return bytes(b), ERR["CHECKSUM"]
    if kind == "truncated":
        keep = 3 * len(b) // 4
        return bytes(b[:keep]) + bytes(len(b) - keep), ERR["CHECKSUM"]
    raise ValueError(f"damage kind {kind!r}: one of {', '.join(DAMAGE_KINDS)}")
