"""`moekda pnr`: OpenROAD place and route (flow/pnr.py); `--check` checks the scripts without OpenROAD."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from moekda.config import load_config, require_chip_formats


def configure(p):
    p.add_argument("--top", default=None,
                   help="the synthesised top to place and route (default: the chip top, as for `moekda synth`)")
    p.add_argument("--check", action="store_true",
                   help="do not run OpenROAD: check the stage scripts with tclsh stand-ins, the kit names "
                        "they use, and the constraints with OpenSTA")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="OpenROAD threads (default: all cores)")
    from flow.pnr import STAGES
    p.add_argument("--record", action="store_true",
                   help="do not run OpenROAD: write the last run's metrics, stage times and picture to "
                        "bench/results/pnr-<config>.{json,md,png} with the commit and OpenROAD version")
    p.add_argument("--fast", action="store_true",
                   help="exploration mode (flow/pnr.py PNR_MODES): no timing-driven global placement, no "
                        "repair after global routing, detailed routing capped; files under pnr-fast/, kept "
                        "apart from the sign-off run's (with --record: bench/results/pnr-<config>-fast.*)")
    p.add_argument("--pictures", metavar="STAGE", choices=[s.name for s in STAGES], default=None,
                   help="do not run the flow: draw the blocks and placement-density pictures of a finished "
                        "stage's database (pnr/<top>-<stage>-{blocks,density}.png; the routed layout gets "
                        "them at the end of every run)")
    p.add_argument("--from", dest="first", choices=[s.name for s in STAGES], default=None,
                   help="start at this stage, reusing the earlier stages' databases")
    p.add_argument("--to", dest="last", choices=[s.name for s in STAGES], default=None,
                   help="stop after this stage (a floorplan or a placement to look at; `--from` goes on)")


def run(args) -> int:
    from flow.paths import BuildPaths
    from pdk.kit import KitError, find_kit
    from cli import UserError

    from cli.cmd_synth import resolve_top

    cfg = load_config(args.config)

    require_chip_formats(cfg)       # MXFP4 / MXFP8: numpy models only (issue 48)
    mode = "fast" if args.fast else "signoff"
    if args.check:
        try:
            top, block = resolve_top(args.top)
        except UserError:
            top, block = "layer", False     # no chip top known yet: the scripts do not depend on it
        return _check(cfg, BuildPaths.for_config(cfg, top=top, block=block), mode)
    from flow.pnr import STAGES, find_openroad, run_pnr
    openroad = find_openroad()      # first: without OpenROAD, stop before anything else
    top, block = resolve_top(args.top)   # the same top and build layout as `moekda synth`
    build = BuildPaths.for_config(cfg, top=top, block=block)
    if args.record:
        from flow.paths import RESULTS_DIR
        from flow.pnr import openroad_version, record
        for path in record(cfg, build, RESULTS_DIR, openroad_version(openroad), mode=mode):
            print(f"wrote {path}")
        return 0
    try:
        kit = find_kit(("liberty", "tech_lef", "cell_lef", "gds"))
    except KitError as e:
        raise UserError(str(e)) from None
    if args.pictures:
        from flow.pnr import PnrPaths, stage_named, stage_pictures
        for path in stage_pictures(cfg, kit, openroad, PnrPaths(build, mode), stage_named(args.pictures)):
            print(f"wrote {path}")
        return 0
    if args.threads < 1:
        raise UserError(f"--threads {args.threads}: allowed range is 1 or more")
    metrics = run_pnr(cfg, build, kit, openroad, threads=args.threads, first=args.first, last=args.last,
                      mode=mode)
    if args.last and args.last != STAGES[-1].name:
        return 0
    for name in ("finish__design__instance__area", "finish__timing__setup__ws", "finish__timing__hold__ws",
                 "finish__power__total", "route__drc_errors"):
        print(f"{name:36} {metrics.get(name)}")
    return 0


def _check(cfg, build, mode: str) -> int:
    """The static checks of flow/openroad/check.py on this config's settings in ``mode``."""
    from flow.openroad.check import CheckError, check_kit_names, check_sdc_with_sta, run_stub_stages
    from flow.pnr import PnrPaths, pnr_settings, synth_area, write_config_tcl
    from pdk.kit import KitError, find_kit
    from cli import UserError

    try:
        kit = find_kit()
    except KitError as e:
        raise UserError(str(e)) from None
    have_synth = build.netlist.is_file() and build.sdc.is_file()
    with tempfile.TemporaryDirectory(prefix="moekda-pnr-check-") as tmp:
        tmp = Path(tmp)
        # the check writes nothing under build/: its own copy of the pnr directory tree
        paths = PnrPaths(type(build)(root=tmp / "build", top=build.top, block=build.block), mode).make_dirs()
        netlist, sdc = build.netlist, build.sdc
        if not have_synth:
            # stand-in files so the scripts' reads resolve; the SDC check below is skipped
            netlist, sdc = tmp / "netlist.v", tmp / "constraints.sdc"
            netlist.write_text(f"module {build.top}(); endmodule\n")
            sdc.write_text("")
        settings = pnr_settings(cfg, kit, paths, netlist, sdc, design_area_um2=synth_area(build) if have_synth else None)
        write_config_tcl(settings, paths.config_tcl)
        from flow.openroad.commands import OPENROAD_VERSION
        try:
            runs = run_stub_stages(paths.config_tcl, tmp / "stubs")
            print(f"stage scripts: {len(runs)} stages sourced by tclsh with OpenROAD stand-ins, "
                  f"{sum(len(r.calls) for r in runs)} commands, every option in the help of OpenROAD "
                  f"{OPENROAD_VERSION}: ok")
            used = check_kit_names(runs, kit.tech_lef, kit.cell_lef)
            print(f"kit names: {len(used['layers'])} layers, {len(used['sites'])} site, {len(used['cells'])} "
                  f"cells, {len(used['lib_pins'])} tie pins found in {kit.tech_lef.name} and "
                  f"{kit.cell_lef.name}: ok")
            if have_synth:
                out = check_sdc_with_sta(settings["LIB_FILES"], build.netlist, build.top, build.sdc, tmp)
                note = re.search(r"There (?:is|are) (\d+) unconstrained endpoints?", out)
                print(f"constraints: {build.sdc} loads on {build.netlist.name} in OpenSTA without warnings: ok"
                      + (f" ({note.group(1)} registers with a constant D are unconstrained)" if note else ""))
            else:
                print(f"constraints: skipped, no synthesis output at {build.netlist} (run `make synth`)")
        except CheckError as e:
            # a failed check is a finding about the scripts, reported in one line like any bad input
            raise UserError(f"pnr --check: {' '.join(str(e).split())[:600]}") from None
    return 0
