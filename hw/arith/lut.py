"""A lookup table: the hardware form of sigmoid and exp.

At int8 (``formats.lut_in_bits``) input widths a full table is exact with
respect to the integer model and small: the model's table *is* the table's
contents, so the RTL cannot drift from it.  Used by the KDA unit (sigmoid of
beta and of the output gate, the decay alpha), the MoE unit (router sigmoid)
and every SiLU (its sigmoid, hw/arith/silu.py); all of them the config's
constants (moekda/tables.py).

Addressing: the input is a signed ``in_bits`` integer ``x``; ``table`` lists
the outputs in order of increasing ``x``, i.e. ``table[x - x_min]``.  The ROM
is addressed by the two's-complement bit pattern of ``x`` with its sign bit
inverted, which is exactly ``x - x_min``: no adder.

Timing: one cycle.  ``data`` holds ``table[addr]`` of the cycle in which
``en`` was high and keeps it while ``en`` is low.
"""
from __future__ import annotations

from collections.abc import Sequence

from amaranth import Cat, Const, Module, Shape, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out


def table_shape(table: Sequence[int]) -> Shape:
    """The narrowest signed/unsigned shape holding every entry of ``table``."""
    lo, hi = min(table), max(table)
    if lo >= 0:
        return unsigned(max(1, hi.bit_length()))
    width = max(lo.bit_length(), hi.bit_length()) + 1  # bit_length(-x) ignores the sign
    return signed(width)


def tabulate(fn, in_bits: int) -> list[int]:
    """``fn(x)`` for every signed ``in_bits`` input, in increasing ``x`` order."""
    lo = -(1 << (in_bits - 1))
    return [int(fn(x)) for x in range(lo, -lo)]


def check_table(table: Sequence[int], in_bits: int, shape: Shape | None = None) -> tuple[list[int], Shape]:
    """The table as ints and its output shape; ValueError if they do not fit."""
    table = [int(v) for v in table]
    if len(table) != 1 << in_bits:
        raise ValueError(f"a {in_bits}-bit table needs {1 << in_bits} entries, got {len(table)}")
    s = Shape.cast(shape) if shape is not None else table_shape(table)
    lo, hi = min(table), max(table)
    s_lo = -(1 << (s.width - 1)) if s.signed else 0
    s_hi = (1 << (s.width - 1)) - 1 if s.signed else (1 << s.width) - 1
    if lo < s_lo or hi > s_hi:
        raise ValueError(f"table range {lo}..{hi} does not fit the output shape {s}")
    return table, s


class LookupTable(wiring.Component):
    """``data = table[addr - x_min]``, one cycle after ``en``; the table is an input.

    The entries come in on ``table`` (the chip's parameter bank, loaded from the
    memory image at run time: hw/image/param_map.py), so one netlist serves every model.
    Driven by constants (``LookupTable.rom``'s tests, or a bank tied off), synthesis
    folds the read back into ROM logic.

    Parameters
    ----------
    in_bits : int
        Width of the signed input; the table has ``2**in_bits`` entries.
    shape : Shape
        Shape of one entry.
    """

    def __init__(self, in_bits: int, shape):
        self.in_bits, self.shape = in_bits, Shape.cast(shape)
        super().__init__({
            "addr": In(signed(in_bits)),
            "en": In(1),
            "table": In(data.ArrayLayout(self.shape, 1 << in_bits)),
            "data": Out(self.shape),
        })

    def elaborate(self, platform):
        m = Module()
        sign = self.in_bits - 1
        # x - x_min == x with the sign bit flipped (offset binary)
        index = Cat(self.addr[:sign], ~self.addr[sign])
        with m.If(self.en):
            m.d.sync += self.data.eq(self.table[index])
        return m


def drive_constant(m: Module, lut: LookupTable, table: Sequence[int]) -> None:
    """Drive ``lut``'s entries with constants (a table the config fixes, moekda/tables.py):
    synthesis folds the read into ROM logic, with no register and no read multiplexer."""
    table, _ = check_table(table, lut.in_bits, lut.shape)
    m.d.comb += lut.table.as_value().eq(Cat(*(Const(v, lut.shape) for v in table)))
