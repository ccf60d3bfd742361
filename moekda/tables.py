"""The nonlinearity tables the config fixes: read-only logic on the chip, not loaded.

A table maps a signed ``lut_in_bits`` code to an output code.  The sigmoid-shaped ones
(the KDA's beta, output gate and decay alpha, the router's score, the Gated MLA's output
gate) have an output format the config already fixes (U0.unit_frac, U0.score_frac,
U0.alpha_frac); only their input scale came from the model (the calibrated logit range).
Here that input scale is fixed as well: code c means x = offset + c * 2**-(lut_in_bits - 4),
a range of +-8 around the offset at lut_in_bits = 8, where sigmoid is within 3.4e-4 of its
limits.  The model's own scale moves into the requantisation that produces the code (the
projection's loaded multiplier and shift, and for alpha the f_up accumulator bias), so the
table is a function of the config alone, and the chip holds it as constants: synthesis
folds each one into a few hundred cells of logic instead of 256 loaded flip-flop entries
and a 256:1 read multiplexer.

The decay's input is z = A (W_f_up fd + dt_bias); alpha = exp(lb * sigmoid(z)) is within
half an output LSB of 1 below z = -11 and of exp(lb) above z = 5, so its codes are centred
on z = ALPHA_Z_MID = -3.

SiLU is not scale-free and its input range is the model's, so it has no table of its own: it
is x * sigmoid(x) (``QSilu``, model/int_ops.py int_silu; hw/arith/silu.py).  The code c
keeps the model's scale; a loaded requantisation makes the sigmoid's input code in the fixed
format above, the fixed table ``SILU_SIGMOID`` (sigmoid as U0.unit_frac, the same function as
beta's) gives sigmoid(x), and the product c * sigmoid(x) is SiLU at the scale of c times
2**-unit_frac, shifted to the output's format.

``fixed_table(cfg, name)`` is the one definition: the quantiser (model/quantize.py)
builds the integer model's tables with it, the image writer checks a model's tables equal
it (hw/image/param_map.py structural), and the RTL instantiates it as constants.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from moekda.config import Config
from moekda.formats import Formats, formats_for
from moekda.numerics import build_lut

# the tables the config fixes, by their QLayer names
FIXED_TABLES = ("kda.alpha", "kda.beta", "kda.gate", "moe.score", "mla.gate")
# the sigmoid inside every SiLU (not a QLayer table: part of the SiLU unit).  Its input has
# SILU_EXTRA_BITS more than lut_in_bits over the same +-8: SiLU's error is |x| times the
# sigmoid's, so a step of 1/16 there cost tiny's output a measurable bit (docs/numerics.md)
SILU_SIGMOID = "silu.sigmoid"
SILU_EXTRA_BITS = 2
# the decay table's input codes are centred here (see the module's text)
ALPHA_Z_MID = -3.0
# input code c means offset + c * 2**-(lut_in_bits - IN_RANGE_LOG2): a range of +-2**IN_RANGE_LOG2
IN_RANGE_LOG2 = 3


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def table_in_scale(cfg: Config) -> float:
    """The real value of one input code step of every fixed table."""
    return fixed_in_scale(formats_for(cfg).lut_in_bits)


def fixed_in_scale(lut_in_bits: int) -> float:
    """table_in_scale for a given code width."""
    return 2.0 ** -(lut_in_bits - 1 - IN_RANGE_LOG2)


def silu_sigmoid_in_bits(fm: Formats) -> int:
    """The width of ``SILU_SIGMOID``'s signed input code."""
    return fm.lut_in_bits + SILU_EXTRA_BITS


def silu_sigmoid(fm: Formats) -> np.ndarray:
    """``SILU_SIGMOID``'s entries (sigmoid as U0.unit_frac over +-8 at silu_sigmoid_in_bits):
    what the integer model's SiLU reads (model/int_ops.py int_silu); read-only."""
    return _sigmoid_table(silu_sigmoid_in_bits(fm), fm.unit_frac)


@lru_cache(maxsize=None)
def _sigmoid_table(lb: int, frac: int) -> np.ndarray:
    table = build_lut(_sigmoid, lb, fixed_in_scale(lb), 2.0 ** -frac, 0, 1 << frac)
    table.setflags(write=False)
    return table


def table_in_offset(name: str) -> float:
    """The real value of input code 0 of table ``name``."""
    _check(name)
    return ALPHA_Z_MID if name == "kda.alpha" else 0.0


def _check(name: str) -> None:
    if name not in FIXED_TABLES and name != SILU_SIGMOID:
        raise KeyError(f"{name}: not a fixed table ({', '.join((*FIXED_TABLES, SILU_SIGMOID))})")


def fixed_table(cfg: Config, name: str) -> np.ndarray:
    """Table ``name``'s entries for every input code in increasing order (hw/arith/lut.py
    addressing), as int64."""
    _check(name)
    fm = formats_for(cfg)
    lb, s = fm.lut_in_bits, table_in_scale(cfg)
    if name == "kda.alpha":
        bound = cfg.model.decay_lower_bound
        return build_lut(lambda z: np.exp(bound * _sigmoid(z)), lb, s, 2.0 ** -fm.alpha_frac,
                         1, (1 << fm.alpha_frac) - 1, in_offset=ALPHA_Z_MID)
    if name == "moe.score":
        return build_lut(_sigmoid, lb, s, 2.0 ** -fm.score_frac, 0, 1 << fm.score_frac)
    if name == SILU_SIGMOID:
        return silu_sigmoid(fm).copy()
    return _sigmoid_table(lb, fm.unit_frac).copy()


def fixed_table_bits(cfg: Config, name: str) -> int:
    """The entry width of table ``name`` (unsigned): what its output format needs."""
    _check(name)
    fm = formats_for(cfg)
    return {"kda.alpha": fm.alpha_frac, "moe.score": fm.score_frac + 1}.get(name, fm.unit_frac + 1)
