"""`moekda vectors`: export integer parameters, inputs and expected outputs (.npz) for the
cocotb tests and a driver; see model/vectors.py for the layout and the loader."""
from __future__ import annotations

from cli import UserError
from moekda.config import load_config


def configure(p):
    p.add_argument("-n", "--tokens", type=int, default=256, help="sequence length (default 256)")
    p.add_argument("-o", "--out", default=None, help="output directory (default build/<cfg>/vectors)")
    p.add_argument("--param-seed", type=int, default=0,
                   help="seed of the random layer parameters and of the inputs' channel profile "
                        "(calibration and vectors); with --params, only the profile (default 0)")
    p.add_argument("--params", default=None,
                   help="float checkpoint (.npz or .safetensors, names of LayerParams.to_flat) instead of random")
    p.add_argument("--seed", type=int, default=1, help="seed of the input sequence")


def run(args) -> int:
    from pathlib import Path

    from flow.paths import BuildPaths
    from model.vectors import export_vectors

    if not 1 <= args.tokens <= 100_000:
        raise UserError(f"--tokens = {args.tokens}: allowed range is 1 to 100000")
    cfg = load_config(args.config)
    out = Path(args.out) if args.out else BuildPaths.for_config(cfg).root / "vectors"
    qp = None
    if args.params:
        from cli.cmd_accuracy import load_checkpoint
        from model.quantize import quantize_layer
        # a checkpoint has no seed: calibrate on the profile the vectors' inputs are drawn with
        qp = quantize_layer(load_checkpoint(args.params, cfg), cfg, model_seed=args.param_seed)
    paths = export_vectors(cfg, args.tokens, out, param_seed=args.param_seed, seed=args.seed, qp=qp)
    for name, path in paths.items():
        print(f"{name:7s} {path}")
    return 0
