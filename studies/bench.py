"""`moekda bench`: the measured trade-offs of one configuration.

Three sources, each the single owner of its facts:

* the cost model (hw/cost.py): MACs and weight bytes per token and the roofline;
* the chip's simulation (run.driver.LayerDriver, no stalls): cycles per token from
  the BUSY_CYCLES / TOKENS counters, per-token cycles (TOKEN_CYCLES) at each context
  position, WEIGHT_BYTES / TOKENS, and the simulators' speed;
* synthesis (build/<cfg>/reports/metrics.json of the chip top, written by
  `moekda synth`): Fmax, area, power.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from flow.paths import RESULTS_DIR
from hw.cost import Traffic, traffic, utilisation
from moekda.config import REPO_ROOT, Config

# the goals of issue 9, stated in every summary
GOAL_UTILISATION = 0.90          # of the roofline bound, for small
GOAL_MODEL_UTILISATION = 0.95    # of the roofline bound, for model-small (issue 14)
# model-small with its state in flip-flops or in SRAM: the same model, datapath and bound
GOAL_MODEL_CONFIGS = ("model-small", "model-small-sram")
GOAL_CONTEXT_RATIO = 1.01        # cycles/token at context 4096 over those at 16
CONTEXTS = (16, 256, 1024, 4096)   # positions whose per-token cycles are recorded (when reached)
MIN_TOKENS = 1024                  # issue 9: cycles per token over at least this many tokens
# issue 45 (an optimised chip): cell area (macros included) and the sequential cells' share
GOAL_AREA_UM2 = {"tiny": 200_000, "model-small-sram": 700_000}
GOAL_SEQUENTIAL_SHARE = 0.25
CONTEXT_WINDOW = 8               # tokens averaged just before each context position


# ---- derived figures at Fmax -------------------------------------------------------

def at_fmax(macs: int, cycles_per_token: float, fmax_mhz: float | None, area_um2: float | None,
            power_w: float | None, clock_period_ns: float) -> dict:
    """Tokens/s and GOPS/mm2 at Fmax (one MAC = 2 ops); energy per token from the
    synthesised power at the configured clock (dynamic energy per cycle does not
    depend on the clock to first order, so it is P * T_clk per cycle)."""
    out = {"tokens_per_s": None, "gops": None, "gops_per_mm2": None, "energy_per_token_nj": None}
    if fmax_mhz:
        tps = fmax_mhz * 1e6 / cycles_per_token
        out["tokens_per_s"] = tps
        out["gops"] = 2 * macs * tps / 1e9
        if area_um2:
            out["gops_per_mm2"] = out["gops"] / (area_um2 * 1e-6)
    if power_w is not None:
        out["energy_per_token_nj"] = power_w * cycles_per_token * clock_period_ns
    return out


# ---- synthesis -------------------------------------------------------------------

def synth_metrics(cfg: Config, build_root: Path | None = None) -> tuple[dict | None, str]:
    """The chip top's metrics.json if it was synthesised from today's Verilog of this config with
    the same cell library (its fingerprint, flow/fingerprint.py)."""
    from flow.paths import BuildPaths
    path = BuildPaths.for_config(cfg, "layer", build_root=build_root).metrics
    if not path.is_file():
        return None, f"no {path.relative_to(REPO_ROOT)} (run `moekda synth -c {cfg.name}`)"
    m = json.loads(path.read_text())
    if m.get("design__name") != "layer":
        return None, f"{path} is of top {m.get('design__name')}, not the chip top layer"
    if m.get("config__hash") != cfg.hash():
        return None, f"{path} is of config hash {m.get('config__hash')}, not {cfg.hash()} (re-run synth)"
    from flow.fingerprint import stale_reason
    from pdk.kit import KitError, find_kit
    try:
        kit = find_kit()
    except KitError as e:
        return None, f"cannot check {path}: {e}"
    why = stale_reason(m, cfg.hash(), kit, lambda: chip_verilog(cfg))
    if why:
        return None, f"{path} is stale: {why} (re-run synth)"
    return m, ""


# ---- place and route -------------------------------------------------------------

def pnr_figures(cfg: Config, results_dir: Path = RESULTS_DIR) -> tuple[dict | None, str]:
    """The chip top's post-route figures from its committed record (``pnr-<config>.json``,
    written by `moekda pnr --record` after a real run): Fmax with extracted parasitics and
    the propagated clock, cell area, power at activity 0.1 and from a simulated VCD, the
    DRC counts and the commit the run was made at.  A record is of one netlist: it is used
    when its config hash is today's and named with its commit (the RTL may have moved on
    since; the bench says so rather than guess)."""
    path = results_dir / f"pnr-{cfg.name}.json"
    if not path.is_file():
        return None, f"no {path.name} (no place-and-route run recorded)"
    rec = json.loads(path.read_text())
    if rec.get("config_hash") != cfg.hash():
        return None, f"{path.name} is of config hash {rec.get('config_hash')}, not today's {cfg.hash()}"
    m = rec.get("metrics", {})
    if m.get("finish__timing__fmax") is None:
        return None, f"{path.name} holds no post-route Fmax"
    energy = m.get("finish__power__activity__energy_per_token__j")
    return {"record": path.name, "run_commit": rec.get("run_commit"), "openroad": rec.get("openroad_version"),
            "fmax_mhz": m["finish__timing__fmax"] / 1e6,
            "wns_ns": m.get("finish__timing__setup__ws"), "hold_ws_ns": m.get("finish__timing__hold__ws"),
            "area_um2": m.get("finish__design__instance__area"),
            "core_area_um2": m.get("finish__design__core__area"),
            "utilisation": m.get("finish__design__instance__utilization"),
            "power_w": m.get("finish__power__total"),
            "power_activity_w": m.get("finish__power__activity__total"),
            "energy_per_token_activity_nj": None if energy is None else energy * 1e9,
            "route_drc_errors": m.get("route__drc_errors"),
            "klayout_drc_violations": m.get("drc__klayout__violations")}, ""


@lru_cache(maxsize=4)
def chip_verilog(cfg: Config) -> str:
    """Today's Verilog of the chip top for ``cfg``, as `moekda synth` writes it (once per process:
    tens of seconds)."""
    from hw.tops import top_verilog
    return top_verilog("layer", cfg)


# ---- simulation ------------------------------------------------------------------

def window_mean(token_cycles, position: int, window: int = CONTEXT_WINDOW, positions=None) -> float | None:
    """Mean per-token cycles of the tokens at sequence positions ``position - window`` ..
    ``position - 1``, i.e. with a context of up to ``position`` tokens (their own included).
    ``positions``: each token's position in its sequence (default: token t at t, one
    sequence); with several sequence slots every slot's tokens at those positions count."""
    if position < 1:
        return None
    pos = range(len(token_cycles)) if positions is None else positions
    if max(pos, default=-1) < position - 1:
        return None                                  # the run did not reach this context
    lo = max(0, position - window)
    seg = [int(c) for c, p in zip(token_cycles, pos) if c is not None and lo <= p < position]   # None: not read
    return sum(seg) / len(seg) if seg else None


