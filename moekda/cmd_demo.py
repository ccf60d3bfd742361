"""`moekda demo`: a committed trained model on its task, float -> integer -> the chip's RTL.

    moekda demo                                   # train/runs/model-tiny-mqar4, Verilator
    moekda demo --run train/runs/NAME --examples 500 --rtl-examples 8
    moekda demo --netlist                         # also a few tokens on the synthesised netlist (Icarus, slow)

No training framework is needed: the run's ``params.npz`` (float weights) and ``run.json``
(config, task settings, seed) are committed.  The demo draws the task's training and
held-out examples from the run's seed (sim/tasks), quantises the float model on
``--calib-examples`` training examples (sim/models/task_accuracy.py), writes the memory
image, scores the float model and the integer model on ``--examples`` held-out examples,
runs the first ``--rtl-examples`` of them through the chip's RTL (every next token compared
with the integer model's; the chip's own argmax is what is scored), and prints one table:
task accuracy (and bits per token) at float, integer and RTL, the chip's cycles per token
(no stalls) and tokens/s at the synthesised Fmax.  It writes the table and a JSON record
to build/demo/<run>/.
"""
from __future__ import annotations

import json
from pathlib import Path

from moekda.cli import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUN = "train/runs/model-tiny-mqar4"


def configure(p):
    p.add_argument("--run", default=DEFAULT_RUN,
                   help=f"directory of a trained run: params.npz and run.json (default {DEFAULT_RUN})")
    p.add_argument("--examples", type=int, default=200,
                   help="held-out examples scored on the float and integer models (default 200)")
    p.add_argument("--rtl-examples", type=int, default=4,
                   help="of those, how many run through the chip's RTL (default 4; 0: none)")
    p.add_argument("--calib-examples", type=int, default=16,
                   help="training examples the quantiser calibrates on (default 16)")
    p.add_argument("--sim", choices=("verilator", "icarus"), default="verilator",
                   help="RTL simulator (default verilator)")
    p.add_argument("--netlist", action="store_true",
                   help="also run --gl-tokens tokens of the first held-out example on the synthesised "
                        "netlist (build/<cfg>/synth/layer.netlist.v; Icarus, about an hour)")
    p.add_argument("--gl-tokens", type=int, default=4, help="tokens of the gate-level run (default 4)")
    p.add_argument("-o", "--out", default=None, help="output directory (default build/demo/<run name>)")


def _load_run(path: Path) -> tuple[dict, Path]:
    rec_path, params = path / "run.json", path / "params.npz"
    for f in (rec_path, params):
        if not f.is_file():
            raise UserError(f"--run {path}: no {f.name} (a run directory of `python -m train --out DIR`)")
    try:
        rec = json.loads(rec_path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"--run {path}: {rec_path.name} is not JSON ({e.msg}, line {e.lineno})") from None
    for key in ("task", "config", "model", "settings"):
        if key not in rec:
            raise UserError(f"--run {path}: {rec_path.name} has no field {key!r}")
    if rec["task"] != "mqar":
        raise UserError(f"--run {path}: task {rec['task']!r}; allowed is 'mqar'")
    return rec, params


def _fmax(cfg) -> tuple[float | None, str]:
    """The chip's Fmax: this checkout's synthesis if it is of today's Verilog, else the
    committed bench record of the config (which names its commit)."""
    from flow.bench import synth_metrics
    m, why = synth_metrics(cfg)
    if m and m.get("fmax"):
        return float(m["fmax"]), "this checkout's synthesis (build/.../metrics.json)"
    rec = REPO_ROOT / "bench" / "results" / f"{cfg.name}.json"
    if rec.is_file():
        b = json.loads(rec.read_text())
        if b.get("fmax_mhz"):
            return float(b["fmax_mhz"]), f"bench/results/{cfg.name}.json (commit {str(b.get('commit'))[:7]})"
    return None, why


