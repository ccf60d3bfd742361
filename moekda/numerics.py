"""Integer arithmetic primitives shared by the numpy integer model and the RTL.

These functions *define* the arithmetic: the hardware in ``hw/`` implements
exactly them, and the cocotb tests compare the two bit for bit.  Widths come
from ``Config.formats``; nothing here hard-codes a width that the config
owns.

Requantisation (int32 accumulator -> int8), the scheme used everywhere:

    y = saturate_{out_bits}( (acc * M + 2**(s-1)) >> s )        (s >= 1)
    y = saturate_{out_bits}(  acc * M )                          (s == 0)

* ``M`` is an unsigned integer of ``requant_mult_bits`` bits, ``s`` a right
  shift; together they represent the real scale ``M / 2**s``.
* ``>>`` is an arithmetic shift (floor), so adding ``2**(s-1)`` first rounds
  half up (towards +inf): -2.5 -> -2, 2.5 -> 3.  One rounding step, unlike
  gemmlowp's two (SaturatingRoundingDoublingHighMul then RoundingDivideByPOT),
  which both saves hardware and removes a double-rounding error.
* Saturation clamps to [-2**(b-1), 2**(b-1)-1].
"""
from __future__ import annotations

import math

import numpy as np


def sat_bounds(bits: int) -> tuple[int, int]:
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def saturate(x, bits: int):
    """Clamp a signed integer (or array) to ``bits`` bits."""
    lo, hi = sat_bounds(bits)
    return np.clip(x, lo, hi)


def round_shift(x, s: int):
    """Arithmetic right shift by ``s`` with round-half-up; ``s == 0`` is identity."""
    x = np.asarray(x, dtype=np.int64)
    if s == 0:
        return x
    return (x + (1 << (s - 1))) >> s


def requantize(acc, mult: int, shift: int, out_bits: int = 8):
    """int accumulator(s) -> ``out_bits`` signed, with multiplier ``mult`` and shift ``shift``."""
    acc = np.asarray(acc, dtype=np.int64)
    prod = acc * int(mult)
    return saturate(round_shift(prod, shift), out_bits)


def quantize_multiplier(scale: float, mult_bits: int = 16, max_shift: int = 62) -> tuple[int, int]:
    """Best (M, s) with M < 2**mult_bits and M / 2**s ~= scale (scale > 0).

    M is normalised into [2**(mult_bits-1), 2**mult_bits) for precision when the
    shift allows it.  Raises ValueError when the scale cannot be represented.
    """
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"requantisation scale {scale!r} must be positive and finite")
    # choose s such that scale * 2**s lies in [2**(b-1), 2**b)
    exp = math.floor(math.log2(scale))
    s = (mult_bits - 1) - exp
    if s < 0:
        raise ValueError(f"requantisation scale {scale} too large for a {mult_bits}-bit multiplier")
    s = min(s, max_shift)
    m = round(scale * (1 << s))
    if m >= (1 << mult_bits):  # rounding carried into a new bit
        m = round(scale * (1 << (s - 1)))
        s -= 1
    if m == 0:
        raise ValueError(f"requantisation scale {scale} too small for shift <= {max_shift}")
    return int(m), int(s)