def simulate(cfg_name: str, tokens: int, simulator: str, seed: int = 0) -> dict:
    """One stall-free run through the chip; checked bit for bit against the model."""
    from run.driver import RunPlan, chip_driver, sequence_positions
    drv = chip_driver(cfg_name, seed)     # the layer chip, or the model chip for a vocabulary
    t0 = time.monotonic()
    drv.build(simulator)
    build_s = time.monotonic() - t0
    # TOKEN_CYCLES is read after the outputs of the windows before each context, by sequence
    # position: with S sequence slots (token t in slot t mod S) position p is token about S p,
    # so a run reaches context 4096 with S x 4096 tokens (an MLA layer's cost is its
    # sequence's position, not the token's index).  One token more than measured: the last
    # token of a run has the chip to itself (no next token's KDA sharing the port), so it
    # would flatter the window at the last position.
    plan = RunPlan(tokens=tokens + 1, stall=False, seed=1)
    pos = sequence_positions(plan, drv.slots)[:tokens]
    windows = tuple(int(t) for t in range(tokens)
                    if any(max(0, p - CONTEXT_WINDOW) <= pos[t] < p for p in CONTEXTS))
    res = drv.run(replace(plan, token_cycles=windows), simulator=simulator, name=f"bench_T{tokens}")
    c = res.counters
    if not res.match:
        raise RuntimeError(f"bench run of {cfg_name} on {simulator} does not match the model: {res.problems[0]}")
    tc: list[int | None] = [None] * tokens
    for t, cycles in zip(res.token_cycles_idx, res.token_cycles):
        if t < tokens:
            tc[int(t)] = int(cycles)
    from hw.image.format import image_layout
    return {"simulator": simulator, "tokens": tokens, "match": res.match,
            "cycles": c.get("CYCLES"), "busy_cycles": c.get("BUSY_CYCLES"), "tokens_counted": c.get("TOKENS"),
            "weight_bytes": c.get("WEIGHT_BYTES"), "macs": c.get("MACS"),
            # WEIGHT_BYTES counts the run's one LOAD too, which reads the whole image once
            # (hw/chip/loader.py): not a token's traffic
            "load_bytes": image_layout(drv.cfg).length,
            # the model chip's phase counters (hw/chip/csr.py STAGE_COUNTERS), summed over tokens
            **{k.lower(): c[k] for k in ("FETCH_CYCLES", "LAYER_CYCLES", "HEAD_CYCLES") if k in c},
            "cycles_per_token": res.cycles_per_token,
            "token_cycles_at": {str(p): window_mean(tc, p, positions=pos) for p in CONTEXTS},
            "build_s": round(build_s, 2), "run_s": round(res.wall_s, 2),
            "sim_cycles": res.sim_cycles, "sim_s": round(res.sim_s, 2),
            # the simulator's own speed: the run's cycles over its wall time (no build, no model)
            "cycles_per_s": res.cycles_per_s}


