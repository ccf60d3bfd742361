"""`moekda run`: a token sequence through the chip's simulation and the integer model.

    moekda run -c tiny -n 256 [--sim icarus|verilator] [--waves] [--image FILE | --vectors DIR | --seed N]
               [--netlist FILE]
    moekda run -c model-tiny --image FILE --prompt-ids 5 17 3 -n 16     # generate 16 ids on the chip
    moekda run -c model-tiny --prompt-file ids.txt -n 16

Prints MATCH or MISMATCH (the first differences), cycles per token and the
chip's CSR counters; exit code 0 on a match, 1 on a mismatch.  On a model
config (hw/chip/model.py) a prompt is streamed through the chip and every id it
generates is fed back as its next input (greedy decoding on the chip); the ids
are printed beside the integer model's.  Without a prompt, random token ids
are run as for the layer chip.  The work is done by run/driver.py
(LayerDriver, ModelDriver).
"""
from __future__ import annotations

from cli import UserError

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
    p.add_argument("--prompt-ids", nargs="+", default=None, metavar="ID",
                   help="model configs: token ids of the prompt (spaces or commas); -n is then the "
                        "number of ids to generate")
    p.add_argument("--prompt-file", default=None,
                   help="model configs: a text file of prompt token ids (whitespace or commas)")
    p.add_argument("--netlist", default=None,
                   help="simulate this gate-level netlist (Icarus + the kit's cell models) instead of the RTL")


def run(args) -> int:
    from pathlib import Path

    import numpy as np

    from run.driver import LayerDriver, RunPlan

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

    from moekda.config import load_config
    cfg = load_config(args.config)
    if not cfg.model.is_layer_chip:
        return _run_model(args, cfg, netlist)
    if args.prompt_ids or args.prompt_file:
        raise UserError(f"--prompt-ids/--prompt-file: config {cfg.name} is a layer chip (residual streams, "
                        "no vocabulary); use a model config, e.g. -c model-tiny")

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
        from model.vectors import load_vectors
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


def prompt_ids(args, vocab: int) -> list[int] | None:
    """The prompt from --prompt-ids or --prompt-file, each id checked against the vocabulary."""
    from pathlib import Path
    if args.prompt_ids and args.prompt_file:
        raise UserError("--prompt-ids and --prompt-file: give one prompt")
    if args.prompt_file:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise UserError(f"--prompt-file {path}: no such file")
        words, what = path.read_text().replace(",", " ").split(), f"--prompt-file {path}"
    elif args.prompt_ids:
        words, what = " ".join(args.prompt_ids).replace(",", " ").split(), "--prompt-ids"
    else:
        return None
    if not words:
        raise UserError(f"{what}: no token ids")
    out = []
    for w in words:
        try:
            v = int(w)
        except ValueError:
            raise UserError(f"{what}: {w!r} is not a token id (integers 0 to {vocab - 1})") from None
        if not 0 <= v < vocab:
            raise UserError(f"{what}: token id {v}: allowed range is 0 to {vocab - 1} (model.vocab)")
        out.append(v)
    return out


def _run_model(args, cfg, netlist) -> int:
    from moekda.config import require_chip_model
    from run.driver import ModelDriver, RunPlan
    require_chip_model(cfg)     # a model the chip does not build: its one line before any progress line
    if args.vectors:
        raise UserError(f"--vectors: a layer chip's export; config {cfg.name} is a model (use --image or --seed)")
    if args.image:
        from hw.image.format import ImageError
        try:
            drv = ModelDriver.from_image(args.config, args.image)
        except ImageError as e:
            raise UserError(str(e)) from None
    else:
        drv = ModelDriver.from_seed(args.config, args.seed)
    prompt = prompt_ids(args, cfg.model.vocab)
    if prompt is None:
        plan = RunPlan(tokens=args.tokens, clears=tuple(args.clear_at), reset_at=args.reset_at,
                       stall=not args.no_stall, seed=args.input_seed)
        print(f"moekda run: {cfg.name} (model chip), {args.tokens} random token ids, {args.sim}", flush=True)
        res = drv.run(plan, simulator=args.sim, waves=args.waves, netlist=netlist, name="cli")
        print(res.summary())
        for p in res.problems[1:10]:
            print(f"  {p}")
        return 0 if res.match else 1
    if args.clear_at or args.reset_at is not None:
        raise UserError("--clear-at/--reset-at: not with a prompt (generation is one sequence)")
    if netlist is not None:
        raise UserError("--netlist: generation runs on the RTL (a gate-level run: without --prompt-ids)")
    print(f"moekda run: {cfg.name} (model chip), prompt of {len(prompt)} ids, generating {args.tokens}, "
          f"{args.sim}", flush=True)
    res, got, want = drv.generate(prompt, args.tokens, simulator=args.sim, stall=not args.no_stall,
                                  seed=args.input_seed)
    print(f"prompt:              {' '.join(map(str, prompt))}")
    print(f"generated (chip):    {' '.join(map(str, got))}")
    print(f"integer model:       {' '.join(map(str, want))}")
    print(res.summary())
    for p in res.problems[1:10]:
        print(f"  {p}")
    return 0 if res.match and got == want else 1
