"""`moekda sweep`: design-space exploration over a grid of configs.

Each grid point is a full config (a base config with some fields replaced) that
goes through rtl -> Yosys -> OpenSTA (flow.synth_flow) and a short stall-free
simulation of the chip for its cycles per token.  A point's results live in
build/sweep/<config hash>/ (its build tree and result.json); a point whose
result.json exists is not run again, so a grid can grow without recomputing,
as long as its fingerprint (flow/fingerprint.py: its Verilog, config and cell
library) is today's: a source change that alters the point's Verilog reruns it,
one that does not keeps it.

Grid file (TOML)::

    base = "tiny"                 # a config name or path
    tokens = 8                    # tokens of each point's cycle-count run
    simulator = "icarus"
    [grid]                        # every combination of these lists is a point
    lanes = [2, 4]
    weight_port_bytes = [4, 8]
    n_experts = [4]
    top_k = [2]
    d_model = [16]
    clock_period_ns = [1.25]

Axis names are config fields (model.* or hw.*) given without their section.
Fields that must move together are one axis named ``"a+b"`` whose values are
lists, e.g. ``"lanes+weight_port_bytes" = [[4, 4], [8, 8]]`` (the KDA unit
needs lanes == weight_port_bytes).
The points run in parallel with Ray (``ray.init()`` local, or the cluster
named by RAY_ADDRESS), or with a local process pool (``--local``).
"""
from __future__ import annotations

import copy
import itertools
import json
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from flow.paths import RESULTS_DIR
from moekda.config import REPO_ROOT, SECTIONS, Config, ConfigError, config_from_dict, load_config

SWEEP_ROOT = REPO_ROOT / "build" / "sweep"
RESULT_FILE = "result.json"

# the default grid: 6 points around tiny (the machine has 2 cores); the one copy of it
DEFAULT_GRID = REPO_ROOT / "bench" / "sweep.toml"


# ---- the grid ----------------------------------------------------------------------

def _section_of(field_name: str) -> str:
    found = [sec for sec, cls in SECTIONS.items() if field_name in cls.__dataclass_fields__]
    if len(found) != 1:
        raise ConfigError(f"sweep axis {field_name}: not a config field (use model.* or hw.* field names)")
    return found[0]


@dataclass(frozen=True)
class Grid:
    base: Config
    axes: dict            # field name -> list of values
    tokens: int = 8
    simulator: str = "icarus"

    def fields(self) -> list[tuple[str, list]]:
        """(axis, [(field, section), ...]) for each axis; a tied axis names several fields."""
        return [(axis, [(f, _section_of(f)) for f in axis.split("+")]) for axis in self.axes]

    def points(self) -> tuple[list[Config], list[str]]:
        """Every valid combination as a Config named by the hash of its values (its cache key);
        invalid ones as messages."""
        base = self.base.to_dict()
        axes = self.fields()
        cfgs, skipped = [], []
        for values in itertools.product(*(self.axes[a] for a, _ in axes)):
            raw = copy.deepcopy(base)
            labels = []
            for (axis, fields), v in zip(axes, values):
                vs = v if len(fields) > 1 else [v]
                for (name, sec), x in zip(fields, vs):
                    raw[sec][name] = x
                    labels.append(f"{name}={x}")
            label = ", ".join(labels)
            try:
                cfg = config_from_dict({**raw, "name": "point"}, source=f"sweep point {label}")
            except ConfigError as e:
                skipped.append(f"{label}: {e}")
                continue
            cfgs.append(config_from_dict({**raw, "name": cfg.hash()}, source=f"sweep point {label}"))
        return cfgs, skipped


