"""Functional coverage of a layer run (issue 18, item 4): what the run exercised, measured
from the integer model's traces (model/int_layer.py ``int_run_layer(traces=...)``) on
the run's own inputs, and from the plan and the chip's output tags.

    cov = layer_coverage(driver, plan, result)          # after driver.run(plan)
    record(cfg_name, "long256", cov)                    # build/<cfg>/reports/coverage.md

Items (``Item.covered`` False is a hole; ``applicable`` False: the config cannot have it):

* state saturation: tokens whose KDA state S (after the update) has an entry at a rail of
  state_bits (the delta rule's saturate), and kS / u at their rails;
* residual saturation: tokens whose h or y has an element at a rail of resid_bits;
* every expert chosen: routed experts the top-k picked at least once (counts per expert);
* ties: tokens whose router choices (score + selection bias) tie across the top-k boundary
  (the rule "lowest index first" decides the selection), and tokens with any equal choices;
* k = 1, k = E: the config's top_k;
* restarts: sequence starts by the stream's ``first`` bit, by a CSR CLEAR, by a reset with
  tokens inside, each counted where the chip's tag restarted at 0 on that token (the chip
  said so, not the plan).

The tables of several runs of one config go into build/<cfg>/reports/coverage.md (one
section per run, kept in coverage.json beside it); the long tests assert the items they
claim to test.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from moekda.config import REPO_ROOT
from moekda.formats import formats_for


@dataclass
class Item:
    name: str
    covered: bool
    value: str              # what was measured
    applicable: bool = True


def layer_coverage(driver, plan, result=None, xs=None) -> dict[str, Item]:
    """Coverage of ``plan`` run by ``driver`` (xs as LayerDriver.run draws them unless given);
    ``result`` (the RunResult) for the chip's tags: restarts count only where they showed."""
    from model.int_layer import int_run_layer
    cfg, q = driver.cfg, driver.q
    xs = driver.inputs(plan.tokens, seed=plan.seed + 1) if xs is None else np.asarray(xs, np.int64)
    traces: list[dict] = []
    int_run_layer(q, cfg, xs, plan.model_resets(), traces)
    fm = formats_for(cfg)
    s_lo, s_hi = -(1 << (cfg.formats.state_bits - 1)), (1 << (cfg.formats.state_bits - 1)) - 1
    r_lo, r_hi = -(1 << (fm.resid_bits - 1)), (1 << (fm.resid_bits - 1)) - 1

    def at_rail(v, lo, hi):
        v = np.asarray(v)
        return bool(np.any((v <= lo) | (v >= hi)))

    items: dict[str, Item] = {}
    state = sum(at_rail(t["S"], s_lo, s_hi) for t in traces)
    kS = sum(at_rail(t["kS"], s_lo, s_hi) for t in traces)
    u = sum(at_rail(t["u"], s_lo, s_hi) for t in traces)
    peak = max(int(np.abs(t["S"]).max()) for t in traces)
    items["state_saturation"] = Item("state saturation (S, kS, u at a state_bits rail)", state + kS + u > 0,
                                     f"S {state}, kS {kS}, u {u} tokens; max |S| {peak} of {s_hi}"
                                     + ("" if state + kS + u else " (directed: sim/tests/block/test_kda_delta.py "
                                                                  "extreme corners)"))
    h = sum(at_rail(t["h"], r_lo, r_hi) for t in traces)
    y = sum(at_rail(t["y"], r_lo, r_hi) for t in traces)
    items["residual_saturation"] = Item("residual saturation (h, y at a resid_bits rail)", h + y > 0,
                                        f"h {h}, y {y} tokens")
    m = cfg.model
    E, k = m.n_experts, m.top_k
    if q.dense is None:
        counts = np.zeros(E, np.int64)
        boundary = any_tie = 0
        for t in traces:
            counts[np.asarray(t["idx"])] += 1
            choice = np.asarray(t["score"]) + np.asarray(q.moe.bias)
            rest = np.delete(choice, t["idx"])
            boundary += bool(len(rest) and np.any(rest == choice[t["idx"][-1]]))
            any_tie += len(set(choice.tolist())) < E
        items["every_expert"] = Item("every expert chosen", bool(np.all(counts > 0)),
                                     f"{int(np.sum(counts > 0))} of {E} (counts {counts.tolist()})")
        items["ties"] = Item("router ties across the top-k boundary", boundary > 0,
                             f"{boundary} tokens at the boundary, {any_tie} with any equal choices"
                             + ("" if boundary else " (directed ties: sim/tests/block/test_moe.py, test_topk.py)"),
                             applicable=k < E)
    # a property of the config: "n/a" on a config without it (the random configs' long test
    # draws one config with k = 1 and one with k = E)
    items["k1"] = Item("k = 1", k == 1, f"top_k {k}", applicable=k == 1)
    items["kE"] = Item("k = E", k == E, f"top_k {k}, n_experts {E}", applicable=k == E)

    shown = _tag_restarts(plan, result)
    for key, label, where in (("restart_first", "restart by the stream's first bit", [t for t in plan.first if 0 < t < plan.tokens]),
                              ("restart_clear", "restart by CSR CLEAR", [t for t in plan.clears if 0 < t < plan.tokens]),
                              ("restart_reset", "reset with tokens inside, then a restart",
                               [] if plan.resumed is None else [plan.resumed])):
        seen = [t for t in where if shown is None or t in shown]
        items[key] = Item(label, bool(seen), f"{len(seen)} of {len(where)} planned (tokens {seen[:6]})"
                          + ("" if shown is not None else ", from the plan (no tags)"))
    items["tokens"] = Item("tokens checked", bool(result is None or len(result.idx)),
                           f"{plan.tokens} planned" + ("" if result is None else f", {len(result.idx)} outputs compared"))
    return items


def _tag_restarts(plan, result) -> set | None:
    """Input tokens whose output the chip tagged 0 (a sequence start it made)."""
    if result is None or result.tags is None:
        return None
    return {int(t) for t, tag in zip(result.idx, result.tags) if int(tag) == 0}


def coverage_path(cfg_name: str, root=None):
    return (REPO_ROOT / "build" / cfg_name if root is None else root) / "reports" / "coverage.md"


def record(cfg_name: str, run: str, items: dict[str, Item], root=None, note: str = ""):
    """Put run ``run``'s table into build/<cfg>/reports/coverage.md (other runs' sections kept)."""
    path = coverage_path(cfg_name, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    store = path.with_suffix(".json")
    runs = json.loads(store.read_text()) if store.exists() else {}
    runs[run] = {"note": note, "items": {key: asdict(it) for key, it in items.items()}}
    store.write_text(json.dumps(runs, indent=1))
    lines = [f"# Functional coverage: {cfg_name}", "",
             "Measured by run/coverage.py from the integer model's traces on each run's inputs and "
             "from the chip's output tags; written by the long (slow) layer tests.  \"hole\": the run "
             "did not exercise it; \"n/a\": the config cannot have it.", ""]
    for name, run_ in runs.items():
        lines += [f"## {name}", ""] + ([run_["note"], ""] if run_["note"] else [])
        lines += ["| item | covered | measured |", "|---|---|---|"]
        for it in run_["items"].values():
            mark = "n/a" if not it["applicable"] else ("yes" if it["covered"] else "**hole**")
            lines.append(f"| {it['name']} | {mark} | {it['value']} |")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def holes(items: dict[str, Item], claimed) -> list[str]:
    """The claimed items that the run did not cover (an applicable item not covered)."""
    return [f"{key}: {items[key].name} ({items[key].value})" for key in claimed
            if key in items and items[key].applicable and not items[key].covered]
