"""`moekda orfs`: a design directory for stock OpenROAD-flow-scripts (flow/orfs.py).

    moekda orfs -c tiny --top matvec -o build/orfs-matvec            ORFS synthesises the RTL
    moekda orfs -c tiny --top matvec --netlist -o build/orfs-matvec  ORFS places our netlist
    make -C ORFS/flow DESIGN_CONFIG=$PWD/build/orfs-matvec/config.mk

See docs/orfs.md.
"""
from __future__ import annotations

from pathlib import Path

from cli import UserError
from moekda.config import load_config, require_chip_formats


def configure(p):
    p.add_argument("--top", default=None,
                   help="the top to write (default: the chip top, as for `moekda synth`)")
    p.add_argument("--netlist", action="store_true",
                   help="ORFS places `moekda synth`'s netlist (SYNTH_NETLIST_FILES) instead of "
                        "synthesising the RTL itself")
    p.add_argument("--compare", type=Path, default=None, metavar="WORK_HOME",
                   help="instead: put the finished ORFS run under WORK_HOME next to `moekda pnr`'s "
                        "metrics.json, as JSON in -o FILE")
    p.add_argument("--orfs-version", default=None,
                   help="with --compare: the ORFS commit to record (its logs do not name it)")
    # not required=True: argparse would print usage and an error, two lines; a UserError is one
    p.add_argument("-o", "--output", type=Path, default=None, metavar="DIR",
                   help="design directory to write (new, empty, or written by moekda orfs before)")


def run(args) -> int:
    from flow.orfs import write_orfs_design
    from flow.paths import BuildPaths
    from cli.cmd_synth import resolve_top

    if args.output is None:
        raise UserError("-o is required: the design directory to write (with --compare: the JSON file)")
    cfg = load_config(args.config)
    require_chip_formats(cfg)       # MXFP4 / MXFP8: numpy models only (issue 48)
    top, block = resolve_top(args.top)   # the same top and build layout as `moekda synth`
    if args.compare is not None:
        from flow.orfs import write_comparison
        table = write_comparison(cfg, BuildPaths.for_config(cfg, top=top, block=block), args.compare,
                                 args.output, orfs_version=args.orfs_version)
        for name, row in table["metrics"].items():
            print(f"{name:42} moekda {row['moekda']!s:>22}   orfs {row['orfs']!s:>22}")
        print(f"written: {args.output}")
        return 0
    write_orfs_design(cfg, BuildPaths.for_config(cfg, top=top, block=block), args.output,
                      with_netlist=args.netlist)
    return 0
