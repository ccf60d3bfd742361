"""`moekda demo`: committed trained models on their tasks, float -> integer -> the chip's RTL.

    moekda demo                       # the committed runs: MQAR on model-tiny, characters on model-small
    moekda demo --run train/runs/model-tiny-mqar4 --examples 500 --rtl-examples 8
    moekda demo --netlist             # also a few tokens on the synthesised netlist (Icarus, slow)

No training framework is needed: each run's ``params.npz`` (float weights) and ``run.json``
(config, task, settings, seed) are committed.  Per run, the demo draws the task's training
and held-out examples from the run's settings (model/tasks), quantises the float model on
``--calib-examples`` training examples (model/task_accuracy.py), writes the memory
image, scores the float model and the integer model on the held-out examples, runs a few
of them through the chip's RTL (every next token compared with the integer model's; the
chip's own argmax is what is scored), and prints one table: next-token accuracy and bits
per scored token (MQAR's answers; every character of a text) at float, integer and RTL,
the chip's cycles per token (no stalls) and tokens/s at the synthesised Fmax.  It writes
the table and a JSON record to build/demo/, each run's image to build/demo/<run>/.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from cli import UserError

REPO_ROOT = Path(__file__).resolve().parents[1]

# the committed runs `make demo` shows, and per task: held-out examples on the float and
# integer models, of them on the RTL, tokens of each on the RTL (0: whole examples)
DEFAULT_RUNS = ("train/runs/model-tiny-mqar4", "train/runs/model-small-chars")
TASK_DEFAULTS = {"mqar": (200, 4, 0), "chars": (32, 3, 16)}
# the chip whose RTL runs a model of this config by default: the same [model] with its KDA
# state in SRAM macros builds and simulates several times faster than 400k state flip-flops
FAST_CHIP = {"model-small": "model-small-sram"}


def configure(p):
    p.add_argument("--run", action="append", default=None,
                   help="directory of a trained run: params.npz and run.json (repeat for several; default "
                        + ", ".join(DEFAULT_RUNS) + ")")
    p.add_argument("--examples", type=int, default=None,
                   help="held-out examples scored on the float and integer models (default: "
                        + ", ".join(f"{t} {d[0]}" for t, d in TASK_DEFAULTS.items()) + ")")
    p.add_argument("--rtl-examples", type=int, default=None,
                   help="of those, how many run through the chip's RTL (default: "
                        + ", ".join(f"{t} {d[1]}" for t, d in TASK_DEFAULTS.items()) + "; 0: none)")
    p.add_argument("--rtl-tokens", type=int, default=None,
                   help="tokens of each RTL example (a prefix; default: "
                        + ", ".join(f"{t} {d[2] or 'the whole example'}" for t, d in TASK_DEFAULTS.items()) + ")")
    p.add_argument("--chip", default=None,
                   help="config of the chip whose RTL runs the model: one with the run's [model] (default: the "
                        "run's config; model-small runs on model-small-sram)")
    p.add_argument("--logits", action="store_true",
                   help="on the RTL, compare every logit with the integer model's, not only the next token")
    p.add_argument("--calib-examples", type=int, default=16,
                   help="training examples the quantiser calibrates on (default 16)")
    p.add_argument("--sim", choices=("verilator", "icarus"), default="verilator",
                   help="RTL simulator (default verilator)")
    p.add_argument("--netlist", action="store_true",
                   help="also run --gl-tokens tokens of the first held-out example on the synthesised "
                        "netlist (build/<cfg>/synth/layer.netlist.v; Icarus, about an hour)")
    p.add_argument("--gl-tokens", type=int, default=4, help="tokens of the gate-level run (default 4)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also plot bits per scored token against the position in the sequence (context)")
    p.add_argument("-o", "--out", default=None, help="output directory (default build/demo)")


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
    from model.tasks import TASKS
    if rec["task"] not in TASKS:
        raise UserError(f"--run {path}: task {rec['task']!r}; allowed are {', '.join(TASKS)}")
    return rec, params


def _fmax(cfg) -> tuple[float | None, str]:
    """The chip's Fmax: this checkout's synthesis if it is of today's Verilog, else the
    committed bench record of the config (which names its commit)."""
    from studies.bench import synth_metrics
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
    runs = args.run or [r for r in DEFAULT_RUNS if (REPO_ROOT / r / "run.json").is_file()]
    out = Path(args.out) if args.out else REPO_ROOT / "build" / "demo"
    preps = [prepare(Path(r), args, out / Path(r).name) for r in runs]
    if args.netlist and not any(p["netlist"] for p in preps):
        # GL=1 runs the netlist of every chip that has one; with none synthesised, say so first
        raise UserError(preps[0]["no_netlist"] if len(preps) == 1 else
                        "--netlist: none of the runs' chips has a netlist of today's Verilog ("
                        + "; ".join(p["no_netlist"].removeprefix("--netlist: ") for p in preps) + ")")
    # The chips' RTL (the chip's Verilog, a Verilator build, then the simulation) runs beside
    # the numpy float and integer models: on 2 cores that is what keeps `make demo` short.
    # Processes, not threads: generating the Verilog is pure Python, and in threads it took
    # turns with the models under one interpreter lock (the models ran 6x slower).
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(max_workers=max(1, len(preps)), mp_context=multiprocessing.get_context("fork")) as pool:
        jobs = [pool.submit(rtl_job, p, args) if p["n_rtl"] else None for p in preps]
        results = [finish(p, j, args) for p, j in zip(preps, jobs)]
    table = _table(results)
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.md").write_text(table + "\n")
    (out / "demo.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out / 'demo.md'} and {out / 'demo.json'}")
    if args.plot:
        _plot(results, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


def _plot(results: list[dict], png: Path) -> None:
    """Bits per scored token against the position in the sequence, float and integer, per run
    (a text model's bits per character against its context; MQAR's answers where queried)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(4.6 * len(results), 3.4), squeeze=False)
    for ax, r in zip(axes[0], results):
        for name, style in (("float", "-"), ("integer", "--")):
            by = r["scores"][name].get("bits_by_position") or []
            pts = [(t + 1, b) for t, b in enumerate(by) if b is not None]
            if pts:
                ax.plot([t for t, _ in pts], [b for _, b in pts], style, label=f"{name} ({r['scores'][name]['bits_per_token']:.3f})")
        ax.set_xlabel("context: tokens seen")
        ax.set_ylabel("bits per scored token")
        ax.set_title(f"{r['task']} on {r['config']} ({r['scores']['float']['examples']} held-out)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def prepare(run_dir: Path, args, out: Path) -> dict:
    """Check the run and the options, quantise on training examples, write the image."""
    from moekda.config import ConfigError, load_config
    from model.params import load_model_params
    from model.task_accuracy import calibrate
    from model.tasks import splits

    rec, params_file = _load_run(run_dir)
    s, task = rec["settings"], rec["task"]
    try:
        cfg = load_config(rec["config"])
    except ConfigError as e:
        raise UserError(f"--run {run_dir}: its config: {e}") from None
    if cfg.to_dict()["model"] != rec["model"]:
        raise UserError(f"--run {run_dir}: trained on a [model] of config {cfg.name} that differs from "
                        f"configs/{cfg.name}.toml today; retrain or restore the config")
    if args.config not in ("tiny", cfg.name):
        raise UserError(f"-c {args.config}: the run {run_dir} is of config {cfg.name}")
    chip = cfg
    chip_name = args.chip or FAST_CHIP.get(cfg.name, cfg.name)
    if chip_name != cfg.name:
        try:
            chip = load_config(chip_name)
        except ConfigError as e:
            raise UserError(f"--chip: {e}") from None
        if chip.to_dict()["model"] != cfg.to_dict()["model"]:
            raise UserError(f"--chip {chip_name}: its [model] differs from the run's ({cfg.name}); allowed is a "
                            f"config with the same model")
    d_ex, d_rtl, d_tok = TASK_DEFAULTS[task]
    n_ex = d_ex if args.examples is None else args.examples
    n_rtl = min(d_rtl, n_ex) if args.rtl_examples is None else args.rtl_examples
    n_tok = (d_tok if args.rtl_tokens is None else args.rtl_tokens) or s["seq_len"]
    if not 1 <= n_ex <= 100_000:
        raise UserError(f"--examples {n_ex}: allowed range is 1 to 100000")
    if not 0 <= n_rtl <= n_ex:
        raise UserError(f"--rtl-examples {n_rtl}: allowed range is 0 to --examples ({n_ex})")
    if not 1 <= n_tok <= s["seq_len"]:
        raise UserError(f"--rtl-tokens {n_tok}: allowed range is 1 to {s['seq_len']} (the run's seq_len)")
    if not 1 <= args.calib_examples <= int(s["train_examples"]):
        raise UserError(f"--calib-examples {args.calib_examples}: allowed range is 1 to {s['train_examples']} "
                        f"(the run's training set)")
    if not 1 <= args.gl_tokens <= s["seq_len"]:
        raise UserError(f"--gl-tokens {args.gl_tokens}: allowed range is 1 to {s['seq_len']}")
    netlist, no_netlist = None, None          # checked before the long steps
    if args.netlist:
        try:
            netlist = _netlist(chip)
        except UserError as e:
            no_netlist = str(e)
    out.mkdir(parents=True, exist_ok=True)

    vocab, train, held = splits(task, s, cfg.model.vocab, args.calib_examples, n_ex)
    notes = []
    if task == "chars":
        from model.tasks.chars import corpus_differences
        diff = corpus_differences(rec["corpus"]) if "corpus" in rec else ["no corpus record"]
        if diff:
            notes.append(f"{len(diff)} of the run's {len(rec.get('corpus', {}).get('files', []))} corpus files "
                         f"differ on this machine's Python (the run's: {rec.get('corpus', {}).get('python')}); "
                         f"first: {diff[0]}")
    what = (f"MQAR {s['pairs']} pairs in {s['seq_len']} tokens, vocab {vocab}" if task == "mqar"
            else f"characters of the standard library, windows of {s['seq_len']}")
    print(f"moekda demo: {run_dir} ({cfg.name}, {what}, seed {s['seed']}; {n_ex} held-out examples)", flush=True)
    mp = load_model_params(params_file, cfg)
    q = calibrate(mp, cfg, train.inputs)

    from model.image import qmodel_image
    image = qmodel_image(chip, q)      # the image of the chip the demo runs (its hash is the chip config's)
    (out / "image.bin").write_bytes(image)
    print(f"  quantised on {args.calib_examples} training examples; image {out / 'image.bin'} "
          f"({len(image):,} bytes, for -c {chip.name})", flush=True)
    if no_netlist:
        notes.append("no gate-level run: " + no_netlist.removeprefix("--netlist: "))
    return {"run_dir": run_dir, "rec": rec, "s": s, "task": task, "cfg": cfg, "chip": chip, "mp": mp, "q": q,
            "held": held, "n_ex": n_ex, "n_rtl": n_rtl, "n_tok": n_tok, "netlist": netlist,
            "no_netlist": no_netlist, "notes": notes,
            "what": what, "out": out}


def rtl_job(p: dict, args):
    """The first n_rtl held-out examples (n_tok tokens each) on the chip's RTL."""
    from run.driver import ModelDriver
    drv = ModelDriver(p["chip"], p["q"], label=f"demo-{p['run_dir'].name}")
    part = _prefix(p["held"], p["n_rtl"], p["n_tok"])
    print(f"  [{p['run_dir'].name}] chip RTL ({p['chip'].name}, {args.sim}) on {p['n_rtl']} held-out examples, "
          f"{p['n_tok']} tokens each{', every logit compared' if args.logits else ''} (builds the simulation "
          f"first) ...", flush=True)
    t0 = time.time()
    res, pred = drv.run_sequences(part.inputs, simulator=args.sim, name=f"demo_{p['run_dir'].name}",
                                  logits=args.logits)
    print(f"  [{p['run_dir'].name}] chip RTL done in {time.time() - t0:.0f} s", flush=True)
    return res, pred, part


def finish(p: dict, job, args) -> dict:
    """Score the float and integer models, then check and score the chip's run."""
    from model.task_accuracy import float_scores, int_scores, score
    name, held, n_ex, n_rtl, chip = p["run_dir"].name, p["held"], p["n_ex"], p["n_rtl"], p["chip"]
    rows = {}
    t0 = time.time()
    print(f"  [{name}] float model on {n_ex} held-out examples ...", flush=True)
    rows["float"], float_pred = float_scores(p["mp"], p["cfg"], held, n_ex)
    print(f"  [{name}] integer model on {n_ex} held-out examples ...", flush=True)
    rows["integer"], int_pred = int_scores(p["q"], p["cfg"], held, n_ex)
    print(f"  [{name}] float and integer models done in {time.time() - t0:.0f} s", flush=True)
    rtl = None
    if job is not None:
        res, pred, part = job.result()
        if not res.match or (pred != int_pred[:n_rtl, :p["n_tok"]]).any():
            print(res.summary())
            raise UserError(f"the chip's RTL disagrees with the integer model: {res.problems[:1]}")
        rtl = {"match": True, "chip": chip.name, "logits_compared": args.logits,
               "cycles_per_token": res.cycles_per_token, "tokens": int(res.counters.get("TOKENS", 0)),
               "sim_cycles_per_s": res.cycles_per_s, "wall_s": res.wall_s}
        rows["RTL"] = score(pred, None, part, n_rtl)
        rows["integer, same tokens"] = score(int_pred[:n_rtl, :p["n_tok"]], None, part, n_rtl)
        rows["float, same tokens"] = score(float_pred[:n_rtl, :p["n_tok"]], None, part, n_rtl)
    fmax, fmax_from = _fmax(chip)
    if rtl and fmax:
        rtl["tokens_per_s_at_fmax"] = fmax * 1e6 / rtl["cycles_per_token"]
    gl = _gate_level(chip, p["q"], held, args, p["netlist"]) if p["netlist"] else None
    return {"run": str(p["run_dir"]), "config": p["cfg"].name, "task": p["task"], "what": p["what"],
            "settings": p["s"], "calib_examples": args.calib_examples, "scores": rows, "rtl": rtl,
            "fmax_mhz": fmax, "fmax_from": fmax_from, "gate_level": gl, "notes": p["notes"],
            "image": str(p["out"] / "image.bin")}


def _prefix(data, n: int, t: int):
    """The first t tokens of the first n examples (a causal model's outputs on a prefix are
    its outputs on the whole example's first t tokens)."""
    from types import SimpleNamespace
    return SimpleNamespace(inputs=data.inputs[:n, :t], targets=data.targets[:n, :t], mask=data.mask[:n, :t])


def _netlist(chip) -> Path:
    """The chip's synthesised netlist, if it is of today's Verilog (else one line: synthesise)."""
    from studies.bench import chip_verilog
    from flow.paths import BuildPaths
    paths = BuildPaths.for_config(chip, "layer")
    if not paths.netlist.is_file() or not paths.rtl.is_file() or paths.rtl.read_text() != chip_verilog(chip):
        raise UserError(f"--netlist: no netlist of today's Verilog at {paths.netlist} "
                        f"(run `make synth CONFIG={chip.name}` first)")
    return paths.netlist


def _gate_level(chip, q, held, args, netlist: Path) -> dict:
    """A few tokens of the first held-out example on the netlist, against the integer model."""
    from run.driver import ModelDriver, RunPlan
    drv = ModelDriver(chip, q, label="demo-gl")
    n = args.gl_tokens
    print(f"  gate level: {n} tokens on {netlist} (Icarus; the LOAD of the image first) ...", flush=True)
    res = drv.run(RunPlan(tokens=n, stall=False, seed=1), simulator="icarus", xs=held.inputs[0, :n],
                  netlist=netlist, name="demo_gl")
    return {"tokens": n, "match": res.match, "cycles": res.sim_cycles, "wall_s": res.wall_s,
            "first_problem": res.problems[0] if res.problems else None}


def _pct(r: dict) -> str:
    return f"{100 * r['accuracy']:.1f} % ({r['hits']:,}/{r['scored']:,})"


def _table(results: list[dict]) -> str:
    lines = ["| task | model | held-out examples | next-token accuracy | bits per scored token | cycles per token "
             "| tokens/s at Fmax |", "|---|---|---|---|---|---|---|"]
    notes = []
    for r in results:
        rtl = r["rtl"]
        for name, sc in r["scores"].items():
            b = sc.get("bits_per_token")
            cyc = tps = ""
            if name == "RTL" and rtl:
                cyc = f"{rtl['cycles_per_token']:,.0f}"
                tps = f"{rtl['tokens_per_s_at_fmax']:,.0f}" if rtl.get("tokens_per_s_at_fmax") else "no Fmax"
            lines.append(f"| {r['task']} ({r['config']}) | {name} | {sc['examples']} | {_pct(sc)} | "
                         f"{'' if b is None else f'{b:.3f}'} | {cyc} | {tps} |")
        head = f"{r['task']} ({r['config']}): "
        notes.append(head + r["what"])
        if rtl:
            notes.append(head + f"RTL of {rtl['chip']}: every next token "
                         f"{'and every logit ' if rtl['logits_compared'] else ''}equal to the integer model's "
                         f"({rtl['tokens']} tokens, no stalls, {rtl['sim_cycles_per_s']:,.0f} simulated cycles/s)")
        notes.append(head + (f"Fmax {r['fmax_mhz']:,.0f} MHz from {r['fmax_from']}" if r["fmax_mhz"]
                             else f"no Fmax: {r['fmax_from']}"))
        gl = r["gate_level"]
        if gl:
            notes.append(head + f"gate level: {gl['tokens']} tokens, "
                         f"{'MATCH' if gl['match'] else 'MISMATCH: ' + str(gl['first_problem'])}"
                         f" ({gl['cycles']:,} cycles, {gl['wall_s']:.0f} s)")
        notes += [head + n for n in r["notes"]]
    notes.append("bits per scored token: MQAR's answers, every byte of a text (bits per character)")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes)
