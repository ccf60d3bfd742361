"""`moekda sweep`: rtl + synth + STA + cycle count over a grid of configs, in parallel.

    moekda sweep [--grid bench/sweep.toml] [--jobs 2] [--local] [--out DIR]

Points run as Ray tasks (a local Ray started here, or the cluster named by
RAY_ADDRESS); --local uses a process pool instead and needs no Ray.  Ray and
tqdm are the optional extra `sweep`:  .venv/bin/pip install -e '.[sweep]'.
Each point is cached in build/sweep/<config hash>/; the table and the Pareto
plot go to bench/results/sweep.md and sweep.png.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from cli import UserError

INSTALL_HINT = "pip install -e '.[sweep]' (or `make sweep`), or run with --local for a process pool"


def configure(p):
    p.add_argument("--grid", type=Path, default=None,
                   help="grid TOML (default: bench/sweep.toml, 6 points around tiny)")
    p.add_argument("--jobs", type=int, default=2, help="points run at once (default 2)")
    p.add_argument("--local", action="store_true", help="run on a local process pool instead of Ray")
    p.add_argument("--out", type=Path, default=None, help="results directory (default bench/results/)")
    p.add_argument("--list", action="store_true", help="list the grid's points and their cache state, run nothing")
    p.add_argument("--report", action="store_true",
                   help="write the table and plot from the cached points only, run nothing")


class _Bar:
    """tqdm when installed, else one line per finished point."""

    def __init__(self, total: int):
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="point", desc="sweep")
        except ImportError:
            self.bar, self.done, self.total = None, 0, total

    def step(self, note: str):
        if self.bar is not None:
            self.bar.set_postfix_str(note)
            self.bar.update(1)
        else:
            self.done += 1
            print(f"sweep [{self.done}/{self.total}] {note}", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _run_ray(todo, grid, jobs, bar, root):
    import ray

    from studies.sweep import run_point
    address = os.environ.get("RAY_ADDRESS")
    ray.init(address=address, **({} if address else {"num_cpus": jobs}), include_dashboard=False,
             log_to_driver=False)
    task = ray.remote(num_cpus=1)(run_point)
    refs = {task.remote(c.to_dict() | {"name": c.name}, grid.tokens, grid.simulator, str(root)): c for c in todo}
    done, failed = [], []
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        cfg = refs[ready[0]]
        try:
            done.append(ray.get(ready[0]))
            bar.step(f"{cfg.name} ok")
        except Exception as e:  # a failed point is reported, the others go on
            failed.append(f"{cfg.name}: {str(e).splitlines()[-1][:200]}")
            bar.step(f"{cfg.name} FAILED")
    ray.shutdown()
    return done, failed


def _run_local(todo, grid, jobs, bar, root):
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from studies.sweep import run_point
    done, failed = [], []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futs = {pool.submit(run_point, c.to_dict() | {"name": c.name}, grid.tokens, grid.simulator, str(root)): c
                for c in todo}
        for f in as_completed(futs):
            cfg = futs[f]
            try:
                done.append(f.result())
                bar.step(f"{cfg.name} ok")
            except Exception as e:
                failed.append(f"{cfg.name}: {str(e).splitlines()[-1][:200] if str(e) else type(e).__name__}")
                bar.step(f"{cfg.name} FAILED")
    return done, failed


def _command(args) -> str:
    return "moekda sweep" + (f" --grid {args.grid}" if args.grid else "") + (" --local" if args.local else "")


def run(args) -> int:
    from studies import sweep

    if not 1 <= args.jobs <= 64:
        raise UserError(f"--jobs = {args.jobs}: allowed range is 1 to 64")
    if not (args.local or args.list or args.report):
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UserError(f"Ray is not installed: {INSTALL_HINT}") from None
    grid = sweep.load_grid(args.grid)
    cfgs, skipped = grid.points()
    if not cfgs:
        raise UserError(f"the grid has no valid point ({len(skipped)} refused: {skipped[:1]})")
    root = sweep.SWEEP_ROOT
    have = {c.name: sweep.cached(c, root) for c in cfgs}
    todo = [c for c in cfgs if have[c.name] is None]
    print(f"moekda sweep: {len(cfgs)} points ({len(cfgs) - len(todo)} cached, {len(todo)} to run), "
          f"{len(skipped)} refused; {'local pool' if args.local else 'Ray'}, {args.jobs} jobs", flush=True)
    if args.list:
        for c in cfgs:
            print(f"  {c.name}  lanes={c.hw.lanes} port={c.hw.weight_port_bytes} E={c.model.n_experts} "
                  f"k={c.model.top_k} d={c.model.d_model} clk={c.hw.clock_period_ns}  "
                  f"{'cached' if have[c.name] else 'to run'}")
        for s in skipped:
            print(f"  refused: {s}")
        return 0
    if args.report:
        points = [r for r in have.values() if r is not None]
        pending = [c.name for c in todo]
        md, png = sweep.write_reports(points, skipped, [], args.out or sweep.RESULTS_DIR,
                                      _command(args), pending=pending)
        print(md.read_text())
        print(f"wrote {md} and {png}")
        return 0
    bar = _Bar(len(todo))
    runner = _run_local if args.local else _run_ray
    try:
        done, failed = runner(todo, grid, args.jobs, bar, root) if todo else ([], [])
    finally:
        bar.close()
    points = [r for r in have.values() if r is not None] + done
    md, png = sweep.write_reports(points, skipped, failed, args.out or sweep.RESULTS_DIR, _command(args))
    print(md.read_text())
    print(f"wrote {md} and {png}")
    if failed:
        print(f"moekda sweep: {len(failed)} points failed", file=sys.stderr)
        return 1
    return 0
