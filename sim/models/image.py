"""Models to memory images and back: the quantiser's output as the chip's data.

    model (float LayerParams or integer QLayer) -> quantiser -> QLayer -> image bytes

The image format, its header and its checks are hw/image_format.py; this
module only connects it to the models (sim/ may use hw/, never the reverse).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hw.image_format import ImageError, pack_image, read_image
from hw.memory_map import qlayer_tensors, tensors_flat
from moekda.config import Config
from sim.models.qparams import QLayer


def qlayer_image(cfg: Config, q: QLayer) -> bytes:
    """The chip's memory image of a quantised layer."""
    return pack_image(cfg, q.to_flat(), qlayer_tensors(q))


def qlayer_from_image(cfg: Config, image: bytes, what: str = "image") -> QLayer:
    """The quantised layer an image holds (checked: ImageError if it is not for ``cfg``).
    The tensor scales are not in the image (the chip does not need them): ``scales`` is empty."""
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
    import zipfile

    from sim.models.params import load_params
    from sim.models.quantize import quantize_layer
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        if path.suffix == ".npz":
            with np.load(path) as z:
                flat = {k: z[k] for k in z.files}
            if "kda.q_proj.m" in flat:
                return QLayer.from_flat(flat)
        return quantize_layer(load_params(path, cfg), cfg)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ValueError(f"{path}: not a readable .npz ({e})") from None
    except KeyError as e:
        raise ValueError(f"{path}: {e.args[0] if e.args else e}") from None