def run(args) -> int:
    from moekda.config import ConfigError, load_config
    from sim.models.params import load_model_params
    from sim.models.task_accuracy import calibrate, float_scores, int_scores, score
    from sim.tasks import mqar

    run_dir = Path(args.run)
    rec, params_file = _load_run(run_dir)
    s = rec["settings"]
    try:
        cfg = load_config(rec["config"])
    except ConfigError as e:
        raise UserError(f"--run {run_dir}: its config: {e}") from None
    if cfg.to_dict()["model"] != rec["model"]:
        raise UserError(f"--run {run_dir}: trained on a [model] of config {cfg.name} that differs from "
                        f"configs/{cfg.name}.toml today; retrain or restore the config")
    if args.config not in ("tiny", cfg.name):
        raise UserError(f"-c {args.config}: the run {run_dir} is of config {cfg.name}")
    held_n = int(s.get("heldout_examples", 0))
    if not 1 <= args.examples <= 100_000:
        raise UserError(f"--examples {args.examples}: allowed range is 1 to 100000")
    if not 0 <= args.rtl_examples <= args.examples:
        raise UserError(f"--rtl-examples {args.rtl_examples}: allowed range is 0 to --examples ({args.examples})")
    if not 1 <= args.calib_examples <= int(s["train_examples"]):
        raise UserError(f"--calib-examples {args.calib_examples}: allowed range is 1 to {s['train_examples']} "
                        f"(the run's training set)")
    if not 1 <= args.gl_tokens <= s["seq_len"]:
        raise UserError(f"--gl-tokens {args.gl_tokens}: allowed range is 1 to {s['seq_len']}")
    out = Path(args.out) if args.out else REPO_ROOT / "build" / "demo" / run_dir.name
    out.mkdir(parents=True, exist_ok=True)

    vocab = s["vocab"] or cfg.model.vocab
    train = mqar.split("train", args.calib_examples, vocab, s["pairs"], s["seq_len"], s["seed"])
    held = mqar.split("heldout", args.examples, vocab, s["pairs"], s["seq_len"], s["seed"])
    print(f"moekda demo: {run_dir} ({cfg.name}, MQAR {s['pairs']} pairs in {s['seq_len']} tokens, "
          f"vocab {vocab}, seed {s['seed']}; held-out set: {args.examples} examples"
          f"{'' if held_n in (0, args.examples) else f', the run evaluated {held_n}'})", flush=True)
    mp = load_model_params(params_file, cfg)
    q = calibrate(mp, cfg, train.inputs)

    from sim.models.image import qmodel_image
    image = qmodel_image(cfg, q)
    (out / "image.bin").write_bytes(image)
    print(f"  quantised on {args.calib_examples} training examples; image {out / 'image.bin'} "
          f"({len(image):,} bytes)", flush=True)
    rows = {}
    print(f"  float model on {args.examples} held-out examples ...", flush=True)
    rows["float"], float_pred = float_scores(mp, cfg, held, args.examples)
    print(f"  integer model on {args.examples} held-out examples ...", flush=True)
    rows["integer"], int_pred = int_scores(q, cfg, held, args.examples)
    rtl = None
    if args.rtl_examples:
        from sim.driver import ModelDriver
        n = args.rtl_examples
        drv = ModelDriver(cfg, q, label=f"demo-{run_dir.name}")
        print(f"  chip RTL ({args.sim}) on the first {n} ({n * s['seq_len']} tokens; builds the "
              f"simulation first) ...", flush=True)
        res, pred = drv.run_sequences(held.inputs[:n], simulator=args.sim, name="demo")
        if not res.match or (pred != int_pred[:n]).any():
            print(res.summary())
            raise UserError(f"the chip's RTL disagrees with the integer model: {res.problems[:1]}")
        rtl = {"match": True, "cycles_per_token": res.cycles_per_token, "tokens": int(res.counters.get("TOKENS", 0)),
               "sim_cycles_per_s": res.cycles_per_s, "wall_s": res.wall_s}
        rows["RTL"] = score(pred, None, held, n)
        rows["integer, same examples"] = score(int_pred[:n], None, held, n)
        rows["float, same examples"] = score(float_pred[:n], None, held, n)
    fmax, fmax_from = _fmax(cfg)
    if rtl and fmax:
        rtl["tokens_per_s_at_fmax"] = fmax * 1e6 / rtl["cycles_per_token"]
    gl = _gate_level(cfg, q, held, args) if args.netlist else None
    table = _table(rows, rtl, fmax, fmax_from, gl)
    print(table)
    record = {"run": str(run_dir), "config": cfg.name, "task": rec["task"], "settings": s,
              "calib_examples": args.calib_examples, "scores": rows, "rtl": rtl, "fmax_mhz": fmax,
              "fmax_from": fmax_from, "gate_level": gl}
    (out / "demo.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "demo.md").write_text(table + "\n")
    print(f"wrote {out / 'demo.md'} and {out / 'demo.json'}")
    return 0


def _gate_level(cfg, q, held, args) -> dict:
    """A few tokens of the first held-out example on the netlist, against the integer model."""
    from flow.paths import BuildPaths
    from sim.driver import ModelDriver, RunPlan
    paths = BuildPaths.for_config(cfg, "layer")
    drv = ModelDriver(cfg, q, label="demo-gl")
    if not paths.netlist.is_file() or not paths.rtl.is_file() or paths.rtl.read_text() != drv.verilog():
        raise UserError(f"--netlist: no netlist of today's Verilog at {paths.netlist} "
                        f"(run `make synth CONFIG={cfg.name}` first)")
    n = args.gl_tokens
    print(f"  gate level: {n} tokens on {paths.netlist} (Icarus; the LOAD of the image first) ...", flush=True)
    plan = RunPlan(tokens=n, stall=False, seed=1)
    res = drv.run(plan, simulator="icarus", xs=held.inputs[0, :n], netlist=paths.netlist, name="demo_gl")
    return {"tokens": n, "match": res.match, "cycles": res.sim_cycles, "wall_s": res.wall_s,
            "first_problem": res.problems[0] if res.problems else None}


def _pct(r: dict) -> str:
    return f"{100 * r['accuracy']:.1f} % ({r['hits']}/{r['scored']})"


def _table(rows, rtl, fmax, fmax_from, gl) -> str:
    lines = ["| model | held-out examples | MQAR accuracy | bits per answer | cycles per token | tokens/s at Fmax |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        b = r.get("bits_per_token")
        cyc = tps = ""
        if name == "RTL" and rtl:
            cyc = f"{rtl['cycles_per_token']:,.0f}"
            tps = f"{rtl['tokens_per_s_at_fmax']:,.0f}" if rtl.get("tokens_per_s_at_fmax") else "no Fmax"
        lines.append(f"| {name} | {r['examples']} | {_pct(r)} | {'' if b is None else f'{b:.3f}'} | {cyc} | {tps} |")
    notes = []
    if rtl:
        notes.append(f"RTL: every next token equal to the integer model's ({rtl['tokens']} tokens, no stalls); "
                     f"{rtl['sim_cycles_per_s']:,.0f} simulated cycles/s")
    notes.append(f"Fmax {fmax:,.0f} MHz from {fmax_from}" if fmax else f"no Fmax: {fmax_from}")
    if gl:
        notes.append(f"gate level: {gl['tokens']} tokens, {'MATCH' if gl['match'] else 'MISMATCH: ' + str(gl['first_problem'])}"
                     f" ({gl['cycles']:,} cycles, {gl['wall_s']:.0f} s)")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes)
