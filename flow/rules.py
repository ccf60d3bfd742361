"""Metric rules of the bench records, the OpenROAD-flow-scripts way (issue 49 item 8).

ORFS commits, beside each design, a ``rules-base.json``: for each metric a bound (``value``)
and the comparison a run's metric must pass (``compare``, e.g. ``<=``), generated from a
good run's metrics with a tolerance and checked against every later run, so a change
that costs area or Fmax fails the flow instead of passing unnoticed.  moekda's equivalent:

* ``bench/rules/<config>.json`` beside ``bench/results/<config>.json``::

      {"config": "tiny",
       "from": {"commit": "91dad17...", "date": "2026-12-07 10:20 UTC"},   # the record they came from
       "rules": {"area_um2": {"value": 267220.0, "compare": "<="},
                 "fmax_mhz": {"value": 854.6, "compare": ">="}, ...}}

  Each rule names a field of the bench record (studies/bench.py ``assemble``).
* ``METRICS`` below is the one place the metrics, their direction and their tolerances live.
* ``moekda bench`` checks the record it just wrote; ``moekda rules -c CFG`` checks the
  committed record; ``moekda rules -c CFG --update`` writes the rules from the record after an
  intended change (``--tighten``: only the rules the record improves on); a fast test
  (flow/tests/test_rules.py) checks every committed record against its rules.

A violated rule is one line (metric, value, rule) and exit code 1; a rules file that cannot
be read, a metric the record lacks or an unknown metric name is a ``UserError``: one line
naming the file and the field and what is allowed, exit code 2.
"""
from __future__ import annotations

import json
import math
import operator
import sys
from dataclasses import dataclass
from pathlib import Path

from flow.paths import RESULTS_DIR, RULES_DIR
from moekda.config import REPO_ROOT
from moekda.errors import UserError


@dataclass(frozen=True)
class Metric:
    compare: str         # what the record's value must satisfy against the rule's value
    tolerance: float     # the rule's margin over the record it is generated from (relative)
    what: str
    hint: str = ""       # how a record gets the metric when it lacks it


SIMULATED_ENERGY, ESTIMATED_ENERGY = "energy_per_token_nj_simulated", "energy_per_token_nj"

# The metrics a rules file may name, in the order they are written, with their tolerances.
# Synthesis, STA and the simulation are deterministic with the pinned tools, so a margin is for
# the small shifts an unrelated change brings (Yosys/ABC restructuring, a cycle of control), and
# each is well under the 10 % loss issue 49 asks to catch.
METRICS: dict[str, Metric] = {
    "area_um2": Metric("<=", 0.02, "cell area after synthesis, macros included, um2",
                       "`moekda bench --synth` adds the synthesis figures"),
    "sequential_share": Metric("<=", 0.03, "the sequential cells' share of the cell area",
                               "`moekda bench --synth` adds the synthesis figures"),
    "fmax_mhz": Metric(">=", 0.03, "post-synthesis Fmax, reg-to-reg, MHz",
                       "`moekda bench --synth` adds the synthesis figures"),
    "cycles_per_token": Metric("<=", 0.01, "measured cycles per token"),
    "measured_weight_bytes_per_token": Metric("<=", 0.01, "weight bytes per token measured on the port"),
    # energy per token: the figure from simulated activity when the record has one, else the
    # activity-0.1 estimate (a rules file holds one of the two)
    SIMULATED_ENERGY: Metric("<=", 0.05, "energy per token from simulated activity, nJ",
                             "`moekda power -c CONFIG --synth` before `moekda bench` adds it"),
    ESTIMATED_ENERGY: Metric("<=", 0.05, "energy per token at activity 0.1 (estimate), nJ",
                             "`moekda bench --synth` adds the synthesis figures"),
}
# a rules file generated from a record needs these (and one energy figure)
REQUIRED = ("area_um2", "fmax_mhz", "cycles_per_token", "measured_weight_bytes_per_token")
OPS = {"<=": operator.le, ">=": operator.ge}
SIGNIFICANT_DIGITS = 5     # of a generated rule's value, rounded towards the lenient side
FILE_KEYS = ("config", "from", "rules")

# Bench records with no rules yet, each with the reason: a record of an older chip would only
# lock in stale figures.  Regenerate the record (`make bench` has each command), then
# `moekda rules -c CONFIG --update` and drop the entry (flow/tests/test_rules.py insists that
# every other record has rules, and that no entry here has).
NOT_YET_RULED = {
    "small": "the chip of 29 November with its model baked in (no commit, no date), not today's programmable small",
    "model-tiny": "made at 2e046df (2 December, working tree changed); hw/ has changed since",
    "model-small": "made at 87234c1 (6 December), before SiLU as c * sigmoid (032ac79) and clock gating "
                   "by default (a411ab0)",
    "model-small-sram": "made at 9ff8a75 (6 December), before SiLU as c * sigmoid (032ac79) and clock gating "
                        "by default (a411ab0)",
    "model-tiny-kda-mla": "made at 00f52c6 (4 December, working tree changed); hw/ has changed since",
}