# ---- the record ------------------------------------------------------------------

def assemble(cfg: Config, tr: Traffic, long_run: dict, speed: dict, synth: dict | None,
             synth_note: str, pnr: dict | None = None, pnr_note: str = "") -> dict:
    cpt = long_run["cycles_per_token"]
    ctx = long_run["token_cycles_at"]
    reached = [p for p in CONTEXTS if ctx.get(str(p)) is not None]
    far = max(reached) if reached else None
    c16, cfar = ctx.get("16"), (ctx.get(str(far)) if far else None)
    rec = {
        "config": cfg.name, "config_hash": cfg.hash(),
        "lanes": cfg.hw.lanes, "weight_port_bytes": cfg.hw.weight_port_bytes,
        "clock_period_ns": cfg.hw.clock_period_ns,
        "macs_per_token": tr.macs, "weight_bytes_per_token": tr.weight_bytes,
        "dense_weight_bytes_per_token": tr.dense_bytes,
        "moe_bytes_saving": 1 - tr.weight_bytes / tr.dense_bytes,
        "roofline_mac_cycles": tr.mac_cycles, "roofline_port_cycles": tr.port_cycles,
        "roofline_state_cycles": tr.state_cycles, "roofline_depth_cycles": tr.depth_cycles,
        "roofline_bound": tr.bound, "bound_by": tr.bound_by,
        "cycles_per_token": cpt, "utilisation": utilisation(tr.bound, cpt),
        "measured_weight_bytes_per_token": ((long_run["weight_bytes"] - long_run.get("load_bytes", 0))
                                            / long_run["tokens_counted"]
                                            if long_run.get("tokens_counted") else None),
        "token_cycles_at_context": ctx, "context_far": far,
        "context_ratio": (cfar / c16) if c16 and cfar and far > 16 else None,
        "tokens_simulated": long_run["tokens"], "meets_min_tokens": long_run["tokens"] >= MIN_TOKENS,
        "sim": {"long": long_run, **speed},
        "synth_note": synth_note,
    }
    fmax = area = power = None
    if synth:
        fmax, area, power = synth.get("fmax"), synth.get("synth__design__instance__area"), synth.get("power__total")
        seq = synth.get("synth__design__instance__area__sequential")
        rec.update({"fmax_mhz": fmax, "area_um2": area, "power_w": power,
                    "sequential_area_um2": seq,
                    "sequential_share": seq / area if seq is not None and area else None,
                    **simulated_energy(synth, "synth"),
                    "power_activity": synth.get("power__activity"),
                    "wns_ns": synth.get("timing__setup__ws"),
                    "wall_rtl_s": synth.get("flow__rtl__seconds"),
                    "wall_synth_s": (synth.get("flow__synth__seconds") or 0) + (synth.get("flow__sta__seconds") or 0)})
    if "layer_cycles" in long_run and long_run.get("tokens_counted"):
        # the model chip: where a token's cycles go (measured by the chip's phase counters:
        # cycles the datapath has a token, a FETCH is in flight, the head has a token).  With
        # one sequence the phases follow each other and the rest is the embedding and the
        # hand-overs; with several they overlap (a phase's cycles are its occupancy)
        from hw.image.memory_map import sequence_slots
        n, L, S = long_run["tokens_counted"], cfg.model.n_layers, sequence_slots(cfg)
        rec["model"] = {"n_layers": L, "vocab": cfg.model.vocab, "sequences": S,
                        "layer_cycles_per_token_per_layer": long_run["layer_cycles"] / (n * L),
                        "fetch_cycles_per_token": long_run["fetch_cycles"] / n,
                        "head_cycles_per_token": long_run["head_cycles"] / n,
                        "other_cycles_per_token": None if S > 1 else
                        cpt - (long_run["layer_cycles"] + long_run["fetch_cycles"] + long_run["head_cycles"]) / n}
    rec.update(at_fmax(tr.macs, cpt, fmax, area, power, cfg.hw.clock_period_ns))
    rec["pnr_note"] = pnr_note
    if pnr:
        # after routing: the same cycles at the routed Fmax (energy from the VCD is measured
        # per token by `moekda power` itself, over its own run)
        rec["post_route"] = {**pnr, **{k + "_post_route": v for k, v in at_fmax(
            tr.macs, cpt, pnr["fmax_mhz"], pnr["area_um2"], pnr["power_w"], cfg.hw.clock_period_ns).items()}}
    rec["wall_sim_s"] = long_run["run_s"]
    rec["goals"] = goals(rec)
    return rec


