"""hw/mem/fakeram.py against the kit: the one table of macros (names, words, bits, area)
and the one port list against every fakeram45 Liberty and LEF file of pdk/nangate45;
the behavioural model against what the Liberty says the macro does (one-cycle read,
read-before-write, bit mask); the two faces of ``FakeRam`` (model, black-box instance)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from amaranth import Module
from amaranth.back import rtlil

from hw.mem.fakeram import FAKERAM45, MACRO_TARGET, FakeRam, choose_macros, instantiated_macros, model_verilog
from pdk.kit import find_kit
from sim.pysim import simulate


def _kit():
    try:
        return find_kit()
    except Exception as e:          # no kit extracted: nothing to compare against
        pytest.skip(f"Nangate45 kit: {e}")


def liberty_pins(text: str) -> tuple[dict, dict]:
    """{pin: (direction, width)} and the cell's attributes from a fakeram45 Liberty file."""
    types = {m.group(1): int(m.group(2)) for m in
             re.finditer(r"type\s*\((\w+)\)\s*\{[^}]*?bit_width\s*:\s*(\d+)", text)}
    pins = {}
    for m in re.finditer(r"\b(pin|bus)\((\w+)\)\s*\{(.*?)direction\s*:\s*(\w+)", text, re.S):
        kind, name, body, direction = m.groups()
        width = 1
        if kind == "bus":
            width = types[re.search(r"bus_type\s*:\s*(\w+)", body).group(1)]
        pins[name] = (direction, width)
    cell = {k: float(re.search(rf"\b{k}\s*:\s*([\d.]+)", text).group(1))
            for k in ("area", "address_width", "word_width")}
    return pins, cell


def lef_pins(text: str) -> tuple[dict, tuple[float, float]]:
    pins: dict[str, list] = {}
    for m in re.finditer(r"^\s*PIN\s+(\w+)(?:\[(\d+)\])?\s*$\s*DIRECTION\s+(\w+)", text, re.M):
        name, bit, direction = m.groups()
        pins.setdefault(name, [direction.lower(), 0])[1] += 1
    w, h = map(float, re.search(r"SIZE\s+([\d.]+)\s+BY\s+([\d.]+)", text).groups())
    return {k: tuple(v) for k, v in pins.items()}, (w, h)


def test_table_is_the_kits_macros():
    kit = _kit()
    assert {m.name for m in kit.macros} == set(FAKERAM45)


@pytest.mark.parametrize("name", sorted(FAKERAM45))
def test_ports_and_sizes_match_liberty_and_lef(name):
    kit = _kit()
    spec, macro = FAKERAM45[name], kit.macro(name)
    pins, cell = liberty_pins(macro.liberty.read_text())
    ours = {p: (d, w) for p, d, w in spec.ports()}
    assert pins == ours
    assert (cell["address_width"], cell["word_width"]) == (spec.addr_bits, spec.bits)
    assert 1 << spec.addr_bits == spec.words
    assert cell["area"] == pytest.approx(spec.area_um2, abs=1e-3)
    text = macro.liberty.read_text()
    # the read: a rising-edge arc from clk to rd_out (a registered, one-cycle read)
    rd = text[text.index("bus(rd_out)"):text.index("pin(we_in)")]
    assert re.search(r'related_pin\s*:\s*"?clk"?', rd) and "timing_type : rising_edge" in rd
    lef, (w, h) = lef_pins(macro.lef.read_text())
    power = {p: v for p, v in lef.items() if p in ("VDD", "VSS")}
    assert set(power) == {"VDD", "VSS"}
    assert {p: v for p, v in lef.items() if p not in power} == ours
    assert w * h == pytest.approx(spec.area_um2, rel=2e-3)


def test_choice_is_the_cheapest_array():
    assert choose_macros(32, 64).spec.name == "fakeram45_32x64" and choose_macros(32, 64).count == 1
    # a bank of a four-layer state (hw/kda/state.py): model-tiny's 128 words are more rows of
    # 64-word macros; model-small's 1024 are one row of the deepest, cheaper than 16 rows of 64
    tiny4, small4 = choose_macros(128, 64), choose_macros(1024, 64)
    assert (tiny4.spec.name, tiny4.rows, tiny4.cols) == ("fakeram45_64x32", 2, 2)
    assert (small4.spec.name, small4.rows, small4.cols) == ("fakeram45_1024x32", 1, 2)
    assert small4.area_um2 < 16 * 2 * FAKERAM45["fakeram45_64x32"].area_um2
    arr = choose_macros(256, 64)
    for spec in FAKERAM45.values():   # no other kind is cheaper
        n = -(-256 // spec.words) * -(-64 // spec.bits)
        assert arr.area_um2 <= n * spec.area_um2 + 1e-6


def test_model_reads_in_one_cycle_before_write_with_mask():
    spec = FAKERAM45["fakeram45_64x7"]
    dut = FakeRam(spec)
    rng = np.random.default_rng(0)
    shadow = rng.integers(0, 1 << spec.bits, spec.words)

    async def bench(ctx):
        for a, v in enumerate(shadow):
            ctx.set(dut.ce_in, 1)
            ctx.set(dut.we_in, 1)
            ctx.set(dut.addr_in, a)
            ctx.set(dut.wd_in, int(v))
            ctx.set(dut.w_mask_in, -1)
            await ctx.tick()
        for _ in range(200):
            a = int(rng.integers(spec.words))
            we = bool(rng.integers(2))
            wd, mask = int(rng.integers(1 << spec.bits)), int(rng.integers(1 << spec.bits))
            ctx.set(dut.ce_in, 1)
            ctx.set(dut.we_in, we)
            ctx.set(dut.addr_in, a)
            ctx.set(dut.wd_in, wd)
            ctx.set(dut.w_mask_in, mask)
            old = int(shadow[a])
            await ctx.tick()
            assert ctx.get(dut.rd_out) == old           # after the edge: the contents before it
            if we:
                shadow[a] = (wd & mask) | (old & ~mask)
            ctx.set(dut.ce_in, 0)                       # no access: rd_out holds (ORFS: X)
            ctx.set(dut.addr_in, (a + 1) % spec.words)
            await ctx.tick()
            assert ctx.get(dut.rd_out) == old

    simulate(dut, bench)


def test_instance_and_model_verilog():
    """On MACRO_TARGET a FakeRam is a cell of the macro's name with its pins; the model
    Verilog is a module of that name with the same pins and no reset."""
    spec = FAKERAM45["fakeram45_32x64"]
    m = Module()
    m.submodules.ram0 = ram = FakeRam(spec)
    text = rtlil.convert(m, platform=MACRO_TARGET, ports=[ram.ce_in, ram.rd_out])
    assert f"cell \\{spec.name} \\ram0" in text
    for pin, _d, _w in spec.ports():
        assert f"connect \\{pin} " in text, pin
    model = model_verilog(spec)
    header = re.search(rf"module {spec.name}\((.*?)\);", model).group(1)
    assert sorted(p.strip() for p in header.split(",")) == sorted(p for p, _d, _w in spec.ports())
    assert instantiated_macros(f"  {spec.name} ram0 (\n  fakeram45_1x1 x (\n") == [spec.name]
