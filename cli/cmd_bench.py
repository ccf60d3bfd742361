"""`moekda bench`: measured cycles, roofline, synthesis figures -> bench/results/<cfg>.json + .md

    moekda bench -c tiny [--tokens 4096] [--speed-tokens 4 | 0] [--synth] [--out DIR] [--no-rules]

One stall-free Verilator run of --tokens tokens (checked bit for bit against the
integer model) gives cycles per token, the per-token cycles at contexts 16
and 4096 and Verilator's speed; a short run of --speed-tokens on the other
simulator (Icarus) gives its speed (0: no such run; Icarus simulates
model-small at about 9 cycles/s, 2 h for its LOAD and one token); the
chip top's metrics.json (from `moekda synth`, run first with --synth) gives
Fmax, area and power.  The record is then checked against the config's committed metric
rules (bench/rules/<config>.json, flow/rules.py): a violated rule fails the command (exit 1).
docs/bench.md explains every number.
"""
from __future__ import annotations

from pathlib import Path

from cli import UserError
from moekda.config import load_config

MIN_TOKENS = 16         # below bench.MIN_TOKENS (1024) the summary says the run is short
MAX_TOKENS = 100_000


def configure(p):
    p.add_argument("--tokens", type=int, default=4096,
                   help="tokens of the long Verilator run (default 4096: reaches context 4096; issue 9 asks >= 1024)")
    p.add_argument("--speed-tokens", type=int, default=4,
                   help="tokens of the short run that times the other simulator (default 4: Icarus "
                        "simulates small at a few hundred cycles/s; 0: no speed run, the record "
                        "then has no row for that simulator)")
    p.add_argument("--synth", action="store_true",
                   help="run `moekda synth` first when the chip top's metrics.json is missing or stale")
    p.add_argument("--sim", choices=("verilator", "icarus"), default="verilator",
                   help="simulator of the long run (default verilator)")
    p.add_argument("--out", type=Path, default=None, help="results directory (default bench/results/)")
    p.add_argument("--no-rules", action="store_true",
                   help="do not check the record against the config's metric rules (bench/rules/<config>.json; "
                        "a violated rule otherwise fails the command, exit 1)")


def run(args) -> int:
    import subprocess
    import sys

    from studies import bench
    from hw import cost

    cfg = load_config(args.config)
    if not MIN_TOKENS <= args.tokens <= MAX_TOKENS:
        raise UserError(f"--tokens = {args.tokens}: allowed range is {MIN_TOKENS} to {MAX_TOKENS}")
    if not 0 <= args.speed_tokens <= 1024:
        raise UserError(f"--speed-tokens = {args.speed_tokens}: allowed range is 0 (no speed run) to 1024")

    synth, note = bench.synth_metrics(cfg)
    if synth is None and args.synth:
        print(f"moekda bench: {note}; running synth", flush=True)
        rc = subprocess.call([sys.executable, "-m", "cli", "synth", "-c", args.config])
        if rc:
            raise UserError(f"moekda synth -c {args.config} failed (exit {rc}); see build/{cfg.name}/logs/")
        synth, note = bench.synth_metrics(cfg)

    tr = cost.traffic(cfg)
    print(f"moekda bench: {cfg.name}: roofline {tr.bound:.1f} cycles/token ({tr.bound_by})", flush=True)
    print(f"  long run: {args.tokens} tokens on {args.sim}", flush=True)
    long_run = bench.simulate(args.config, args.tokens, args.sim)
    print(f"  {long_run['sim_cycles']:,} cycles in {long_run['sim_s']:.0f} s "
          f"({long_run['cycles_per_s']:,.0f} cycles/s)", flush=True)
    # the long run times its own simulator; a short run times the other one
    speed = {args.sim: long_run}
    other = "icarus" if args.sim == "verilator" else "verilator"
    if args.speed_tokens:
        print(f"  speed run: {args.speed_tokens} tokens on {other}", flush=True)
        speed[other] = bench.simulate(args.config, args.speed_tokens, other)
    synth, note = bench.synth_metrics(cfg)     # read again: a synthesis may have finished meanwhile
    pnr, pnr_note = bench.pnr_figures(cfg)
    rec = bench.assemble(cfg, tr, long_run, speed, synth, note, pnr, pnr_note)
    from flow.provenance import provenance
    # every option that changes the record (--out only moves it)
    rec.update(provenance(f"moekda bench -c {args.config} --tokens {args.tokens} --speed-tokens "
                          f"{args.speed_tokens} --sim {args.sim}" + (" --synth" if args.synth else "")))
    j, md = bench.write(rec, args.out or bench.RESULTS_DIR)
    print(md.read_text())
    print(f"wrote {j} and {md}")
    if args.no_rules:
        return 0
    # the record against the committed rules (flow/rules.py): a regression fails `make bench`
    from flow import rules
    return rules.report(cfg.name, rec, record_file=j, prog="moekda bench", missing_ok=True)
