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

SiTU-GLU (``model.glu = "situ"``, K3's gated unit, issue 47) has two more constant tables, both
bounded functions, so both have fixed formats:

* ``SITU`` = 4 tanh(g/4) sigmoid(g), in (-0.27, 4): its output has a fixed int8 scale
  2**-SITU_OUT_FRAC (no per-model scale, no requantisation after the table), its input code
  (silu_sigmoid_in_bits wide, +-2**SITU_IN_RANGE_LOG2 = +-16: SiTU is within half an output LSB
  of its limits beyond) is what the gate projection's loaded requantisation produces directly.
  One table read replaces the SiLU's two requantisations and product.
* ``CAP`` = F(x) = tanh(x/25) / (x/25), the up branch's 25 tanh(u/25) = u F(u) as c * F(t):
  the up code c keeps its own (per-expert) scale, t = requantize(c, t_m, t_s, cap_in_bits) is x
  in the fixed format +-2**CAP_IN_RANGE_LOG2 (+-64), F is U1.CAP_FRAC (F(0) = 1.0), and
  round_shift(c * F, CAP_FRAC) is the capped value at c's scale: |u F(u)| <= |u|, so it fits c's
  width and needs no requantisation of its own.

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
# SiTU-GLU (model.glu = "situ"): SiTU's table (input +-16 at silu_sigmoid_in_bits, output int8
# at 2**-SITU_OUT_FRAC: SiTU < 4) and the up cap's F(x) = tanh(x/25)/(x/25) (input +-64 at
# lut_in_bits + CAP_EXTRA_BITS, output U1.CAP_FRAC)
SITU = "situ"
CAP = "cap"
SITU_IN_RANGE_LOG2 = 4
SITU_OUT_FRAC = 5
SITU_GATE_BOUND = 4.0     # SiTU(g) = SITU_GATE_BOUND tanh(g / SITU_GATE_BOUND) sigmoid(g)
CAP_BOUND = 25.0          # the up branch: CAP_BOUND tanh(u / CAP_BOUND)
CAP_IN_RANGE_LOG2 = 6
CAP_EXTRA_BITS = 1
CAP_FRAC = 10
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


def situ(x):
    """SiTU(g) = 4 tanh(g/4) sigmoid(g) in float64 (the float models' too)."""
    x = np.asarray(x, dtype=np.float64)
    return SITU_GATE_BOUND * np.tanh(x / SITU_GATE_BOUND) * _sigmoid(x)


def cap(x):
    """The up branch of SiTU-GLU, 25 tanh(u/25), in float64."""
    return CAP_BOUND * np.tanh(np.asarray(x, dtype=np.float64) / CAP_BOUND)


def cap_factor(x):
    """F(x) = tanh(x/25) / (x/25), cap(x) = x F(x); F(0) = 1."""
    x = np.asarray(x, dtype=np.float64) / CAP_BOUND
    safe = np.where(x == 0, 1.0, x)
    return np.where(x == 0, 1.0, np.tanh(safe) / safe)


def situ_in_bits(fm: Formats) -> int:
    """Width of SITU's signed input code (the gate code of a SiTU-GLU expert)."""
    return fm.lut_in_bits + SILU_EXTRA_BITS


def situ_in_scale(fm: Formats) -> float:
    """The real value of one SITU input code step (2**-5 at lut_in_bits = 8)."""
    return 2.0 ** -(situ_in_bits(fm) - 1 - SITU_IN_RANGE_LOG2)


def cap_in_bits(fm: Formats) -> int:
    """Width of CAP's signed input code t."""
    return fm.lut_in_bits + CAP_EXTRA_BITS


def cap_in_scale(fm: Formats) -> float:
    """The real value of one CAP input code step (1/4 at lut_in_bits = 8)."""
    return 2.0 ** -(cap_in_bits(fm) - 1 - CAP_IN_RANGE_LOG2)


def cap_clip() -> float:
    """The largest |u| the up code of a SiTU-GLU expert represents (the CAP table's range:
    beyond it 25 tanh(u/25) is within 0.4 of 25)."""
    return float(1 << CAP_IN_RANGE_LOG2)


def situ_table(fm: Formats) -> np.ndarray:
    """``SITU``'s entries: SiTU as signed act_bits at 2**-SITU_OUT_FRAC over +-16 at
    situ_in_bits; read-only."""
    return _situ_table(situ_in_bits(fm), fm.act_bits)


def cap_table(fm: Formats) -> np.ndarray:
    """``CAP``'s entries: F = tanh(x/25)/(x/25) as U1.CAP_FRAC over +-64 at cap_in_bits; read-only."""
    return _cap_table(cap_in_bits(fm))


@lru_cache(maxsize=None)
def _situ_table(lb: int, out_bits: int) -> np.ndarray:
    table = build_lut(situ, lb, 2.0 ** -(lb - 1 - SITU_IN_RANGE_LOG2), 2.0 ** -SITU_OUT_FRAC,
                      -(1 << (out_bits - 1)), (1 << (out_bits - 1)) - 1)
    table.setflags(write=False)
    return table


@lru_cache(maxsize=None)
def _cap_table(lb: int) -> np.ndarray:
    table = build_lut(cap_factor, lb, 2.0 ** -(lb - 1 - CAP_IN_RANGE_LOG2), 2.0 ** -CAP_FRAC, 0, 1 << CAP_FRAC)
    table.setflags(write=False)
    return table


def table_in_offset(name: str) -> float:
    """The real value of input code 0 of table ``name``."""
    _check(name)
    return ALPHA_Z_MID if name == "kda.alpha" else 0.0


def _check(name: str) -> None:
    if name not in FIXED_TABLES and name not in (SILU_SIGMOID, SITU, CAP):
        raise KeyError(f"{name}: not a fixed table ({', '.join((*FIXED_TABLES, SILU_SIGMOID, SITU, CAP))})")


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
    if name == SITU:
        return situ_table(fm).copy()
    if name == CAP:
        return cap_table(fm).copy()
    return _sigmoid_table(lb, fm.unit_frac).copy()


def fixed_table_bits(cfg: Config, name: str) -> int:
    """The entry width of table ``name`` (unsigned): what its output format needs."""
    _check(name)
    fm = formats_for(cfg)
    return {"kda.alpha": fm.alpha_frac, "moe.score": fm.score_frac + 1, SITU: fm.act_bits,
            CAP: CAP_FRAC + 1}.get(name, fm.unit_frac + 1)
