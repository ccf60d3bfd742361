"""SiTU-GLU's up branch, 25 tanh(u/25) = c * F(t): the hardware of ``int_cap``
(model/int_ops.py; model.glu = "situ", moekda/tables.py).

An int8 up code c at its expert's scale becomes CAP's input code in the config's fixed format
(+-64): ``t = sat(rs(c * t_m, t_s))``, the loaded requantisation of
hw/arith/booth_multiply.py with the expert's (t_m, t_s), picked by ``live[op_key]`` (the bank).
CAP (F = tanh(x/25) / (x/25) as U1.CAP_FRAC) is a table of constants: one cycle of ROM logic.
The product c * F with the rounding constant 2**(CAP_FRAC-1) as one more word of its Booth
tree, shifted right by CAP_FRAC by wiring, is the capped value at c's scale: F <= 1.0, so it
fits c's width and needs no saturation and no requantisation of its own.

The gate branch has no hardware here: SiTU is bounded, so its table (``SITU``) takes the gate
code in a fixed format straight from the engine and gives int8 at a fixed scale
(hw/moe/unit.py reads it like the router's score table).

The stages come from the clock period (hw/arith/pipeline.py); the caller reads
``live[out_key]`` in the stage the call returns (not registered).
"""
from __future__ import annotations

from amaranth import Const, unsigned

from hw.arith.silu import code_times_table
from moekda.formats import Formats
from moekda.tables import CAP_FRAC, cap_in_bits, cap_table


def up_cap(pipe, live: dict, code_key: str, op_key: str, params, fm: Formats, out_key: str = "cap") -> dict:
    """``live[out_key] = int_cap(live[code_key], *params[op])`` for ``op = live[op_key]``.

    ``params`` lists ``(t_m, t_s)`` per op: signals of the parameter bank, static while the
    unit runs.  ``live[code_key]`` is a signed act_bits code of the current stage; everything
    else in ``live`` travels alongside.  The result is signed act_bits, combinational in the
    returned stage.
    """
    ab = fm.act_bits
    # |c| <= 2**(ab-1), F <= 2**CAP_FRAC: c * F + 2**(CAP_FRAC-1) fits ab + CAP_FRAC + 1 signed bits
    p_bits = ab + CAP_FRAC + 2
    live = code_times_table(pipe, live, code_key, op_key, params, ab, fm, cap_in_bits(fm), unsigned(CAP_FRAC + 1),
                            cap_table(fm), "cap", "cap", p_bits, extra_words=[Const(1 << (CAP_FRAC - 1), CAP_FRAC)])
    live[out_key] = live.pop("cap_p")[CAP_FRAC:CAP_FRAC + ab].as_signed()
    return live