def rules_path(config: str) -> Path:
    return RULES_DIR / f"{config}.json"


def record_path(config: str) -> Path:
    return RESULTS_DIR / f"{config}.json"


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _num(v) -> str:
    return f"{v:,.7g}"


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ---- reading ---------------------------------------------------------------------

def _read_json(path: Path, what: str, hint: str = "") -> dict:
    if not path.is_file():
        raise UserError(f"no {what} {display_path(path)}" + (f" ({hint})" if hint else ""))
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{display_path(path)}: not a JSON {what} ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{display_path(path)}: a {what} is a JSON object, not {type(data).__name__}")
    return data


def load_rules(path: Path) -> dict:
    """A rules file, checked field by field: every problem is one UserError line naming the
    file, the field and what is allowed."""
    where = display_path(path)
    data = _read_json(path, "rules file", f"`moekda rules -c {path.stem} --update` writes one from the record")
    if sorted(data) != sorted(FILE_KEYS):
        raise UserError(f"{where}: top-level keys {sorted(data)}: allowed exactly {', '.join(FILE_KEYS)}")
    if not isinstance(data["config"], str) or not data["config"]:
        raise UserError(f"{where}: config = {data['config']!r}: must be the config's name")
    if not isinstance(data["from"], dict):
        raise UserError(f"{where}: from = {data['from']!r}: must be an object (the record's commit and date)")
    rules = data["rules"]
    if not isinstance(rules, dict) or not rules:
        raise UserError(f"{where}: rules must be a non-empty object of metric: {{value, compare}}")
    for name, rule in rules.items():
        if name not in METRICS:
            raise UserError(f"{where}: rules.{name}: unknown metric; allowed: {', '.join(METRICS)}")
        if not isinstance(rule, dict) or sorted(rule) != ["compare", "value"]:
            raise UserError(f"{where}: rules.{name} = {rule!r}: must be an object of exactly value and compare")
        want = METRICS[name].compare
        if rule["compare"] != want:
            raise UserError(f"{where}: rules.{name}.compare = {rule['compare']!r}: allowed {want!r} "
                            f"(the direction of {METRICS[name].what} is fixed in flow/rules.py METRICS)")
        if not _is_number(rule["value"]):
            raise UserError(f"{where}: rules.{name}.value = {rule['value']!r}: must be a finite number")
    if {SIMULATED_ENERGY, ESTIMATED_ENERGY} <= set(rules):
        raise UserError(f"{where}: rules name both {SIMULATED_ENERGY} and {ESTIMATED_ENERGY}: allowed one "
                        "(the simulated figure when the record has it)")
    return data


def load_record(path: Path) -> dict:
    return _read_json(path, "bench record")


# ---- checking --------------------------------------------------------------------

@dataclass(frozen=True)
class Violation:
    metric: str
    value: float
    compare: str
    bound: float

    def line(self) -> str:
        return f"{self.metric} = {_num(self.value)} violates rule {self.compare} {_num(self.bound)}"


def check(record: dict, rules: dict, rules_file: Path, record_file: Path | None = None,
          unmeasured: list[str] | None = None) -> list[Violation]:
    """The rules ``record`` breaks.  A record of another config, or one that lacks a metric a
    rule names, is a UserError (the check cannot be made), not a violation; unless
    ``unmeasured`` is a list: then such a metric is appended to it and not checked (a fresh
    bench run without a step that needs another tool, e.g. OpenROAD for the simulated energy)."""
    where = display_path(rules_file)
    rec_name = display_path(record_file) if record_file else "the record"
    if record.get("config") != rules["config"]:
        raise UserError(f"{where}: rules of config {rules['config']!r}, but {rec_name} is of "
                        f"{record.get('config')!r}")
    out = []
    for name, rule in rules["rules"].items():
        value = record.get(name)
        if value is None and unmeasured is not None:
            unmeasured.append(name)
            continue
        if not _is_number(value):
            hint = METRICS[name].hint.replace("CONFIG", rules["config"])
            raise UserError(f"{rec_name} has no {name} ({'missing' if value is None else repr(value)}), "
                            f"which {where} rules {rule['compare']} {_num(rule['value'])}"
                            + (f"; {hint}" if hint else ""))
        if not OPS[rule["compare"]](value, rule["value"]):
            out.append(Violation(name, value, rule["compare"], rule["value"]))
    return out


