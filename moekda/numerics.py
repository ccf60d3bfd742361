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
    # np.minimum/np.maximum, not np.clip: the same values, without np.clip's per-call
    # argument checks, which were a tenth of the integer model's time
    return np.minimum(np.maximum(x, lo), hi)


def round_shift(x, s):
    """Arithmetic right shift by ``s`` with round-half-up; ``s == 0`` is identity.  ``s`` may
    be an array of shifts (each >= 0) broadcast against ``x``: a shift per row or per token."""
    x = np.asarray(x, dtype=np.int64)
    if np.ndim(s):
        s = np.asarray(s, dtype=np.int64)
        if np.any(s < 0):
            raise ValueError(f"round_shift: shift {int(s.min())} < 0")
        return (x + ((np.int64(1) << s) >> 1)) >> s       # adds 0 where s == 0
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


# ---------------------------------------------------------------------------
# Added for the integer layer model (model/int_*.py).  Every function is
# integer in, integer out; the float work (table contents, constants) happens
# once in the builders marked "builder", whose *outputs* are stored integers.
# ---------------------------------------------------------------------------

def requantize_rows(acc, mult, shift, out_bits: int = 8):
    """``requantize`` with a multiplier and shift per row (arrays of ints).

    Used where the scale is computed per token or per head (RMSNorm, L2 norm): ``mult``
    and ``shift`` have the leading shape of ``acc`` (one row: 1-D over acc's first axis;
    a batch of tokens: (tokens, heads) over acc's first two), so row r uses (mult[r],
    shift[r]); every shift must be >= 1.
    """
    acc = np.asarray(acc, dtype=np.int64)
    mult = np.asarray(mult, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    if np.any(shift < 1):
        raise ValueError(f"requantize_rows: shift {int(shift.min())} < 1")
    expand = (...,) + (None,) * (acc.ndim - mult.ndim)
    m, s = mult[expand], shift[expand]
    return saturate((acc * m + (np.int64(1) << (s - 1))) >> s, out_bits)


def clog2(n: int) -> int:
    """Bits to count 0..n-1 (ceil(log2 n)), at least 0."""
    return max(0, (n - 1).bit_length())


def bit_length(a):
    """Number of bits of non-negative integers (0 -> 0), elementwise (a leading-one detector)."""
    a = np.asarray(a, dtype=np.int64)
    if np.any(a < 0):
        raise ValueError("bit_length: negative input")
    return np.sum(a[..., None] >= (np.int64(1) << np.arange(63, dtype=np.int64)), axis=-1)


def rsqrt_seed_table(norm_bits: int, seed_bits: int, frac: int) -> np.ndarray:
    """Builder: seed LUT of 1/sqrt(u) for u = a_norm / 2**norm_bits in [1/4, 1).

    Entry i covers a_norm >> (norm_bits - seed_bits) == i + 2**(seed_bits-2) and holds
    round(2**frac / sqrt(u_mid)) at the interval's midpoint: 3 * 2**(seed_bits-2) entries.
    """
    idx = np.arange(1 << (seed_bits - 2), 1 << seed_bits)
    u_mid = (idx + 0.5) / (1 << seed_bits)
    return np.floor((1 << frac) / np.sqrt(u_mid) + 0.5).astype(np.int64)


def rsqrt_fixed(a, norm_bits: int, frac: int, seed_table, seed_bits: int, newton_steps: int):
    """1/sqrt(a) for integers a >= 1, as (y, E) with 1/sqrt(a) ~= y * 2**-E.

    1. Normalise by an even shift 2e into a_norm in [2**(norm_bits-2), 2**norm_bits)
       (right shifts truncate), so a = a_norm * 4**e and 1/sqrt(a) = 1/sqrt(a_norm) * 2**-e.
    2. Seed y (Q``frac``, value in (1, 2]) from the top ``seed_bits`` bits of a_norm.
    3. Newton steps y <- y * (3 - u y^2) / 2 with u = a_norm / 2**norm_bits:
         y2 = rs(y*y, frac); uy2 = rs(a_norm*y2, norm_bits); y = rs(y*((3<<frac) - uy2), frac+1)
       where rs is round_shift (round half up).
    E = frac + norm_bits/2 + e.  Widths: y <= 2**(frac+1); a_norm*y2 < 2**(norm_bits+frac+2).
    """
    a = np.asarray(a, dtype=np.int64)
    if np.any(a < 1):
        raise ValueError("rsqrt_fixed: input must be >= 1")
    if norm_bits % 2:
        raise ValueError("rsqrt_fixed: norm_bits must be even")
    e = -((norm_bits - bit_length(a)) // 2)              # ceil((bl - N) / 2)
    a_norm = np.where(e >= 0, a >> np.maximum(e, 0) * 2, a << np.maximum(-e, 0) * 2)
    seed_idx = (a_norm >> (norm_bits - seed_bits)) - (1 << (seed_bits - 2))
    y = np.asarray(seed_table, dtype=np.int64)[seed_idx]
    for _ in range(newton_steps):
        y2 = round_shift(y * y, frac)
        uy2 = round_shift(a_norm * y2, norm_bits)
        y = round_shift(y * ((3 << frac) - uy2), frac + 1)
    return y, frac + norm_bits // 2 + e


def build_lut(fn, in_bits: int, in_scale: float, out_scale: float, out_lo: int, out_hi: int,
              in_offset: float = 0.0) -> np.ndarray:
    """Builder: table[c - c_min] = clip(round(fn(in_offset + c*in_scale) / out_scale), out_lo, out_hi)
    for every signed ``in_bits`` code c in increasing order (hw/arith/lut.py addressing).
    Rounding is half away from zero, so odd functions give odd tables."""
    codes = np.arange(-(1 << (in_bits - 1)), 1 << (in_bits - 1))
    val = np.asarray(fn(in_offset + codes * in_scale), dtype=np.float64) / out_scale
    q = np.sign(val) * np.floor(np.abs(val) + 0.5)
    return np.clip(q, out_lo, out_hi).astype(np.int64)


def lut_lookup(table, code, in_bits: int):
    """table[code - c_min] for signed ``in_bits`` codes (elementwise)."""
    code = np.asarray(code, dtype=np.int64)
    lo, hi = sat_bounds(in_bits)
    if np.any(code < lo) or np.any(code > hi):
        raise ValueError(f"lut_lookup: code outside {in_bits}-bit range")
    return np.asarray(table, dtype=np.int64)[code - lo]


def udiv_floor(num, den, num_bits: int, den_bits: int):
    """floor(num / den) of unsigned integers, the result of a restoring divider.

    num < 2**num_bits, 1 <= den < 2**den_bits; the quotient has num_bits bits.
    """
    num = np.asarray(num, dtype=np.int64)
    den = np.asarray(den, dtype=np.int64)
    if np.any(num < 0) or np.any(num >> num_bits):
        raise ValueError(f"udiv_floor: numerator outside {num_bits} unsigned bits")
    if np.any(den < 1) or np.any(den >> den_bits):
        raise ValueError(f"udiv_floor: denominator outside 1..2**{den_bits}-1")
    return num // den


def shared_shift_multipliers(scales, mult_bits: int = 16) -> tuple[list[int], int]:
    """Builder: multipliers M_i and ONE shift s with M_i / 2**s ~= scales[i] (all > 0),
    for sums of differently scaled terms (the residual add): the largest M_i is
    normalised to mult_bits bits, the others share its shift."""
    big = max(scales)
    _, s = quantize_multiplier(big, mult_bits)
    ms = [int(round(sc * (1 << s))) for sc in scales]
    if max(ms) >= (1 << mult_bits):  # rounding carried
        s -= 1
        ms = [int(round(sc * (1 << s))) for sc in scales]
    if min(ms) == 0:
        raise ValueError(f"shared_shift_multipliers: scale ratio {big / min(scales):g} too large for one shift")
    return ms, s
