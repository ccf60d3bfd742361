"""The integer primitives added for the layer model: rsqrt, tables, divider, row requantisation."""
import math

import numpy as np
import pytest

from moekda.config import load_config
from moekda.formats import derived_widths, formats_for
from moekda.numerics import (bit_length, build_lut, lut_lookup, quantize_multiplier, requantize, requantize_rows,
                             rsqrt_fixed, shared_shift_multipliers, udiv_floor)

FM = formats_for(load_config("tiny"))


def rsqrt(a):
    return rsqrt_fixed(a, FM.rsqrt_norm_bits, FM.rsqrt_frac, FM.rsqrt_seed, FM.rsqrt_seed_bits, FM.rsqrt_newton_steps)


def test_bit_length_matches_python():
    vals = [0, 1, 2, 3, 4, 255, 256, 2 ** 40 - 1, 2 ** 40, 2 ** 62]
    assert bit_length(np.array(vals)).tolist() == [v.bit_length() for v in vals]


def test_rsqrt_relative_error_over_the_whole_input_range():
    rng = np.random.default_rng(0)
    a = np.concatenate([np.arange(1, 4096), rng.integers(1, 2 ** 44, 100_000), 4 ** np.arange(0, 22)])
    y, E = rsqrt(a)
    rel = y * np.exp2(-E.astype(float)) * np.sqrt(a.astype(float)) - 1
    # two Newton steps from a 24-entry seed: the Q2.14 mantissa's own resolution
    assert np.max(np.abs(rel)) < 1.2e-4
    assert np.all(y <= 1 << (FM.rsqrt_frac + 1))   # the stated width of y


def test_rsqrt_newton_steps_each_improve():
    a = np.arange(1, 20000)
    errs = []
    for steps in range(3):
        y, E = rsqrt_fixed(a, FM.rsqrt_norm_bits, FM.rsqrt_frac, FM.rsqrt_seed, FM.rsqrt_seed_bits, steps)
        errs.append(np.max(np.abs(y * np.exp2(-E.astype(float)) * np.sqrt(a) - 1)))
    assert errs[0] < 0.04 and errs[1] < errs[0] / 10 and errs[2] < errs[1] / 10


def test_rsqrt_rejects_zero():
    with pytest.raises(ValueError):
        rsqrt(np.array([0]))


def test_lut_contents_within_half_lsb_and_addressing():
    t = build_lut(lambda x: 1 / (1 + np.exp(-x)), 8, 0.05, 2.0 ** -8, 0, 256)
    assert t.shape == (256,)
    codes = np.arange(-128, 128)
    exact = 256 / (1 + np.exp(-codes * 0.05))
    assert np.all(np.abs(t - exact) <= 0.5)
    assert np.all(np.diff(t) >= 0)                      # monotonic
    assert lut_lookup(t, np.array([-128, 0, 127]), 8).tolist() == [t[0], t[128], t[255]]
    with pytest.raises(ValueError):
        lut_lookup(t, np.array([128]), 8)


def test_lut_of_odd_function_is_odd():
    t = build_lut(np.tanh, 8, 0.02, 1 / 127, -127, 127)
    assert np.array_equal(t[1:], -t[1:][::-1])          # t[c] == -t[-c] for c = -127..127


def test_udiv_floor_is_python_floor_division():
    rng = np.random.default_rng(1)
    num, den = rng.integers(0, 2 ** 28, 1000), rng.integers(1, 2 ** 18, 1000)
    assert np.array_equal(udiv_floor(num, den, 28, 18), num // den)
    with pytest.raises(ValueError):
        udiv_floor(np.array([1]), np.array([0]), 28, 18)
    with pytest.raises(ValueError):
        udiv_floor(np.array([2 ** 28]), np.array([1]), 28, 18)


def test_requantize_rows_equals_requantize_per_row():
    rng = np.random.default_rng(2)
    acc = rng.integers(-2 ** 20, 2 ** 20, (5, 7))
    ms, ss = rng.integers(1 << 15, 1 << 16, 5), rng.integers(10, 30, 5)
    out = requantize_rows(acc, ms, ss)
    for r in range(5):
        assert np.array_equal(out[r], requantize(acc[r], int(ms[r]), int(ss[r])))


def test_shared_shift_multipliers_represent_both_scales():
    (ma, mb), s = shared_shift_multipliers([0.37, 0.0021], 16)
    assert ma < 2 ** 16 and math.isclose(ma / 2 ** s, 0.37, rel_tol=2e-5)
    assert math.isclose(mb / 2 ** s, 0.0021, rel_tol=2e-3)


def test_derived_widths_cover_worst_cases():
    w = derived_widths(load_config("small"))
    d = load_config("small").model.d_model
    assert d * (2 ** 15) ** 2 < 2 ** (w["ss_rmsnorm"] - 1)
    assert 4 * 128 * 127 < 2 ** (w["conv_acc"] - 1)
    assert (2 ** 15 * 2 + 2 ** 15) < 2 ** w["div_den"]
