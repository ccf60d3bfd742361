"""`moekda power`: power and energy per token from a gate-level run's switching activity.

The gate-level netlist (routed, or with --synth the synthesised one) runs
`--tokens` tokens after its LOAD on Icarus, bit-exact against the integer model;
its VCD over exactly those tokens goes to OpenROAD's read_vcd and report_power
(flow/power.py).  Needs OpenROAD (as `make pnr`)."""
from __future__ import annotations

import time

from moekda.cmd_synth import resolve_top
from moekda.config import load_config
from moekda.errors import UserError


def configure(p):
    p.add_argument("--synth", action="store_true",
                   help="the synthesised netlist, no wires (pre-layout); default: the routed chip")
    p.add_argument("--tokens", type=int, default=2, help="tokens in the measured window (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="model seed of the image the chip LOADs")


def run(args) -> int:
    from flow.paths import BuildPaths
    from flow.pnr import find_openroad
    from flow.power import design_files, power_from_vcd, read_window
    from pdk.kit import KitError, find_kit
    from sim.driver import LayerDriver, RunPlan

    if not 1 <= args.tokens <= 64:
        raise UserError(f"--tokens {args.tokens}: allowed range is 1 to 64 (gate level is slow)")
    cfg = load_config(args.config)
    openroad = find_openroad()
    top, block = resolve_top(None)
    build = BuildPaths.for_config(cfg, top=top, block=block)
    netlist, stage = design_files(build, routed=not args.synth)
    try:
        kit = find_kit(("liberty", "tech_lef", "cell_lef", "verilog_models"))
    except KitError as e:
        raise UserError(str(e)) from None
    vcd = build.root / "power" / stage / "activity.vcd"
    vcd.parent.mkdir(parents=True, exist_ok=True)
    vcd.unlink(missing_ok=True)
    print(f"power: gate-level run of {netlist.name}, {args.tokens} tokens after the LOAD (Icarus) ...")
    t0 = time.monotonic()
    driver = LayerDriver.from_seed(args.config, seed=args.seed)
    name = f"activity_{stage}"
    result = driver.run(RunPlan(tokens=args.tokens, stall=False, seed=args.seed), simulator="icarus",
                        netlist=netlist, name=name, activity_vcd=vcd)
    if not result.match:
        raise UserError(f"power: the gate-level run does not match the integer model: {result.summary()}")
    window = read_window(driver.build("icarus", False, netlist) / "runs" / name / "sim.log")
    print(f"power: {window.tokens} tokens in {window.ns:.0f} ns at the bench's clock, VCD {vcd.stat().st_size / 1e6:.0f} MB, "
          f"{time.monotonic() - t0:.0f} s; OpenROAD read_vcd and report_power ...")
    from sim.cocotb.tb_layer import CLOCK_NS
    m = power_from_vcd(build, kit, openroad, not args.synth, vcd, window,
                       scale=cfg.hw.clock_period_ns / CLOCK_NS)
    p = f"{stage}__power__vcd"
    print(f"power from activity: {m[p + '__total'] * 1e3:.1f} mW (activity {0.1} on inputs: "
          f"{m[stage + '__power__default__total'] * 1e3:.1f} mW); "
          f"{m[p + '__energy_per_token__j'] * 1e9:.2f} nJ per token over {window.tokens} tokens; "
          f"report {build.reports / f'power_vcd_{stage}.rpt'}")
    return 0
