"""The memory image: what the chip reads through its weight port, and the file format.

One image holds one model for one config::

    address 0           header     HEADER_WORDS little-endian 32-bit words, padded
    header_bytes        parameters the parameter region (hw/image/param_map.py)
    weights_base        matrices   every weight matrix (hw/image/memory_map.py)
    length              (end; padded to a whole port beat and 32-bit word)

Header words (``HEADER_WORDS``): MAGIC (the bytes "MKDI"), VERSION, CONFIG_HASH
(the first 8 hex digits of ``moekda config``'s hash, as the CSR reads back),
LENGTH (bytes of the whole image), CHECKSUM (chosen so that the 32-bit
little-endian words of the whole image sum to 0 modulo 2**32), X_SCALE and
Y_SCALE (IEEE float32: the real value of one LSB of the layer's input and
output, for the host that quantises tokens and reads results; the chip
ignores them; 0 when unknown).  The rest of the header is zero.

The chip checks the same things during LOAD (hw/chip/loader.py): it compares the
first four words with its own constants and sums every word it reads, and
takes no token until a LOAD passed.  The tools check them when they read a
file (``read_image``), and say in one line what is wrong.  The same file is
the simulated weight memory's contents: a ``moekda image`` file is the image,
byte for byte, with nothing around it.

Nothing here imports sim/ or Amaranth: the image is data, built from the
integer parameters ``{dotted name: array}`` of ``QLayer.to_flat()``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from hw.image.memory_map import HEADER_MIN_BYTES, header_bytes
from hw.image.param_map import (attn_res_outputs, attn_res_residuals, fixed_value_differs, model_param_maps,
                                model_structural, params_bytes)

MAGIC = int.from_bytes(b"MKDI", "little")
VERSION = 3              # 2: a model's layer parameter blocks are padded to one size; 3: with the
                         # history in SRAM the short-conv taps lead the parameter region (param_map
                         # conv_taps_in_sram)
HEADER_WORDS = ("MAGIC", "VERSION", "CONFIG_HASH", "LENGTH", "CHECKSUM", "X_SCALE", "Y_SCALE")
HOST_SCALES = {"X_SCALE": "scales.x", "Y_SCALE": "scales.y"}   # header word -> QLayer.to_flat() name


class ImageError(ValueError):
    """An image that is not for this chip: one line saying what is wrong."""


def config_hash_word(cfg) -> int:
    return int(cfg.hash()[:8], 16)


@dataclass(frozen=True)
class ImageLayout:
    header_bytes: int
    params_addr: int
    params_bytes: int
    weights_base: int
    length: int
    port_bytes: int

    @property
    def beats(self) -> int:
        return self.length // self.port_bytes


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def image_layout(cfg, weights_bytes: int | None = None) -> ImageLayout:
    """Where the regions are.  ``weights_bytes``: the matrices' span (memory_map passes it;
    by default it is taken from the memory map).  ConfigError (one line) for a model the image
    does not hold (``moekda.config.require_image_model``)."""
    from moekda.config import require_image_model
    require_image_model(cfg)
    pb = cfg.hw.weight_port_bytes
    hb = header_bytes(pb)
    nparams = params_bytes(cfg)
    base = hb + nparams
    if weights_bytes is None:
        from hw.image.memory_map import memory_map
        mm = memory_map(cfg)
        weights_bytes = mm.size - mm.base
    length = _round_up(base + weights_bytes, max(4, pb))
    return ImageLayout(hb, hb, nparams, base, length, pb)


def host_scales(cfg) -> dict[str, str]:
    """Header word -> flat name of the scale it carries.  The layer chip: QLayer's x and y.  A
    stack without vocabulary: layer 0's x and layer L-1's y.  A model: X_SCALE 0 (the input is
    a token id) and Y_SCALE the logits' LSB."""
    m = cfg.model
    if m.is_layer_chip:
        return dict(HOST_SCALES)
    if m.vocab == 0:
        return {"X_SCALE": "layers.0.scales.x", "Y_SCALE": f"layers.{m.n_layers - 1}.scales.y"}
    return {"X_SCALE": "-", "Y_SCALE": "scales.logits"}


def param_blocks(cfg) -> list[tuple[str, object, int]]:
    """(name prefix, ParamMap, byte address) of each block of the parameter region
    (hw.image.param_map.model_param_maps), in address order."""
    addr = header_bytes(cfg.hw.weight_port_bytes)
    out = []
    for prefix, pm in model_param_maps(cfg):
        out.append((prefix, pm, addr))
        addr += pm.nbytes
    return out


def _unprefixed(flat: Mapping[str, np.ndarray], prefix: str) -> dict:
    if not prefix:
        return dict(flat)
    return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}


def word_sum(image: bytes) -> int:
    """The 32-bit little-endian words of ``image`` summed modulo 2**32 (length a multiple of 4)."""
    return int(np.frombuffer(image, dtype="<u4").astype(np.uint64).sum() % (1 << 32))


