"""`moekda drc`: KLayout DRC of the routed GDS with the platform's deck (flow/drc.py).

Runs after `moekda pnr`; needs the KLayout application (Debian's `klayout`).
Violations per rule group go into metrics.json and reports/drc.md."""
from __future__ import annotations

from cli.cmd_synth import resolve_top
from moekda.config import load_config
from moekda.errors import UserError


def configure(p):
    p.add_argument("--top", help="the top whose routed GDS to check (default: the chip top)")
    p.add_argument("--groups", default="BEOL,FEOL,OFFGRID,ANTENNA",
                   help="rule groups of the deck, run one at a time in this order (default: %(default)s)")


def run(args) -> int:
    from flow.drc import GROUPS, run_drc
    from flow.paths import BuildPaths
    from flow.pnr import PnrPaths
    from pdk.kit import KitError, find_kit

    cfg = load_config(args.config)
    groups = tuple(g.strip().upper() for g in args.groups.split(",") if g.strip())
    bad = [g for g in groups if g not in GROUPS]
    if bad or not groups:
        raise UserError(f"--groups {args.groups}: allowed are {', '.join(GROUPS)} (comma-separated)")
    try:
        kit = find_kit(("drc_deck", "gds"))
    except KitError as e:
        raise UserError(str(e)) from None
    top, block = resolve_top(args.top)
    build = BuildPaths.for_config(cfg, top=top, block=block)
    paths = PnrPaths(build)
    metrics = run_drc(paths.gds, kit.drc_deck, paths.root / "drc", build.logs, build.metrics,
                      build.reports / "drc.md", groups=groups, library_gds=kit.gds)
    print(f"drc: {metrics['drc__klayout__violations']} violations; table in {build.reports / 'drc.md'}")
    return 0
