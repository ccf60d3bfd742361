"""The integer operations the layer is built from, each exactly as the hardware does it.

All inputs and outputs are integer numpy arrays (int64 holding narrower values).
Widths are checked where an overflow would otherwise wrap silently in hardware.
A token's vector is the last axis; leading axes are a batch of independent tokens
(sequences scored side by side), computed exactly as one token each.
"""
from __future__ import annotations

import numpy as np

from moekda.formats import Formats
from moekda.numerics import (lut_lookup, requantize, requantize_rows, round_shift, rsqrt_fixed, sat_bounds,
                             saturate)
from moekda.tables import (CAP_FRAC, cap_in_bits, cap_table, silu_sigmoid, silu_sigmoid_in_bits, situ_in_bits,
                           situ_table)
from model.qparams import QLinear, QLut, QNorm, QResidual, QSilu


def check_width(x, bits: int, what: str):
    lo, hi = sat_bounds(bits)
    x = np.asarray(x)
    if x.size and (x.min() < lo or x.max() > hi):
        raise OverflowError(f"{what}: value outside {bits}-bit signed range")
    return x


def int_linear(lin: QLinear, x, fm: Formats, what: str = "linear"):
    """The shared engine: requantize(W @ x (+ bias), m, s, out_bits); the accumulator
    (after the bias) must fit acc_bits."""
    acc = np.asarray(x, dtype=np.int64) @ lin.w.T
    if lin.bias is not None:
        acc = acc + lin.bias
    check_width(acc, fm.acc_bits, what + " accumulator")
    return requantize(acc, lin.m, lin.s, lin.out_bits)


def int_conv_step(conv: QLinear, history, a):
    """Causal depthwise conv of one token: history (K-1, C) int8 oldest first, a (C,) int8.
    acc[c] = sum_j w[c, j] * window[j, c], requantised to a table code.  Returns (history, code)."""
    window = np.concatenate([history, np.asarray(a, dtype=np.int64)[..., None, :]], axis=-2)
    acc = np.sum(window * conv.w.T, axis=-2)
    return window[..., 1:, :], requantize(acc, conv.m, conv.s, conv.out_bits)


def int_lut(lut: QLut, code):
    return lut_lookup(lut.table, code, lut.in_bits)


def int_silu(silu: QSilu, code, fm: Formats):
    """SiLU of table codes at the model's scale, as x * sigmoid(x) (QSilu; hw/arith/silu.py):
    the sigmoid's input is the code requantised to the config's fixed format."""
    code = np.asarray(code, dtype=np.int64)
    tb = silu_sigmoid_in_bits(fm)
    t = requantize(code, silu.t_m, silu.t_s, tb)
    sig = lut_lookup(silu_sigmoid(fm), t, tb)
    return requantize(code * sig, silu.m, silu.s, silu.out_bits)


def int_situ(code, fm: Formats):
    """SiTU of a gate code in the SITU table's fixed input format (moekda/tables.py): one read of
    the config's table, int8 at the fixed scale 2**-SITU_OUT_FRAC."""
    return lut_lookup(situ_table(fm), code, situ_in_bits(fm))


def int_cap(code, t_m, t_s, fm: Formats):
    """The up branch 25 tanh(u/25) of an int8 up code c at its own scale, as c * F(t):
    t = requantize(c, t_m, t_s, cap_in_bits) is u in the CAP table's fixed input format, F its
    U1.CAP_FRAC entry, and round_shift(c * F, CAP_FRAC) the capped value at c's scale
    (|F| <= 1: no saturation).  ``t_m``, ``t_s`` broadcast against ``code``."""
    code = np.asarray(code, dtype=np.int64)
    tb = cap_in_bits(fm)
    t = requantize(code, t_m, t_s, tb)
    return round_shift(code * lut_lookup(cap_table(fm), t, tb), CAP_FRAC)


def int_normalize(x, norm: QNorm, fm: Formats, out_bits: int):
    """Rows of x scaled to y = x * K / sqrt(sum(x^2) + eps_int), K = norm.m / 2**norm.s.

    ss = sum(x^2) + eps_int (at least 1); (y_r, E) = rsqrt_fixed(ss); the per-row
    multiplier m_r = round_shift(y_r * m, rsqrt_frac + 1) (< 2**mult_bits) and shift
    s_r = E + s - rsqrt_frac - 1 then requantise x.  One multiplier per row, so the
    hardware needs one rsqrt per token (per head for L2/o norms).
    """
    x = np.atleast_2d(np.asarray(x, dtype=np.int64))
    ss = np.maximum(np.sum(x * x, axis=-1) + norm.eps_int, 1)
    y, E = rsqrt_fixed(ss, fm.rsqrt_norm_bits, fm.rsqrt_frac, fm.rsqrt_seed, fm.rsqrt_seed_bits,
                       fm.rsqrt_newton_steps)
    m_r = round_shift(y * norm.m, fm.rsqrt_frac + 1)
    if np.any(m_r >> fm.mult_bits):
        raise OverflowError("int_normalize: per-row multiplier exceeds mult_bits")
    s_r = E + norm.s - fm.rsqrt_frac - 1
    return requantize_rows(x, m_r, s_r, out_bits)


def int_rmsnorm(x, norm: QNorm, fm: Formats):
    """RMSNorm of one resid_bits token (the weight is folded into the next projection): int8 out."""
    return int_normalize(np.asarray(x)[..., None, :], norm, fm, fm.act_bits)[..., 0, :]


def int_residual_add(a, b, res: QResidual, fm: Formats):
    """Residual stream (resid_bits) plus a branch output (int8 or resid_bits), each at its own scale,
    into the next residual scale: sat(round_shift(a*m_a + b*m_b, s)), one rounding."""
    acc = np.asarray(a, dtype=np.int64) * res.m_a + np.asarray(b, dtype=np.int64) * res.m_b
    return saturate(round_shift(acc, res.s), fm.resid_bits)