def simulated_energy(m: dict, stage: str) -> dict:
    """`moekda power`'s energy per token from simulated activity in metrics ``m`` (its window
    and per category), or Nones: the record keeps the activity-0.1 estimate apart from it."""
    p = f"{stage}__power__activity"
    e = m.get(f"{p}__energy_per_token__j")
    key = f"{p}__energy_per_token__j__category:"
    return {"energy_per_token_nj_simulated": None if e is None else e * 1e9,
            "energy_simulated": None if e is None else {
                "stage": stage, "tokens": m.get(f"{p}__tokens"), "warmup_tokens": m.get(f"{p}__warmup_tokens"),
                "window_ns": m.get(f"{p}__window__ns"), "power_w": m.get(f"{p}__total"),
                "per_category_nj": {k[len(key):]: v * 1e9 for k, v in m.items() if k.startswith(key)}}}


def goals(rec: dict) -> dict:
    out = {}
    if rec["config"] == "small":
        out["utilisation >= 0.90 (small)"] = rec["utilisation"] >= GOAL_UTILISATION
    if rec["config"] in GOAL_MODEL_CONFIGS:
        out[f"utilisation >= 0.95 ({rec['config']}, issue 14)"] = rec["utilisation"] >= GOAL_MODEL_UTILISATION
    if rec["config"] in GOAL_AREA_UM2 and rec.get("area_um2") is not None:
        out[f"cell area <= {GOAL_AREA_UM2[rec['config']]:,} um2 (issue 45)"] = rec["area_um2"] <= GOAL_AREA_UM2[rec["config"]]
        if rec.get("sequential_share") is not None:
            out[f"sequential area share <= {GOAL_SEQUENTIAL_SHARE:.0%} (issue 45)"] = \
                rec["sequential_share"] <= GOAL_SEQUENTIAL_SHARE
    if rec.get("context_ratio") is not None:
        out[f"cycles at context {rec['context_far']} / at 16 <= 1.01"
            + ("" if rec["context_far"] == 4096 else " (4096 not reached in this run)")] = \
            rec["context_ratio"] <= GOAL_CONTEXT_RATIO
    return out


