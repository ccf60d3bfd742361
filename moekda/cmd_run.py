"""`moekda run`: a token sequence through the layer chip's simulation and the integer model.

    moekda run -c tiny -n 256 [--sim icarus|verilator] [--waves] [--image FILE | --vectors DIR | --seed N]
               [--netlist FILE]

Prints MATCH or MISMATCH (the first differences), cycles per token and the
chip's CSR counters; exit code 0 on a match, 1 on a mismatch.  The work is
done by sim/driver.py (LayerDriver).
"""
from __future__ import annotations

from moekda.cli import UserError

MAX_TOKENS = 100_000


def configure(p):
    p.add_argument("-n", "--tokens", type=int, default=64, help="tokens to run (default 64)")
    p.add_argument("--sim", choices=("icarus", "verilator"), default="verilator",
                   help="simulator (default verilator; icarus builds faster, runs slower)")
    p.add_argument("--waves", action="store_true",
                   help="record waveforms (FST with Icarus, VCD with Verilator) in the run directory")
    p.add_argument("--vectors", default=None,
                   help="directory from `moekda vectors`: its quantised model and input tokens "
                        "(default: the seeded random layer quantised on the fly); the config is the "
                        "one the vectors were exported for")
    p.add_argument("--image", default=None,
                   help="memory image from `moekda image` (checked against the config): the model the chip LOADs")
    p.add_argument("--seed", type=int, default=0,
                   help="parameter seed when not using --image / --vectors (default 0)")
    p.add_argument("--input-seed", type=int, default=1, help="seed of the input tokens and stalls (default 1)")
    p.add_argument("--no-stall", action="store_true", help="no random stalls (for cycle counts)")
    p.add_argument("--clear-at", type=int, action="append", default=[],
                   help="write CTRL.CLEAR before this token (repeatable)")
    p.add_argument("--reset-at", type=int, default=None,
                   help="reset the chip with this token and the next inside; streaming resumes after them")
    p.add_argument("--netlist", default=None,
                   help="simulate this gate-level netlist (Icarus + the kit's cell models) instead of the RTL")


def run(args) -> int:
    from pathlib import Path

    import numpy as np

    from sim.driver import LayerDriver, RunPlan

    if not 1 <= args.tokens <= MAX_TOKENS:
        raise UserError(f"--tokens = {args.tokens}: allowed range is 1 to {MAX_TOKENS}")
    for c in args.clear_at:
        if not 1 <= c < args.tokens:
            raise UserError(f"--clear-at = {c}: allowed range is 1 to {args.tokens - 1}")
    if args.reset_at is not None and not 1 <= args.reset_at <= args.tokens - 3:
        raise UserError(f"--reset-at = {args.reset_at}: allowed range is 1 to {args.tokens - 3}")
    netlist = None
    if args.netlist:
        netlist = Path(args.netlist)
        if not netlist.is_file():
            raise UserError(f"--netlist {netlist}: no such file (run `moekda synth -c {args.config} --top layer`)")
        if args.sim != "icarus":
            raise UserError("--netlist: gate-level simulation runs on Icarus only (add --sim icarus)")

    xs = None
    first = (0,)
    if args.image and args.vectors:
        raise UserError("--image and --vectors: give one model")
    if args.image:
        from hw.image.format import ImageError
        try:
            drv = LayerDriver.from_image(args.config, args.image)
        except ImageError as e:
            raise UserError(str(e)) from None
    elif args.vectors:
        from sim.models.vectors import load_vectors
        try:     # the readers' ValueError is one line naming the damaged file
            drv = LayerDriver.from_vectors(args.vectors)
            layer = load_vectors(Path(args.vectors))["layer"]
        except (FileNotFoundError, ValueError) as e:
            raise UserError(f"--vectors: {e}") from None
        x, resets = layer.get("x"), layer.get("resets")
        where = Path(args.vectors) / "layer.npz"
        if x is None or resets is None:
            raise UserError(f"--vectors: {where}: needs arrays x and resets (export with `moekda vectors`)")
        if x.dtype.kind not in "iu" or x.ndim != 2 or x.shape[1] != drv.cfg.model.d_model:
            raise UserError(f"--vectors: {where}: x is {x.dtype} of shape {x.shape}, the config needs "
                            f"integers of shape (tokens, {drv.cfg.model.d_model})")
        if resets.dtype.kind not in "biu" or resets.shape != (len(x),):
            raise UserError(f"--vectors: {where}: resets is {resets.dtype} of shape {resets.shape}, "
                            f"needs one flag per token ({len(x)},)")
        if args.tokens > len(x):
            raise UserError(f"--tokens = {args.tokens}: {args.vectors} holds only {len(x)} tokens")
        xs = x[:args.tokens]
        first = tuple(int(t) for t in np.flatnonzero(resets[:args.tokens])) or (0,)
    else:
        drv = LayerDriver.from_seed(args.config, args.seed)
    plan = RunPlan(tokens=args.tokens, first=first, clears=tuple(args.clear_at), reset_at=args.reset_at,
                   stall=not args.no_stall, seed=args.input_seed)
    print(f"moekda run: {drv.cfg.name}, {args.tokens} tokens, {args.sim}"
          f"{', gate level ' + str(netlist) if netlist else ''}{', waves' if args.waves else ''}", flush=True)
    res = drv.run(plan, simulator=args.sim, xs=xs, waves=args.waves, netlist=netlist, name="cli")
    print(res.summary())
    for p in res.problems[1:10]:
        print(f"  {p}")
    return 0 if res.match else 1
