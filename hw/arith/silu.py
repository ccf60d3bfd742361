"""SiLU as x * sigmoid(x): the hardware of ``QSilu`` (model/int_ops.py ``int_silu``).

A code c at the model's scale becomes the sigmoid's input code in the config's fixed
format (moekda/tables.py): ``t = sat(rs(c * t_m, t_s))``, the loaded requantisation of
hw/arith/booth_multiply.py.  The sigmoid is ``SILU_SIGMOID``, a table of constants
(one cycle, ROM logic: no loaded entries, no read multiplexer of a bank).  The product
``c * sigmoid(t)`` is a Booth tree, and its requantisation ``sat(rs(p * m, s))`` to the
output's format another.  Each op (a code's source: the KDA's q, k, v; the MoE's and a
dense layer's gate) has its own (t_m, t_s, m, s), picked by ``live[op_key]``.

It replaces a loaded 256-entry table per SiLU (14,336 flip-flops of tiny's parameter
bank and their read multiplexers) with three multipliers and a constant table per unit.
The stages come from the clock period (hw/arith/pipeline.py); the caller reads
``live[out_key]`` in the stage the call returns (not registered).
"""
from __future__ import annotations

from amaranth import unsigned

from hw.arith.booth_multiply import booth_multiply, requantise
from hw.arith.lut import LookupTable, drive_constant
from moekda.formats import Formats
from moekda.tables import silu_sigmoid, silu_sigmoid_in_bits


def silu(pipe, live: dict, code_key: str, op_key: str, params, out_bits: int, fm: Formats,
         out_key: str = "silu") -> dict:
    """``live[out_key] = int_silu(params[op], live[code_key])`` for ``op = live[op_key]``.

    ``params`` lists ``(t_m, t_s, m, s)`` per op: signals of the parameter bank, static
    while the unit runs.  ``live[code_key]`` is a signed ``lut_in_bits`` code of the current
    stage; everything else in ``live`` travels alongside.  The result is signed
    ``out_bits``, combinational in the returned stage.
    """
    lb, uf, mb = fm.lut_in_bits, fm.unit_frac, fm.mult_bits
    # |c| <= 2**(lb-1) and sigmoid <= 2**uf: the product fits lb + uf + 1 signed bits
    p_bits = lb + uf + 1
    live = code_times_table(pipe, live, code_key, op_key, [(tm, ts) for tm, ts, _, _ in params], lb, fm,
                            silu_sigmoid_in_bits(fm), unsigned(uf + 1), silu_sigmoid(fm), "silu", "sigmoid", p_bits)
    # the tree's sum is the product modulo 2**p_bits: signed, as it fits
    product = live.pop("silu_p").as_signed()
    return requantise(pipe, live, product, op_key, [(mm, ss, out_bits) for _, _, mm, ss in params],
                      p_bits + mb + 2, out_key)


def code_times_table(pipe, live: dict, code_key: str, op_key: str, t_params, code_bits: int, fm: Formats,
                     t_bits: int, table_shape, table, key: str, table_name: str, p_bits: int,
                     extra_words=()) -> dict:
    """``live[key + "_p"] = c * TABLE[sat(rs(c * t_m, t_s))] + sum(extra_words)`` (modulo
    2**p_bits) for the code c = ``live[code_key]`` (signed ``code_bits``) and ``(t_m, t_s) =
    t_params[live[op_key]]``: the loaded requantisation to the table's ``t_bits`` input, the
    table of constants (a ROM, submodule ``<pipe>_<table_name>``), and the Booth product of
    the entry and the code.  SiLU's sigmoid (above) and SiTU-GLU's cap (hw/arith/situ.py)."""
    m = pipe.m
    live = requantise(pipe, live, live[code_key], op_key, [(tm, ts, t_bits) for tm, ts in t_params],
                      code_bits + fm.mult_bits + 2, f"{key}_t")
    # the constant table is ROM logic about as deep as a 2**t_bits : 1 multiplexer; its read
    # register ends the stage, and every other live value is registered with it
    live = pipe.spend(pipe.plan.delays.mux_level * t_bits, live)
    rom = LookupTable(t_bits, table_shape)
    m.submodules[f"{pipe.name}_{table_name}"] = rom
    drive_constant(m, rom, table)
    m.d.comb += [rom.addr.eq(live.pop(f"{key}_t")), rom.en.eq(1)]
    live = pipe.register(live)
    return booth_multiply(pipe, live, rom.data, live.pop(code_key), p_bits, f"{key}_p", extra_words=extra_words)
