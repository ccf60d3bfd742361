"""`moekda power`: energy per token from a gate-level run's switching activity.

The gate-level netlist (routed, or with --synth the synthesised one) runs
``--warmup`` + ``--tokens`` tokens after its LOAD on Verilator, first bit-exact
against the integer model, then twice more writing its activity (SAIF) up to the
warmup-th and up to the last token out; OpenROAD's report_power on that activity gives the
energy of the tokens between, in all and per block (flow/power.py).  Needs OpenROAD
(as `make pnr`)."""
from __future__ import annotations

import time

from cli.cmd_synth import resolve_top
from moekda.config import load_config, require_chip_formats
from moekda.errors import UserError

MAX_TOKENS = 1024


def configure(p):
    p.add_argument("--synth", action="store_true",
                   help="the synthesised netlist, no wires (pre-layout); default: the routed chip")
    p.add_argument("--tokens", type=int, default=16, help="tokens in the measured window (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2,
                   help="tokens out before the window, so that the pipeline is full (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="model seed of the image the chip LOADs")


def run(args) -> int:
    from flow.categories import titles
    from flow.paths import BuildPaths
    from flow.pnr import find_openroad
    from flow.power import design_files, power_from_saif
    from pdk.kit import KitError, find_kit
    from sim.cocotb.clocking import CLOCK_NS
    from run.driver import RunPlan, chip_driver

    if not 1 <= args.tokens <= MAX_TOKENS:
        raise UserError(f"--tokens {args.tokens}: allowed range is 1 to {MAX_TOKENS}")
    if not 1 <= args.warmup <= MAX_TOKENS:
        raise UserError(f"--warmup {args.warmup}: allowed range is 1 to {MAX_TOKENS} (the window starts at a token out)")
    cfg = load_config(args.config)
    require_chip_formats(cfg)       # MXFP4 / MXFP8: numpy models only (issue 48)
    openroad = find_openroad()
    top, block = resolve_top(None)
    build = BuildPaths.for_config(cfg, top=top, block=block)
    netlist, stage = design_files(build, routed=not args.synth)
    try:
        kit = find_kit(("liberty", "tech_lef", "cell_lef", "verilog_models"))
    except KitError as e:
        raise UserError(str(e)) from None
    work = build.root / "power" / stage
    driver = chip_driver(args.config, seed=args.seed)
    plan = RunPlan(tokens=args.warmup + args.tokens, stall=False, seed=args.seed)
    t0 = time.monotonic()
    print(f"power: {netlist.name} on Verilator, {plan.tokens} tokens after the LOAD, against the integer model "
          f"(the first gate-level build of a netlist takes minutes) ...", flush=True)
    check = driver.run(plan, simulator="verilator", netlist=netlist, name=f"power_check_{stage}", saif=True)
    if not check.match:
        raise UserError(f"power: the gate-level run does not match the integer model: {check.summary()}")
    stops = []
    for name, k in (("first", args.warmup), ("last", args.warmup + args.tokens)):
        print(f"power: activity up to token {k} out ({time.monotonic() - t0:.0f} s) ...", flush=True)
        stops.append(driver.activity(plan, netlist, work / f"{name}.saif", k, name=f"activity_{name}_{stage}"))
    print(f"power: OpenROAD report_power on each run's activity ({time.monotonic() - t0:.0f} s) ...", flush=True)
    m = power_from_saif(build, kit, openroad, not args.synth, stops[0], stops[1],
                        period_ns=cfg.hw.clock_period_ns, bench_period_ns=CLOCK_NS)
    p = f"{stage}__power__activity"
    print(f"power from activity: {m[p + '__total'] * 1e3:.1f} mW over {m[p + '__tokens']} tokens after "
          f"{m[p + '__warmup_tokens']} ({m[p + '__window__ns']:,.0f} ns at {cfg.hw.clock_period_ns:g} ns); "
          f"{m[p + '__energy_per_token__j'] * 1e9:.2f} nJ per token (activity {0.1} on every input: "
          f"{m[stage + '__power__default__total'] * 1e3:.1f} mW)")
    names = titles()
    per = sorted(((v, k.split("category:", 1)[1]) for k, v in m.items() if "__j__category:" in k), reverse=True)
    for joules, key in per:
        print(f"  {names.get(key, key):<52} {joules * 1e9:9.3f} nJ per token")
    from flow.report import build_report
    page = build_report(build, kit.liberty)      # report.md: energy per category beside the area
    print(f"report {build.reports / f'power_activity_{stage}.rpt'}; {page}; metrics {build.metrics}")
    return 0
