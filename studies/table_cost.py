"""What a loadable nonlinearity table costs against the ROM it replaced (issue 13).

    .venv/bin/python studies/table_cost.py [tiny|small]   -> bench/results/table-cost-<cfg>.json

For each of the eight tables: the ROM of seed 0's contents (what the RTL had before the
tables became run-time inputs: an Amaranth Memory with init, folded into logic by
synthesis) against hw/arith/lut.py's LookupTable (a 256:1 multiplexer over its ``table``
input; the 256 entries themselves are in the parameter bank, counted there).  Yosys +
ABC to the kit's Nangate45 cells, one table at a time, area from the liberty file.
"""
import json
import subprocess
import sys
from pathlib import Path
from amaranth import Module, Cat, signed, Shape
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.back import verilog
from hw.arith.lut import LookupTable, check_table
from hw.image.param_map import table_fields
from moekda.config import load_config
from model.quantize import quantize_random_layer
from pyosys import libyosys as ys  # noqa: E402

from pdk.kit import find_kit

LIB = str(find_kit().liberty)
WORK = Path("build/table_cost")

class Rom(wiring.Component):
    def __init__(self, table, in_bits, shape):
        self.table, self.in_bits, self.shp = table, in_bits, shape
        super().__init__({"addr": In(signed(in_bits)), "en": In(1), "data": Out(shape)})
    def elaborate(self, platform):
        m = Module()
        m.submodules.rom = rom = memory.Memory(shape=self.shp, depth=len(self.table), init=self.table)
        rd = rom.read_port(domain="sync")
        s = self.in_bits - 1
        m.d.comb += [rd.addr.eq(Cat(self.addr[:s], ~self.addr[s])), rd.en.eq(self.en), self.data.eq(rd.data)]
        return m

def area(v, top):
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "t.v").write_text(v)
    d = ys.Design()
    for cmd in [f"read_verilog -sv {WORK / 't.v'}", f"hierarchy -top {top}", f"synth -top {top} -noabc",
                f"dfflibmap -liberty {LIB}", f"abc -liberty {LIB} -D 1250", "opt_clean",
                f"tee -q -o {WORK / 's.json'} stat -json -liberty {LIB}"]:
        ys.run_pass(f"tee -q -a {WORK / 'yosys.log'} {cmd}", d)     # the log to a file, not the terminal
    return json.loads((WORK / "s.json").read_text())["design"]["area"]

def main(name: str) -> dict:
    cfg = load_config(name)
    flat = quantize_random_layer(cfg, 0).to_flat()
    in_bits = cfg.formats.lut_in_bits
    rows = []
    for table, bits, sgn, _doc in table_fields(cfg):
        shape = signed(bits) if sgn else Shape(bits, False)
        t = [int(x) for x in flat[f"{table}.table"]]
        rows.append({"table": table, "entry_bits": bits,
                     "rom_um2": area(verilog.convert(Rom(t, in_bits, shape), name="rom", emit_src=False), "rom"),
                     "read_mux_um2": area(verilog.convert(LookupTable(in_bits, shape), name="tab",
                                                          emit_src=False), "tab"),
                     "storage_bits": bits << in_bits})
        print(f"| {table} | {bits} | {rows[-1]['rom_um2']:,.0f} | {rows[-1]['read_mux_um2']:,.0f} |", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"config": cfg.name, "command": f"python studies/table_cost.py {name}", "commit": commit,
           "tables": rows, "rom_um2": sum(r["rom_um2"] for r in rows),
           "read_mux_um2": sum(r["read_mux_um2"] for r in rows),
           "storage_bits": sum(r["storage_bits"] for r in rows)}
    print(f"| total | | {out['rom_um2']:,.0f} | {out['read_mux_um2']:,.0f} | ({out['storage_bits']} bits in the bank)")
    path = Path("bench/results") / f"table-cost-{cfg.name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny")
