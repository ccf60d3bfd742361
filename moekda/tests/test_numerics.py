"""The requantisation scheme against an independent exact-rational computation."""
from fractions import Fraction
import math

import numpy as np
import pytest

from moekda.numerics import quantize_multiplier, requantize, round_shift


def reference_requant(acc: int, m: int, s: int, bits: int = 8) -> int:
    # round half up of the exact rational acc*m/2^s, then clamp
    q = Fraction(acc * m, 1 << s)
    r = math.floor(q + Fraction(1, 2))
    return max(-(1 << (bits - 1)), min((1 << (bits - 1)) - 1, r))


def test_requantize_matches_exact_rounding():
    rng = np.random.default_rng(1)
    accs = np.concatenate([rng.integers(-2**31, 2**31, 2000), [0, 1, -1, 2**31 - 1, -2**31]])
    for m, s in [(1, 0), (3, 1), (40000, 20), (65535, 40), (32768, 16), (12345, 13)]:
        got = requantize(accs, m, s)
        want = [reference_requant(int(a), m, s) for a in accs]
        assert got.tolist() == want


def test_round_half_up_on_ties():
    # -2.5 -> -2 and 2.5 -> 3: round half towards +inf, one rounding step
    assert round_shift(np.array([-5, 5, -3, 3]), 1).tolist() == [-2, 3, -1, 2]


@pytest.mark.parametrize("scale", [1e-6, 0.00123, 0.5, 0.999999, 1.0, 3.7, 1000.0])
def test_quantize_multiplier_precision(scale):
    m, s = quantize_multiplier(scale, mult_bits=16)
    assert 0 < m < 2**16
    assert abs(m / 2**s - scale) / scale < 2**-15


def test_quantize_multiplier_rejects_bad_scales():
    for bad in (0.0, -1.0, float("inf"), 2.0**20):
        with pytest.raises(ValueError):
            quantize_multiplier(bad, mult_bits=16)
