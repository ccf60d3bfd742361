"""`moekda config`: validate a config and print it, or describe every field."""
from __future__ import annotations

import json

from moekda.config import describe_fields, load_config


def configure(p):
    p.add_argument("--fields", action="store_true", help="describe every field, its default and range")
    p.add_argument("--json", action="store_true", help="print the resolved config as JSON")


def run(args) -> int:
    if args.fields:
        print(describe_fields())
        return 0
    cfg = load_config(args.config)
    if args.json:
        print(json.dumps(cfg.to_dict(), indent=2))
    else:
        print(f"{cfg.name}: valid ({cfg.source}, hash {cfg.hash()})")
    return 0