def pack_image(cfg, flat: Mapping[str, np.ndarray], tensors: Mapping[str, np.ndarray]) -> bytes:
    """The whole image from the integer parameters ``flat`` (QLayer.to_flat() names) and the
    weight matrices ``tensors`` (memory-map region names, hw.image.memory_map.qlayer_tensors).
    ValueError naming the field when a value does not fit its field, or when a value the
    config fixes (hw.image.param_map.structural) differs.  With Attention Residuals the layers'
    residual adds are written from ``attn_res.out_m|out_s`` (hw.image.param_map.attn_res_residuals:
    the adds are the outputs' requantisers; the integer model uses nothing else of them).
    ConfigError (one line) for a model the image does not hold (``require_image_model``)."""
    from hw.image.memory_map import build_weights, memory_map
    from moekda.config import require_image_model
    require_image_model(cfg)
    for name, want in model_structural(cfg).items():
        if name in flat and fixed_value_differs(flat[name], want):
            if np.ndim(want):
                raise ValueError(f"parameter {name}: not the table this config fixes (moekda/tables.py: "
                                 "requantise the input to the config's code, then look up its table)")
            raise ValueError(f"parameter {name} = {int(np.asarray(flat[name]))}: this config fixes it to {want}")
    if cfg.model.attn_res != "none":
        for name in ("attn_res.out_m", "attn_res.out_s"):
            if name not in flat:
                raise ValueError(f"parameter {name}: missing (model.attn_res = \"{cfg.model.attn_res}\")")
        flat = {**flat, **attn_res_residuals(cfg, flat)}
    mm = memory_map(cfg)
    lay = image_layout(cfg)
    img = bytearray(lay.length)
    for prefix, pm, addr in param_blocks(cfg):
        try:
            img[addr:addr + pm.nbytes] = pm.pack(_unprefixed(flat, prefix))
        except ValueError as e:
            raise ValueError(str(e).replace("parameter ", f"parameter {prefix}", 1)) from None
    weights = build_weights(cfg, tensors, mm)
    img[mm.base:mm.base + len(weights)] = weights
    header = [MAGIC, VERSION, config_hash_word(cfg), lay.length, 0]
    img[:4 * len(header)] = np.array(header, dtype="<u4").tobytes()
    for word, name in host_scales(cfg).items():
        at = 4 * HEADER_WORDS.index(word)
        img[at:at + 4] = np.array([float(flat.get(name, 0.0))], dtype="<f4").tobytes()
    checksum = (-word_sum(bytes(img))) % (1 << 32)
    img[16:20] = checksum.to_bytes(4, "little")
    return bytes(img)


def check_image(cfg, image: bytes, what: str = "image") -> None:
    """ImageError, one line, if ``image`` is not a good image for ``cfg``."""
    lay = image_layout(cfg)
    if len(image) < HEADER_MIN_BYTES:
        raise ImageError(f"{what}: {len(image)} bytes, shorter than the {HEADER_MIN_BYTES}-byte header (truncated?)")
    magic, version, chash, length, _ = np.frombuffer(image[:20], dtype="<u4").tolist()
    if magic != MAGIC:
        raise ImageError(f"{what}: magic {magic:#010x} is not a moekda image (expected {MAGIC:#010x}, \"MKDI\")")
    if version != VERSION:
        raise ImageError(f"{what}: format version {version}; this moekda reads version {VERSION}")
    if chash != config_hash_word(cfg):
        raise ImageError(f"{what}: made for config hash {chash:08x}, this config ({cfg.name}) is "
                         f"{config_hash_word(cfg):08x}: build the image with the same config")
    if length != len(image):
        raise ImageError(f"{what}: header says {length} bytes, the file has {len(image)} (truncated or padded)")
    if length != lay.length:
        raise ImageError(f"{what}: {length} bytes, config {cfg.name} needs {lay.length}")
    s = word_sum(image)
    if s != 0:
        raise ImageError(f"{what}: bad checksum (the words sum to {s:#010x}, not 0): the file is corrupt")


def read_image(cfg, image: bytes, what: str = "image") -> tuple[dict, dict]:
    """(parameters {dotted name: array}, tensors {region name: int8 matrix}) of a checked image."""
    from hw.image.memory_map import memory_map, read_weights
    check_image(cfg, image, what)
    params = {}
    for prefix, pm, addr in param_blocks(cfg):
        params.update({prefix + k: v for k, v in pm.unpack(image[addr:addr + pm.nbytes]).items()})
    for name, v in model_structural(cfg).items():
        params[name] = np.asarray(v, dtype=np.int64) if np.ndim(v) else np.int64(v)
    if cfg.model.attn_res != "none":
        params.update(attn_res_outputs(cfg, params))
    for word, name in host_scales(cfg).items():
        at = 4 * HEADER_WORDS.index(word)
        value = float(np.frombuffer(image[at:at + 4], dtype="<f4")[0])
        if value > 0:
            params[name] = np.float64(value)
    return params, read_weights(memory_map(cfg), image)
