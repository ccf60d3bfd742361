"""`moekda rules`: a bench record against its committed metric rules, or new rules from it

    moekda rules -c tiny                 # check bench/results/tiny.json against bench/rules/tiny.json
    moekda rules -c tiny --update        # write bench/rules/tiny.json from the record (an intended change)
    moekda rules -c tiny --tighten       # only the rules the record improves on

The rules file format, the metrics and their tolerances: flow/rules.py (METRICS) and
docs/bench.md.  Exit code 1 when a rule is violated (one line each), 2 when the check
cannot be made (a rules file or record that cannot be read, a metric the record lacks).
"""
from __future__ import annotations

from pathlib import Path

from cli import UserError
from moekda.config import load_config


def configure(p):
    what = p.add_mutually_exclusive_group()
    what.add_argument("--update", action="store_true",
                      help="write the rules from the record, every metric with its tolerance (after an intended change)")
    what.add_argument("--tighten", action="store_true",
                      help="replace only the rules the record improves on beyond their tolerance")
    p.add_argument("--record", type=Path, default=None, help="the bench record (default bench/results/<config>.json)")
    p.add_argument("--rules", type=Path, default=None, help="the rules file (default bench/rules/<config>.json)")


def run(args) -> int:
    from flow import rules

    name = load_config(args.config).name
    record_file = args.record or rules.record_path(name)
    rules_file = args.rules or rules.rules_path(name)
    record = rules.load_record(record_file)
    if not (args.update or args.tighten):
        return rules.report(name, record, rules_file, record_file)
    new = rules.generate(record, record_file)
    if new["config"] != name:
        raise UserError(f"{record_file} is a record of config {new['config']!r}, not {name!r}")
    old = rules.load_rules(rules_file) if rules_file.exists() else None
    if args.tighten:
        if old is None:
            raise UserError(f"no rules file {rules_file} to tighten (--update writes one)")
        new = rules.tightened(old, new)
    lines = rules.changes(old, new)
    for line in lines:
        print(f"  {line}")
    if not lines:
        print(f"moekda rules: {name}: {rules.display_path(rules_file)} unchanged")
        return 0
    rules.write(new, rules_file)
    print(f"moekda rules: {name}: wrote {rules.display_path(rules_file)} ({len(new['rules'])} rules)")
    return 0
