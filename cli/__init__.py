"""The `moekda` command: one entry point that the Makefile targets call.

Each subcommand lives in its own module, which defines

    def configure(parser: argparse.ArgumentParser) -> None   # its options
    def run(args: argparse.Namespace) -> int                 # exit code

and is registered in COMMANDS below.  Modules are imported only when their
command runs, so `moekda --help` stays fast and a missing optional tool
cannot break unrelated commands.

Errors a user can fix (bad config, missing tool, bad input) are raised as
``UserError`` or ``ConfigError`` and printed as one line, exit code 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from moekda.config import ConfigError
from moekda.errors import UserError   # noqa: F401 - the commands import it from here


# name: (module, one-line help).  Keep in the order a user runs them.
COMMANDS: dict[str, tuple[str, str]] = {
    "config": ("cli.cmd_config", "show, validate and describe configs"),
    "rtl": ("cli.cmd_rtl", "write the Verilog of a top (build/<cfg>/rtl/<top>.v)"),
    "accuracy": ("cli.cmd_accuracy", "integer vs float model error table (build/<cfg>/reports/accuracy.*)"),
    "image": ("cli.cmd_image", "memory image of a quantised model (header, parameters, matrices) for the chip's LOAD"),
    "vectors": ("cli.cmd_vectors", "export integer parameters, inputs and expected outputs as .npz"),
    "synth": ("cli.cmd_synth", "Yosys + OpenSTA to Nangate45: area, timing, power, report.md"),
    "report": ("cli.cmd_report", "rebuild report.md from an earlier synth's reports"),
    "run": ("cli.cmd_run", "run tokens (or generate from a prompt on a model chip) through the chip's simulation and the integer model, compare"),
    "demo": ("cli.cmd_demo", "a committed trained model on its task: accuracy at float, integer and the chip's RTL, cycles per token"),
    "generate": ("cli.cmd_generate", "text from a character model (byte vocabulary), generated on the chip's RTL"),
    "bench": ("cli.cmd_bench", "measured cycles/token vs roofline, Fmax, area, energy -> bench/results/"),
    "rules": ("cli.cmd_rules", "check a bench record against its committed metric rules (bench/rules/), or update them"),
    "context": ("cli.cmd_context", "cycles and bytes per token of each layer kind from context 16 to 4096; the hybrid's cache saving"),
    "sweep": ("cli.cmd_sweep", "design-space sweep (rtl, synth, STA, cycles) in parallel -> Pareto table and plot"),
    "pnr": ("cli.cmd_pnr", "OpenROAD place and route on Nangate45 (--check: static checks without OpenROAD)"),
    "orfs": ("cli.cmd_orfs", "design directory (config.mk, constraint.sdc, Verilog) for stock OpenROAD-flow-scripts"),
    "power": ("cli.cmd_power", "power and energy per token from a gate-level run's switching activity (OpenROAD)"),
    "drc": ("cli.cmd_drc", "KLayout DRC of the routed GDS with the platform's deck, rule group by group"),
}


def _add_config_arg(p: argparse.ArgumentParser):
    p.add_argument("-c", "--config", default="tiny",
                   help="config name under configs/ or a path to a .toml file (default: tiny)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moekda",
        description="Generator of a KDA + MoE inference accelerator and its open Nangate45 flow.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_config_arg(p)
        p.set_defaults(_module=module)
        # configure() is cheap by contract: it only declares options
        importlib.import_module(module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except (ConfigError, UserError) as e:
        print(f"moekda {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"moekda {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