def _contexts(rec: dict) -> list:
    """The context positions of ``token_cycles_at_context`` in increasing order."""
    return sorted(rec["token_cycles_at_context"], key=int)


def _fmt(v, spec=",.1f", none="n/a"):
    return none if v is None else format(v, spec)


def markdown(rec: dict) -> str:
    s = rec["sim"]
    rows = [
        ("MACs per token", _fmt(rec["macs_per_token"], ",d")),
        # a model chip's bytes per token are fractional (a layer's parameter halves are
        # fetched once for hw.sequences tokens), a layer chip's whole
        ("weight bytes per token (MoE, top_k)", _fmt(rec["weight_bytes_per_token"], ",.1f")),
        ("weight bytes per token, dense equivalent", _fmt(rec["dense_weight_bytes_per_token"], ",.1f")
         + f" (MoE fetches {100 * (1 - rec['moe_bytes_saving']):.1f}%)"),
        ("weight bytes per token, measured on the port", _fmt(rec["measured_weight_bytes_per_token"])),
        ("roofline bound, cycles/token", f"{rec['roofline_bound']:,.1f} (bound by {rec['bound_by']}: "
         f"MACs/lanes {rec['roofline_mac_cycles']:,.1f}, bytes/port {rec['roofline_port_cycles']:,.1f}, "
         f"KDA state/state lanes {rec.get('roofline_state_cycles', 0):,.1f}"
         + (f", depth unit {rec['roofline_depth_cycles']:,.1f}" if rec.get("roofline_depth_cycles") else "") + ")"),
        (f"cycles/token measured ({s['long']['simulator']}, {s['long']['tokens']} tokens)",
         f"{rec['cycles_per_token']:,.1f}"),
        ("utilisation of the roofline", f"{100 * rec['utilisation']:.1f}%"),
        # (a JSON record read back has its keys as strings, in the file's order)
        ("per-token cycles (TOKEN_CYCLES) at context " + " / ".join(_contexts(rec)),
         " / ".join(_fmt(rec["token_cycles_at_context"][k]) for k in _contexts(rec))
         + (f" (ratio {rec['context_far']} to 16: {_fmt(rec['context_ratio'], '.4f')})"
            if rec.get("context_ratio") is not None else " (the run reached no context beyond 16)")),
        ("Fmax (post-synthesis, reg-to-reg)", _fmt(rec.get("fmax_mhz"), ",.0f") + " MHz"),
        ("area", _fmt(rec.get("area_um2"), ",.0f") + " um2"),
        ("sequential area (flip-flops, latches, clock gates)", _fmt(rec.get("sequential_area_um2"), ",.0f") + " um2"
         + ("" if rec.get("sequential_share") is None else f" ({100 * rec['sequential_share']:.1f} %)")),
        ("power at the configured clock", _fmt(None if rec.get("power_w") is None else rec["power_w"] * 1e3, ".2f")
         + f" mW (activity {rec.get('power_activity', 'n/a')})"),
        ("tokens/s at Fmax", _fmt(rec.get("tokens_per_s"), ",.0f")),
        ("GOPS/mm2 at Fmax", _fmt(rec.get("gops_per_mm2"), ",.2f")),
        ("energy per token, estimate (activity 0.1 on every input, not simulated)",
         _fmt(rec.get("energy_per_token_nj"), ",.2f") + " nJ"),
        ("energy per token from simulated activity (`moekda power --synth`, no wires)",
         _fmt(rec.get("energy_per_token_nj_simulated"), ",.2f") + " nJ"
         + ("" if not rec.get("energy_simulated") else
            f" ({rec['energy_simulated']['tokens']} tokens after {rec['energy_simulated']['warmup_tokens']})")),
    ]
    pr = rec.get("post_route")
    if pr:
        at = f" ([{pr['record']}]({pr['record'].replace('.json', '.md')}), run at commit {str(pr['run_commit'])[:12]})"
        rows += [
            ("Fmax after routing (extracted parasitics, propagated clock)" + at,
             f"{_fmt(pr['fmax_mhz'], ',.0f')} MHz (setup WNS {_fmt(pr['wns_ns'], '+.3f')} ns, "
             f"hold {_fmt(pr['hold_ws_ns'], '+.3f')} ns)"),
            ("cell area after routing", f"{_fmt(pr['area_um2'], ',.0f')} um2 in a core of "
             f"{_fmt(pr['core_area_um2'], ',.0f')} um2 ({_fmt(100 * (pr['utilisation'] or 0), '.1f')} %)"),
            ("power after routing, activity 0.1 / from simulated activity (`moekda power`)",
             f"{_fmt(None if pr['power_w'] is None else pr['power_w'] * 1e3, ',.1f')} mW / "
             f"{_fmt(None if pr['power_activity_w'] is None else pr['power_activity_w'] * 1e3, ',.1f')} mW"),
            ("energy per token after routing, simulated activity", _fmt(pr["energy_per_token_activity_nj"], ",.1f")
             + " nJ"),
            ("tokens/s at the routed Fmax", _fmt(pr["tokens_per_s_post_route"], ",.0f")),
            ("DRC after routing: router / KLayout deck",
             f"{_fmt(pr['route_drc_errors'], ',d')} / {_fmt(pr['klayout_drc_violations'], ',d')}"),
        ]
    elif rec.get("pnr_note"):
        rows.append(("after routing", rec["pnr_note"]))
    if "model" in rec:
        mo = rec["model"]
        S = mo.get("sequences", 1)
        also = f" ({S} sequences interleaved: the phases overlap)" if S > 1 else ""
        rows += [("model chip: cycles per token per layer (datapath busy)" + also,
                  f"{mo['layer_cycles_per_token_per_layer']:,.1f} x {mo['n_layers']} layers"),
                 ("model chip: parameter FETCH cycles per token", f"{mo['fetch_cycles_per_token']:,.1f}"),
                 ("model chip: head (final norm, LM head, argmax) cycles per token", f"{mo['head_cycles_per_token']:,.1f}")]
        if mo.get("other_cycles_per_token") is not None:
            rows.append(("model chip: embedding and hand-overs, cycles per token", f"{mo['other_cycles_per_token']:,.1f}"))
    for sim in ("icarus", "verilator"):
        if sim in s:
            rows.append((f"simulation speed, {sim}", f"{_fmt(s[sim]['cycles_per_s'], ',.0f')} cycles/s "
                         f"({s[sim]['tokens']} tokens, build {s[sim]['build_s']:.0f} s)"))
    rows.append(("wall time rtl / sim / synth+STA", f"{_fmt(rec.get('wall_rtl_s'))} s / "
                 f"{_fmt(rec.get('wall_sim_s'))} s / {_fmt(rec.get('wall_synth_s'))} s"))
    lines = [f"# bench: {rec['config']} (config hash {rec['config_hash']})", "",
             "| quantity | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    if not rec["meets_min_tokens"]:
        lines += ["", f"NOTE: this run simulated {rec['tokens_simulated']} tokens, fewer than the "
                  f"{MIN_TOKENS} issue 9 asks for (time budget); rerun with --tokens {MIN_TOKENS} or more."]
    lines += ["", "Goals (issue 9):", ""]
    for g, ok in rec["goals"].items():
        lines.append(f"- {g}: {'met' if ok else 'NOT met'}")
    if not rec["goals"]:
        lines.append("- none applies to this config and run")
    if rec["synth_note"]:
        lines += ["", f"Synthesis figures missing: {rec['synth_note']}"]
    if rec.get("commit"):
        lines += ["", f"Produced by `{rec['command']}` at commit {rec['commit'][:12]}"
                  + (" (working tree changed)" if rec.get("working_tree_changed") else "")
                  + f", {rec.get('date', '')}." + (f" {rec['note']}" if rec.get("note") else "")]
    lines += ["", f"Rerun: `moekda bench -c {rec['config']}`", ""]
    return "\n".join(lines)


def write(rec: dict, out_dir: Path = RESULTS_DIR) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    j, md = out_dir / f"{rec['config']}.json", out_dir / f"{rec['config']}.md"
    j.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    md.write_text(markdown(rec))
    return j, md
