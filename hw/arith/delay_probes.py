"""Small registered circuits that measure the delays in hw/arith/pipeline.py.

Each probe is registers -> one kind of operation from hw/arith/carry_save.py ->
registers, so its reg-to-reg arrival time (minus the launching flop's
clock-to-Q) is the logic delay of that operation on the library.

    .venv/bin/python -m hw.arith.delay_probes build/probes       # writes <probe>.v
    for p in build/probes/*.v; do
        .venv/bin/moekda synth -c small --verilog $p --top $(basename $p .v)
    done                                                   # reports per probe

The table NANGATE45 in hw/arith/pipeline.py records what these gave (docs/matvec.md).
"""
from __future__ import annotations

import sys
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Cat, Module, Signal, Value

from hw.arith.carry_save import booth_partial_products, prefix_add, reduce_to_two
from hw.arith.matvec import saturate
from hw.arith.pipeline import Pipe, plan_pipeline


def _registered(name: str, build, input_widths) -> str:
    m = Module()
    ports_in = [Signal(w, name=f"in{i}") for i, w in enumerate(input_widths)]
    regs_in = [Signal(w, name=f"in{i}_q") for i, w in enumerate(input_widths)]
    m.d.sync += [r.eq(p) for r, p in zip(regs_in, ports_in)]
    result = Value.cast(build(m, regs_in))
    out = Signal(len(result), name="out_q")
    m.d.sync += out.eq(result)
    return verilog.convert(m, name=name, ports=ports_in + [out], emit_src=False)


def _no_registers():
    return plan_pipeline(100.0)   # a budget no probe reaches: one stage


def _tree(m, words):
    live = reduce_to_two(Pipe(m, _no_registers(), "probe"), {"w": list(words)}, "w", len(words[0]))
    return Cat(*live["w"])


PROBES = {
    "probe_wire": (lambda m, i: i[0], [8]),                                   # clock-to-Q + setup only
    "probe_csa1": (_tree, [20] * 3),                                          # one 3:2 level
    "probe_csa4": (_tree, [20] * 9),                                          # four 3:2 levels
    "probe_booth8": (lambda m, i: Cat(*booth_partial_products(m, i[0], i[1], 20)), [8, 8]),
    **{f"probe_add{n}": ((lambda m, i: prefix_add(m, i[0], i[1])), [n, n]) for n in (8, 16, 32, 64)},
    "probe_shift49": (lambda m, i: i[0].as_signed() >> i[1], [49, 6]),          # 6 barrel levels
    "probe_saturate49": (lambda m, i: saturate(i[0], 8), [49]),
}


def main(argv=None) -> int:
    out_dir = Path((argv or sys.argv[1:] or ["build/probes"])[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (build, widths) in PROBES.items():
        (out_dir / f"{name}.v").write_text(_registered(name, build, widths))
        print(out_dir / f"{name}.v")
    return 0


if __name__ == "__main__":
    sys.exit(main())
