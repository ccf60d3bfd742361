"""`moekda context`: cycles and bytes per token of each layer kind as the context grows, and the
cache the hybrid keeps against an all-MLA model -> bench/results/context-<cfg>.{json,md,png}

    moekda context -c model-tiny-hybrid [--tokens 4096] [--seed 0] [--out DIR] [--no-rtl]

The cost of a KDA and of a Gated MLA token mixer on the config's datapath at contexts 16, 256,
1024, 4096 (the units' bound: MAC lanes, weight and cache ports, softmax, state lanes) and, for
MLA, the MLA unit's RTL measured at each context (its cache restored); the integer model run over --tokens
tokens measures what it keeps at each context and its logits against the float model's; for a
hybrid, the same model with every layer MLA measures the cache saving.  Code: studies/context.py;
docs/bench.md explains the numbers.
"""
from __future__ import annotations

from pathlib import Path

from cli import UserError
from moekda.config import load_config

MIN_TOKENS = 16
MAX_TOKENS = 16_384     # the MLA model is O(T^2) in numpy: 4096 tokens take minutes


def configure(p):
    p.add_argument("--tokens", type=int, default=4096,
                   help="tokens of the integer model's run (default 4096: reaches every context of the sweep)")
    p.add_argument("--seed", type=int, default=0, help="model and token seed (default 0)")
    p.add_argument("--out", type=Path, default=None, help="results directory (default bench/results/)")
    p.add_argument("--no-rtl", action="store_true",
                   help="leave out the MLA unit's RTL measurement (an Icarus build and run: about a minute)")


def run(args) -> int:
    from studies import context
    from flow.provenance import provenance

    cfg = load_config(args.config)
    if cfg.model.vocab == 0:
        raise UserError(f"config {cfg.name}: model.vocab = 0; the context sweep runs a model (a config with a "
                        f"vocabulary, for example model-tiny-hybrid)")
    if not MIN_TOKENS <= args.tokens <= MAX_TOKENS:
        raise UserError(f"--tokens = {args.tokens}: allowed range is {MIN_TOKENS} to {MAX_TOKENS}")
    if not 0 <= args.seed < 2**31:
        raise UserError(f"--seed = {args.seed}: allowed range is 0 to 2**31 - 1")
    print(f"moekda context: {cfg.name}, {args.tokens} tokens on the integer model", flush=True)
    rec = context.sweep(cfg, args.tokens, args.seed, progress=lambda s: print("  " + s, flush=True),
                        rtl=not args.no_rtl)
    rec.update(provenance(f"moekda context -c {args.config} --tokens {args.tokens} --seed {args.seed}"
                          + (" --no-rtl" if args.no_rtl else "")))
    j, md, png = context.write(rec, args.out or context.RESULTS_DIR)
    print(md.read_text())
    print(f"wrote {j}, {md} and {png}")
    return 0
