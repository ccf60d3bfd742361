"""`moekda report`: rebuild report.md and its plots from metrics.json and the
raw reports of an earlier `moekda synth`, without rerunning any tool."""
from __future__ import annotations

from cli import UserError
from cli.cmd_synth import resolve_top
from moekda.config import load_config


def configure(p):
    p.add_argument("--top", help="the top whose reports to rebuild (default: the chip top of hw.tops)")


def run(args) -> int:
    from flow.paths import BuildPaths
    from flow.report import build_report
    from pdk.kit import KitError, find_kit

    cfg = load_config(args.config)
    try:
        kit = find_kit()
    except KitError as e:
        raise UserError(str(e)) from None
    top, block = resolve_top(args.top)
    paths = BuildPaths.for_config(cfg, top, block=block)
    if not paths.metrics.is_file():
        raise UserError(f"no {paths.metrics}: run `moekda synth -c {cfg.name}"
                        + (f" --top {top}" if args.top else "") + "` first")
    from flow.metrics import read as read_metrics
    design = read_metrics(paths.metrics).get("design__name")
    if design != top:
        raise UserError(f"{paths.metrics} holds top {design!r}, not {top!r}: run "
                        f"`moekda synth -c {cfg.name} --top {top}` (or `moekda report --top {design}`)")
    try:
        out = build_report(paths, kit.liberty)
    except (OSError, KeyError, ValueError) as e:
        raise UserError(f"cannot rebuild the report from {paths.reports}: {e!r}; "
                        f"rerun `moekda synth -c {cfg.name} --top {top}`") from None
    print(f"report: {out}")
    return 0