def load_grid(path: Path | None) -> Grid:
    path = DEFAULT_GRID if path is None else path
    if not path.is_file():
        raise ConfigError(f"--grid {path}: no such file")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--grid {path}: not valid TOML ({e})") from None
    unknown = set(raw) - {"base", "tokens", "simulator", "grid"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {', '.join(sorted(unknown))} (known: base, tokens, simulator, grid)")
    axes = raw.get("grid", {})
    if not isinstance(axes, dict) or not axes:
        raise ConfigError(f"{path}: [grid] must list at least one axis, e.g. lanes = [2, 4]")
    for name, vals in axes.items():
        fields = name.split("+")
        for f in fields:
            _section_of(f)
        if not isinstance(vals, list) or not vals:
            raise ConfigError(f"grid.{name} = {vals!r}: must be a non-empty list")
        if len(fields) > 1 and not all(isinstance(v, list) and len(v) == len(fields) for v in vals):
            raise ConfigError(f"grid.{name} = {vals!r}: each value must be a list of {len(fields)} values")
    tokens = raw.get("tokens", 8)
    if not isinstance(tokens, int) or not 4 <= tokens <= 4096:
        raise ConfigError(f"tokens = {tokens!r}: allowed range is 4 to 4096")
    sim = raw.get("simulator", "icarus")
    if sim not in ("icarus", "verilator"):
        raise ConfigError(f"simulator = {sim!r}: allowed values are icarus, verilator")
    return Grid(load_config(raw.get("base", "tiny")), axes, tokens, sim)


# ---- the cache ---------------------------------------------------------------------

def point_dir(cfg: Config, root: Path = SWEEP_ROOT) -> Path:
    """A point is named by the hash of its values (Grid.points), so the name is the cache key."""
    return root / cfg.name


def cached(cfg: Config, root: Path = SWEEP_ROOT) -> dict | None:
    """A point's stored result, if it was computed for exactly these config values."""
    f = point_dir(cfg, root) / RESULT_FILE
    if not f.is_file():
        return None
    rec = json.loads(f.read_text())
    if rec.get("config") != json.loads(json.dumps(cfg.to_dict())):
        return None
    # a point measured on other Verilog (or another cell library) describes another chip:
    # recompute it; one whose Verilog is today's is kept, whatever else changed in the sources
    from studies.bench import chip_verilog
    from flow.fingerprint import stale_reason
    from pdk.kit import find_kit
    return None if stale_reason(rec, cfg.hash(), find_kit(), lambda: chip_verilog(cfg)) else rec


# ---- one point (runs in a worker) -----------------------------------------------------

def to_toml(cfg_dict: dict) -> str:
    """A config dict (Config.to_dict() plus name) as TOML: strings, numbers and one level of tables."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)
    lines = [f"name = {val(cfg_dict['name'])}"]
    for sec, table in cfg_dict.items():
        if isinstance(table, dict):
            lines += ["", f"[{sec}]"] + [f"{k} = {val(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def write_config(cfg_dict: dict) -> str:
    """A derived config (Config.to_dict() changed, with its name) checked and written as
    build/configs/<name>.toml, for benches that reload it from the file; rewritten only when
    its text changes (the simulator builds key on it).  Returns the path."""
    config_from_dict(cfg_dict)                  # checked here, with its one-line message
    path = REPO_ROOT / "build" / "configs" / f"{cfg_dict['name']}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = to_toml(cfg_dict)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return str(path)


def run_point(cfg_dict: dict, tokens: int, simulator: str, root: str) -> dict:
    """rtl + synth + STA + cycle count of one config; writes and returns its result."""
    from studies import bench
    from hw import cost
    from flow.paths import BuildPaths
    from flow.rtl import write_rtl
    from flow.synth_flow import FlowOptions, Steps, synth_and_sta
    from flow.fingerprint import generator_record, synthesis_fingerprint, verilog_digest
    from pdk.kit import find_kit
    from run.driver import LayerDriver, RunPlan
    from model.quantize import quantize_random_layer

    root_p = Path(root)
    out = point_dir(config_from_dict(cfg_dict, source="sweep point"), root_p)  # == the point's BuildPaths root
    out.mkdir(parents=True, exist_ok=True)
    # the simulation bench reloads the config from its file: the point gets one
    cfg_file = out / "config.toml"
    cfg_file.write_text(to_toml(cfg_dict))
    cfg = load_config(cfg_file)
    t0 = time.monotonic()
    paths = BuildPaths.for_config(cfg, "layer", build_root=root_p).make_dirs()
    m = json.loads(paths.metrics.read_text()) if paths.metrics.is_file() else {}
    steps = Steps(lambda s: None, lambda s, t: None)
    steps.run("rtl", write_rtl, cfg, "layer", paths.rtl, paths.log("rtl"))
    kit = find_kit()
    # the generator just ran in this process: what it had loaded decides the Verilog
    generator = generator_record()
    if (m.get("design__name") != "layer" or m.get("rtl__fingerprint") != synthesis_fingerprint(
            verilog_digest(paths.rtl.read_text()), cfg.hash(), kit)):
        # synthesis is the long step: kept when a later step of the point failed, or when the
        # Verilog came out the same after a source change
        m = synth_and_sta(cfg, kit, paths, [paths.rtl], FlowOptions(), steps,
                          on_pass=lambda name: None, extra_seconds={"rtl": steps.seconds["rtl"]})
    # the point's simulation builds inside its own directory, next to its synthesis
    drv = LayerDriver(cfg, quantize_random_layer(cfg, 0), label="sweep", build_root=out)
    res = drv.run(RunPlan(tokens=tokens, stall=False, seed=1), simulator=simulator, name="sweep")
    if not res.match:
        raise RuntimeError(f"point {cfg.hash()}: simulation does not match the model: {res.problems[0]}")
    tr = cost.traffic(cfg)
    cpt = res.cycles_per_token
    rec = {"config_hash": cfg.name, "config": cfg.to_dict(), "rtl__fingerprint": m["rtl__fingerprint"],
           "rtl__verilog_digest": m["rtl__verilog_digest"], "rtl__generator": generator,
           "lanes": cfg.hw.lanes, "weight_port_bytes": cfg.hw.weight_port_bytes,
           "n_experts": cfg.model.n_experts, "top_k": cfg.model.top_k, "d_model": cfg.model.d_model,
           "clock_period_ns": cfg.hw.clock_period_ns,
           "area_um2": m["synth__design__instance__area"], "fmax_mhz": m["fmax"], "wns_ns": m["timing__setup__ws"],
           "power_w": m["power__total"], "cycles_per_token": cpt, "roofline_bound": tr.bound,
           "utilisation": cost.utilisation(tr.bound, cpt), "sim_tokens": tokens, "simulator": simulator,
           **bench.at_fmax(tr.macs, cpt, m["fmax"], m["synth__design__instance__area"], m["power__total"],
                           cfg.hw.clock_period_ns),
           "wall_s": round(time.monotonic() - t0, 1)}
    (out / RESULT_FILE).write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    return rec


# ---- Pareto front ------------------------------------------------------------------

def pareto(points: list[dict], cost: str = "area_um2", gain: str = "tokens_per_s") -> list[dict]:
    """Points no other point beats: smaller or equal cost and larger or equal gain, one strictly.
    Points missing either value cannot be placed and are left out.  Sorted by cost."""
    ok = [p for p in points if p.get(cost) is not None and p.get(gain) is not None]
    front = []
    for p in ok:
        dominated = any(q[cost] <= p[cost] and q[gain] >= p[gain] and (q[cost] < p[cost] or q[gain] > p[gain])
                        for q in ok)
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda p: p[cost])


# ---- reports -----------------------------------------------------------------------

COLUMNS = [("config_hash", "hash", "s"), ("lanes", "lanes", "d"), ("weight_port_bytes", "port B", "d"),
           ("n_experts", "E", "d"), ("top_k", "k", "d"), ("d_model", "d", "d"),
           ("clock_period_ns", "clk ns", "g"), ("area_um2", "area um2", ",.0f"), ("fmax_mhz", "Fmax MHz", ",.0f"),
           ("cycles_per_token", "cyc/tok", ",.1f"), ("roofline_bound", "bound", ",.1f"),
           ("utilisation", "util", ".2f"), ("tokens_per_s", "tok/s @Fmax", ",.0f"),
           ("energy_per_token_nj", "nJ/tok", ",.2f")]


def table(points: list[dict], front: list[dict]) -> str:
    on_front = {p["config_hash"] for p in front}
    head = "| " + " | ".join(h for _, h, _ in COLUMNS) + " | Pareto |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for p in sorted(points, key=lambda p: (p.get("area_um2") or 0)):
        cells = ["n/a" if p.get(k) is None else format(p[k], f) for k, _, f in COLUMNS]
        lines.append("| " + " | ".join(cells) + f" | {'yes' if p['config_hash'] in on_front else ''} |")
    return "\n".join(lines)


def plot(points: list[dict], front: list[dict], path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [p for p in points if p.get("area_um2") and p.get("tokens_per_s")]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p["area_um2"] / 1e6 for p in ok], [p["tokens_per_s"] / 1e6 for p in ok], c="tab:gray",
               label="grid point")
    ax.plot([p["area_um2"] / 1e6 for p in front], [p["tokens_per_s"] / 1e6 for p in front], "o-", c="tab:red",
            label="Pareto front")
    for p in ok:
        ax.annotate(f"L{p['lanes']} P{p['weight_port_bytes']} k{p.get('top_k')}", (p["area_um2"] / 1e6, p["tokens_per_s"] / 1e6),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("area (mm2, post-synthesis, Nangate45)")
    ax.set_ylabel("tokens per second at Fmax (millions)")
    ax.set_title("moekda sweep: area against throughput")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(points: list[dict], skipped: list[str], failed: list[str], out_dir: Path = RESULTS_DIR,
                  command: str = "moekda sweep", pending: list[str] = ()) -> tuple[Path, Path]:
    """sweep.md (Pareto front, every point, refused, failed and not yet measured points) and sweep.png."""
    front = pareto(points)
    md, png = out_dir / "sweep.md", out_dir / "sweep.png"
    parts = ["# sweep: area against tokens per second", "",
             f"{len(points)} points measured; Pareto front (smaller area, more tokens/s): "
             f"{len(front)} points. Rerun: `{command}`.", "", "## Pareto front", "", table(front, front), "",
             "## All points", "", table(points, front), ""]
    if skipped:
        parts += ["## Grid points refused by the config checks", ""] + [f"- {s}" for s in skipped] + [""]
    if failed:
        parts += ["## Points that failed", ""] + [f"- {s}" for s in failed] + [""]
    if pending:
        parts += ["## Grid points not measured yet (not in the cache when this table was written)", ""] \
            + [f"- {s}" for s in pending] + [""]
    out_dir.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(parts))
    plot(points, front, png)
    return md, png