def report(config: str, record: dict, rules_file: Path | None = None, record_file: Path | None = None,
           prog: str = "moekda rules", missing_ok: bool = False) -> int:
    """Check ``record`` against the config's rules and say so: one line per violated rule and a
    summary; 0 when every rule holds, 1 when one does not.  ``missing_ok`` (a fresh bench run):
    a config with no rules file passes with a note (nobody has ruled it yet), and so does a
    metric the run did not measure (named in a note: the committed record must have it)."""
    rules_file = rules_file or rules_path(config)
    if missing_ok and not rules_file.exists():
        print(f"{prog}: {config}: no rules file {display_path(rules_file)}, metrics not checked "
              f"(`moekda rules -c {config} --update` writes one from the record)")
        return 0
    rules = load_rules(rules_file)
    unmeasured: list[str] | None = [] if missing_ok else None
    bad = check(record, rules, rules_file, record_file, unmeasured)
    n = len(rules["rules"]) - len(unmeasured or [])
    for name in unmeasured or []:
        hint = METRICS[name].hint.replace("CONFIG", config)
        print(f"{prog}: {config}: {name} not measured by this run, its rule not checked"
              + (f" ({hint})" if hint else ""))
    if not bad:
        print(f"{prog}: {config}: all {n} checked metric rules of {display_path(rules_file)} hold")
        return 0
    for v in bad:
        print(f"{prog}: {config}: {v.line()} ({display_path(rules_file)})", file=sys.stderr)
    print(f"{prog}: {config}: {len(bad)} of {n} metric rules violated; if the change is intended, "
          f"`moekda rules -c {config} --update` and commit the rules with the record", file=sys.stderr)
    return 1


# ---- generating ------------------------------------------------------------------

def lenient_round(x: float, compare: str, digits: int = SIGNIFICANT_DIGITS) -> float:
    """``x`` to ``digits`` significant digits, rounded the way that keeps the rule passable:
    up for ``<=``, down for ``>=`` (a record exactly at its tolerance still passes)."""
    if x == 0:
        return 0.0
    exp = math.floor(math.log10(abs(x))) - (digits - 1)
    step = 10.0 ** exp
    n = math.ceil(x / step) if compare == "<=" else math.floor(x / step)
    return round(n * step, max(0, -exp))


def rule_value(name: str, value: float) -> float:
    m = METRICS[name]
    margin = 1 + m.tolerance if m.compare == "<=" else 1 - m.tolerance
    return lenient_round(value * margin, m.compare)


def generate(record: dict, record_file: Path) -> dict:
    """The rules of ``record``: every metric of METRICS it has (the simulated energy in place of
    the estimate), each the record's value with its tolerance."""
    where = display_path(record_file)
    missing = [n for n in REQUIRED if not _is_number(record.get(n))]
    if missing:
        hints = sorted({METRICS[n].hint for n in missing if METRICS[n].hint})
        raise UserError(f"{where} has no {', '.join(missing)}: rules need {', '.join(REQUIRED)} and an energy "
                        "per token" + (f" ({'; '.join(hints)})" if hints else ""))
    names = [n for n in METRICS if _is_number(record.get(n))]
    if SIMULATED_ENERGY in names and ESTIMATED_ENERGY in names:
        names.remove(ESTIMATED_ENERGY)
    if SIMULATED_ENERGY not in names and ESTIMATED_ENERGY not in names:
        raise UserError(f"{where} has no energy per token ({SIMULATED_ENERGY} or {ESTIMATED_ENERGY}); "
                        f"{METRICS[ESTIMATED_ENERGY].hint}")
    for n in names:
        if record[n] <= 0:
            raise UserError(f"{where}: {n} = {record[n]!r}: a rule is the record's value with a relative "
                            "tolerance, so the value must be positive")
    if not isinstance(record.get("config"), str):
        raise UserError(f"{where}: config = {record.get('config')!r}: a bench record names its config")
    return {"config": record["config"],
            "from": {"commit": record.get("commit"), "date": record.get("date")},
            "rules": {n: {"value": rule_value(n, record[n]), "compare": METRICS[n].compare} for n in names}}


def tightened(old: dict, new: dict) -> dict:
    """ORFS's ``--tighten``: ``old``'s rules, each replaced by ``new``'s where that is stricter
    (the record improved on it beyond its tolerance); metrics ``new`` lacks keep their rule."""
    rules = {}
    for name, rule in old["rules"].items():
        cand = new["rules"].get(name)
        stricter = cand is not None and cand["value"] != rule["value"] and OPS[rule["compare"]](cand["value"], rule["value"])
        rules[name] = cand if stricter else rule
    return {**old, "from": new["from"], "rules": rules}


def changes(old: dict | None, new: dict) -> list[str]:
    """One line per rule added, changed or dropped, for the command's output."""
    before = old["rules"] if old else {}
    lines = []
    for name in dict.fromkeys([*before, *new["rules"]]):
        a, b = before.get(name), new["rules"].get(name)
        if a == b:
            continue
        lines.append(f"{name}: " + ("(none)" if a is None else f"{a['compare']} {_num(a['value'])}") + " -> "
                     + ("(dropped)" if b is None else f"{b['compare']} {_num(b['value'])}"))
    return lines


def write(rules: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rules, indent=4) + "\n")
