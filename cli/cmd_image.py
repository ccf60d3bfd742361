"""`moekda image`: the memory image of a quantised model, for the chip's LOAD step.

    moekda image -c tiny --seed 3 -o build/tiny/seed3.img
    moekda image -c tiny --params trained.safetensors -o model.img
    moekda image -c tiny --check model.img

The image (format: hw/image/format.py, docs/chip.md) is a header (magic,
format version, config hash, length, checksum), the parameter region and
the weight matrices: exactly what the weight memory holds.  --params takes
float parameters (.npz / .safetensors, quantised here) or integer ones (an
.npz of QLayer names, as `moekda vectors` writes params.npz).  --check reads
an image and says whether it is good for the config (exit 0) or what is
wrong (one line, exit 2).
"""
from __future__ import annotations

from pathlib import Path

from cli import UserError


def configure(p):
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--seed", type=int, help="the seeded random layer (model/params.py)")
    src.add_argument("--params", help="parameter file: float (.npz, .safetensors) or integer (.npz)")
    src.add_argument("--check", metavar="IMAGE", help="check an image against the config and print its layout")
    p.add_argument("--calib-seed", type=int, default=0,
                   help="with float --params: channel profile of the calibration sequences (default 0)")
    p.add_argument("-o", "--output", help="image file to write (required with --seed / --params)")


def run(args) -> int:
    from hw.image.format import ImageError, image_layout
    from moekda.config import load_config

    cfg = load_config(args.config)
    lay = image_layout(cfg)
    if args.check:
        from model.image import qmodel_from_image, read_image_file
        try:
            if cfg.model.is_layer_chip:
                read_image_file(cfg, args.check)
            else:
                try:
                    raw = Path(args.check).read_bytes()
                except OSError as e:
                    raise ImageError(f"image {args.check}: {e.strerror}") from None
                qmodel_from_image(cfg, raw, f"image {args.check}")
        except ImageError as e:
            raise UserError(str(e)) from None
        print(f"moekda image: {args.check}: good image for {cfg.name} (config hash {cfg.hash()[:8]}), "
              f"{lay.length} bytes: header {lay.header_bytes}, parameters {lay.params_bytes} at "
              f"{lay.params_addr:#x}, matrices from {lay.weights_base:#x}")
        return 0
    if not args.output:
        raise UserError("-o/--output: needed with --seed or --params")
    if args.seed is not None and args.seed < 0:
        raise UserError(f"--seed = {args.seed}: allowed range is 0 or more")
    image = _layer_image(cfg, args) if cfg.model.is_layer_chip else _model_image(cfg, args)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(image)
    layers = "" if cfg.model.is_layer_chip else f", {cfg.model.n_layers} layers"
    print(f"moekda image: {out}: {len(image)} bytes for {cfg.name} (config hash {cfg.hash()[:8]}){layers}; "
          f"parameters {lay.params_bytes} bytes, matrices {lay.length - lay.weights_base} bytes")
    return 0


def _layer_image(cfg, args) -> bytes:
    """The layer chip: the seeded random layer, or a float layer file quantised here."""
    from model.image import model_from_file, qlayer_image
    if args.params:
        try:
            q = model_from_file(cfg, args.params, model_seed=args.calib_seed)
        except ValueError as e:
            raise UserError(f"--params {e}") from None
    else:
        from model.quantize import quantize_random_layer
        q = quantize_random_layer(cfg, args.seed)
    try:
        return qlayer_image(cfg, q)
    except (ValueError, KeyError) as e:
        raise UserError(f"{args.params or 'model'}: {e}") from None


def _model_image(cfg, args) -> bytes:
    """A model config (issue 14): the image of the seeded random model, or of a float model
    file (ModelParams names, quantised here on calibration tokens of --calib-seed's language)."""
    from model.image import qmodel_image
    from model.quantize import quantize_model, quantize_random_model
    if args.params:
        from model.params import load_model_params
        try:
            qm = quantize_model(load_model_params(args.params, cfg), cfg, model_seed=args.calib_seed)
        except ValueError as e:
            raise UserError(f"--params {e}") from None
    else:
        qm = quantize_random_model(cfg, args.seed)
    try:
        return qmodel_image(cfg, qm)
    except (ValueError, KeyError) as e:
        raise UserError(f"{args.params or 'model'}: {e}") from None
