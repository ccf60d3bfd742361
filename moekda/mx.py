"""OCP Microscaling (MX) formats: MXFP4 weights and MXFP8 (E4M3) activations (issue 48).

One place for the element and scale formats, the block quantiser, the packing and the
integer arithmetic the chip's MXFP4 engine is to implement.  Used by the quantiser
(model/quantize.py), the integer model (model/int_moe.py) and their tests; the
rules and the measured error are in docs/numerics.md, section 11.

Formats (OCP Microscaling Formats v1.0; K3's reference port, torchtitan
``models/kimi_k3/packed_mxfp4.py`` and ``mxfp4_qat.py``, which delegates to torchao's MX
primitives):

* **E2M1** (FP4) element, 4 bits ``s e1 e0 m``: ``(-1)^s 2^(e-1) (1 + m/2)`` for e > 0,
  ``(-1)^s m/2`` for e = 0: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}; no Inf, no NaN.
* **E4M3** (FP8) element, 8 bits ``s eeee mmm``, bias 7: ``(-1)^s 2^(e-7) (1 + m/8)``
  for e > 0, ``(-1)^s 2^-6 m/8`` for e = 0; largest 448 (e = 15, m = 6); ``s 1111 111``
  is NaN; no Inf.
* **E8M0** scale byte b: ``2^(b - 127)``; b = 255 is NaN (never produced here).
* A **block** is 32 consecutive elements along a matrix row's input dimension (the
  reduction dimension), sharing one scale.  A row whose length is not a multiple of 32
  ends in a partial block, quantised as if padded with zeros (model-tiny's rows are 16).

Quantisation of a block (``mx_quantize``):

  X    = floor(log2(max_i |v_i|)) - emax_elem          emax_elem = 2 (E2M1), 8 (E4M3)
  byte = X + 127, clamped to 0..254; an all-zero block gets byte 0
  q_i  = RNE(v_i / 2^X) to the element grid, saturating at the largest element (6, 448)

This is the OCP spec's conversion (section 6.3) and the reference port's shared exponent
(floor(log2 amax) - 2 for E2M1; torchao's default FLOOR mode for E4M3).  Its known cost:
the block maximum scales to [4, 8) (E2M1) or [256, 512) (E4M3), so a maximum in [7, 8)
(or [464, 512)) saturates to 6 (448).  Ties round to the even element (torchao's
``_f32_to_floatx_unpacked``: round to nearest, ties to even); the port's test-fixture packer
(argmin over the 16 values) breaks the three E2M1 ties 0.75, 1.75, 3.5 downwards instead:
a measure-zero set for float weights.

Packing (``pack_mxfp4``): two elements a byte, element 2j in the low nibble (the reference
port's and compressed-tensors' order); split form = the checkpoint's ``weight_packed``
(rows, n/2) and ``weight_scale`` (rows, n/32); interleaved form (the chip's weight stream,
a proposal for the image): per block its scale byte, then its 16 element bytes, 17 bytes a
block of 32.
"""
from __future__ import annotations

import numpy as np

BLOCK = 32
E8M0_BIAS = 127
E2M1_EMAX = 2            # 6 = 1.5 * 2^2
E4M3_EMAX = 8            # 448 = 1.75 * 2^8
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_NAN = 0x7F          # s 1111 111 (0xFF with the sign)
E2M1_HALF = np.array([0, 1, 2, 3, 4, 6, 8, 12], dtype=np.int64)   # magnitudes in units of 0.5
E2M1_VALUES = np.concatenate([E2M1_HALF, -E2M1_HALF]) / 2.0           # code 0..15 -> value
ELEMS = ("e2m1", "e4m3")


# ---- elements -------------------------------------------------------------------------

def e2m1_decode(codes) -> np.ndarray:
    """E2M1 codes (0..15) -> float values (code 8 is -0.0)."""
    c = np.asarray(codes, dtype=np.int64)
    if np.any((c < 0) | (c > 15)):
        raise ValueError("e2m1_decode: code outside 0..15")
    return np.where(c >= 8, -1.0, 1.0) * (E2M1_HALF[c & 7] / 2.0)


def e2m1_half_units(codes) -> np.ndarray:
    """E2M1 codes -> signed integers in units of 0.5: {0, +-1, +-2, +-3, +-4, +-6, +-8, +-12}
    (a 2-bit significand 1..3 times 1, 2 or 4; |.| <= 12, 5 bits signed)."""
    c = np.asarray(codes, dtype=np.int64)
    if np.any((c < 0) | (c > 15)):
        raise ValueError("e2m1_half_units: code outside 0..15")
    return np.where(c >= 8, -1, 1) * E2M1_HALF[c & 7]


def _rne_to_grid(a, grid):
    """Round magnitudes ``a`` (>= 0, finite) to ``grid`` (increasing, grid[0] = 0) at the
    nearest point, ties to the even index, saturating at grid[-1]; returns indices."""
    hi = np.clip(np.searchsorted(grid, a, side="left"), 1, len(grid) - 1)   # grid[hi-1] < a <= grid[hi]
    lo = hi - 1
    dl, dh = a - grid[lo], grid[hi] - a
    idx = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.where(a >= grid[-1], len(grid) - 1, idx)


def e2m1_encode(x) -> np.ndarray:
    """Float values (already divided by the block scale) -> E2M1 codes: round to nearest,
    ties to the even code (mantissa bit 0), |x| >= 6 saturates to 6, the sign is kept (a
    negative value rounding to zero gives -0, code 8).  NaN or Inf: ValueError."""
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("e2m1_encode: NaN or Inf (E2M1 has neither)")
    idx = _rne_to_grid(np.abs(x), E2M1_HALF / 2.0)
    return (idx + np.where(np.signbit(x), 8, 0)).astype(np.int64)


def _e4m3_grid() -> np.ndarray:
    """The 127 non-negative finite E4M3 magnitudes, increasing, index = code (0..126)."""
    c = np.arange(127)
    e, m = c >> 3, c & 7
    return np.where(e == 0, m * 2.0 ** -9, (8 + m) * 2.0 ** (e - 10))


E4M3_GRID = _e4m3_grid()


def e4m3_decode(codes) -> np.ndarray:
    """E4M3 codes (0..255) -> float values; 0x7F and 0xFF are NaN."""
    c = np.asarray(codes, dtype=np.int64)
    if np.any((c < 0) | (c > 255)):
        raise ValueError("e4m3_decode: code outside 0..255")
    mag = c & 0x7F
    sign = np.where(c >= 128, -1.0, 1.0)
    return np.where(mag == E4M3_NAN, np.copysign(np.nan, sign), sign * E4M3_GRID[np.minimum(mag, 126)])


def e4m3_encode(x) -> np.ndarray:
    """Float values (already divided by the block scale) -> E4M3 codes: round to nearest, ties
    to even (the code's last mantissa bit), |x| beyond 448 saturates to 448 (MX conversion
    saturates: no Inf exists, and the NaN code is kept for NaN), the sign is kept; NaN ->
    0x7F with its sign bit; +-Inf saturates."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(np.where(np.isnan(x), 0.0, x))
    idx = _rne_to_grid(np.minimum(a, 1e300), E4M3_GRID)
    code = idx + np.where(np.signbit(x), 128, 0)
    return np.where(np.isnan(x), E4M3_NAN + np.where(np.signbit(x), 128, 0), code).astype(np.int64)


def e4m3_units(codes) -> np.ndarray:
    """E4M3 codes -> signed integers in units of 2^-9 (the smallest subnormal): m for e = 0,
    (8 + m) << (e - 1) for e > 0; |.| <= 229376 = 448 * 2^9 (19 bits signed).  NaN: ValueError."""
    c = np.asarray(codes, dtype=np.int64)
    if np.any((c & 0x7F) == E4M3_NAN):
        raise ValueError("e4m3_units: NaN code")
    e, m = (c >> 3) & 15, c & 7
    mag = np.where(e == 0, m, (8 + m) << np.maximum(e - 1, 0))
    return np.where(c >= 128, -mag, mag)


# ---- scales and blocks ----------------------------------------------------------------

def e8m0_decode(b) -> np.ndarray:
    """E8M0 scale bytes -> 2^(b - 127) (b = 0 is 2^-127, b = 255 NaN)."""
    b = np.asarray(b, dtype=np.int64)
    if np.any((b < 0) | (b > 255)):
        raise ValueError("e8m0_decode: byte outside 0..255")
    return np.where(b == 255, np.nan, np.ldexp(1.0, np.minimum(b, 254) - E8M0_BIAS))


def _emax(elem: str) -> int:
    if elem not in ELEMS:
        raise ValueError(f"MX element format {elem!r}: allowed are {', '.join(ELEMS)}")
    return E2M1_EMAX if elem == "e2m1" else E4M3_EMAX


def n_blocks(n: int, block: int = BLOCK) -> int:
    return -(-n // block)


def _blocked(v, block: int):
    """(..., n) -> (..., nb, block) zero-padded."""
    v = np.asarray(v, dtype=np.float64)
    n = v.shape[-1]
    pad = n_blocks(n, block) * block - n
    vp = np.concatenate([v, np.zeros(v.shape[:-1] + (pad,))], axis=-1) if pad else v
    return vp.reshape(v.shape[:-1] + (-1, block))


def block_scale_bytes(v, elem: str = "e2m1", block: int = BLOCK, min_byte=None) -> np.ndarray:
    """E8M0 byte of every block of the last axis: floor(log2 amax) - emax_elem + 127, clamped
    to 0..254 (an all-zero block: 0), and raised to ``min_byte`` (broadcast against the
    blocks, e.g. one floor per matrix) where given."""
    amax = np.max(np.abs(_blocked(v, block)), axis=-1)
    if not np.all(np.isfinite(amax)):
        raise ValueError("block_scale_bytes: NaN or Inf in the input")
    _, e = np.frexp(amax)                       # amax = f 2^e, f in [0.5, 1): floor(log2) = e - 1
    b = np.where(amax > 0, e - 1 - _emax(elem) + E8M0_BIAS, 0)
    if min_byte is not None:
        b = np.maximum(b, min_byte)
    return np.clip(b, 0, 254).astype(np.int64)


def mx_quantize(v, elem: str = "e2m1", block: int = BLOCK, min_byte=None):
    """Blocks of ``block`` along the last axis -> (codes (..., n), scale bytes (..., nb)).
    The rule is in the module doc; ``min_byte`` see ``block_scale_bytes``."""
    v = np.asarray(v, dtype=np.float64)
    n = v.shape[-1]
    sb = block_scale_bytes(v, elem, block, min_byte)
    scaled = _blocked(v, block) / np.ldexp(1.0, sb - E8M0_BIAS)[..., None]
    scaled = scaled.reshape(v.shape[:-1] + (-1,))[..., :n]
    enc = e2m1_encode if elem == "e2m1" else e4m3_encode
    return enc(scaled), sb


def mx_dequantize(codes, sb, elem: str = "e2m1", block: int = BLOCK) -> np.ndarray:
    """(codes (..., n), scale bytes (..., nb)) -> float values (..., n)."""
    codes = np.asarray(codes)
    n = codes.shape[-1]
    dec = e2m1_decode if elem == "e2m1" else e4m3_decode
    scale = np.repeat(e8m0_decode(sb), block, axis=-1)[..., :n]
    return dec(codes) * scale


def fake_quantize(v, elem: str = "e2m1", block: int = BLOCK) -> np.ndarray:
    """dequantize(quantize(v)): the values an MX tensor holds, in float (QAT, float references)."""
    return mx_dequantize(*mx_quantize(v, elem, block), elem, block)


# ---- packing --------------------------------------------------------------------------

def pack_nibbles(codes) -> np.ndarray:
    """E2M1 codes (..., n) -> bytes (..., ceil(n/2)): element 2j low nibble, 2j+1 high (an
    odd row is padded with a zero code)."""
    c = np.asarray(codes, dtype=np.int64)
    if c.shape[-1] % 2:
        c = np.concatenate([c, np.zeros(c.shape[:-1] + (1,), np.int64)], axis=-1)
    if np.any((c < 0) | (c > 15)):
        raise ValueError("pack_nibbles: code outside 0..15")
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed, n: int) -> np.ndarray:
    """Bytes (..., ceil(n/2)) -> codes (..., n)."""
    p = np.asarray(packed, dtype=np.int64)
    c = np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[:-1] + (-1,))
    return c[..., :n]


def pack_mxfp4(codes, sb, block: int = BLOCK) -> np.ndarray:
    """Interleaved rows: per block its E8M0 byte, then block/2 element bytes (a partial last
    block padded with zero codes to a whole block): (..., n) codes and (..., nb) bytes ->
    (..., nb * (1 + block/2)) uint8; 17 bytes a block of 32."""
    codes = np.asarray(codes, dtype=np.int64)
    n = codes.shape[-1]
    nb = n_blocks(n, block)
    pad = nb * block - n
    if pad:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (pad,), np.int64)], axis=-1)
    sb = np.asarray(sb, dtype=np.int64)
    if sb.shape != codes.shape[:-1] + (nb,):
        raise ValueError(f"pack_mxfp4: {sb.shape[-1]} scale bytes for {nb} blocks")
    el = pack_nibbles(codes).reshape(codes.shape[:-1] + (nb, block // 2))
    return np.concatenate([sb.astype(np.uint8)[..., None], el], axis=-1).reshape(codes.shape[:-1] + (-1,))


def unpack_mxfp4(packed, n: int, block: int = BLOCK):
    """Inverse of ``pack_mxfp4``: (codes (..., n), scale bytes (..., nb))."""
    p = np.asarray(packed, dtype=np.int64)
    nb = n_blocks(n, block)
    if p.shape[-1] != nb * (1 + block // 2):
        raise ValueError(f"unpack_mxfp4: {p.shape[-1]} bytes, a row of {n} needs {nb * (1 + block // 2)}")
    p = p.reshape(p.shape[:-1] + (nb, 1 + block // 2))
    codes = unpack_nibbles(p[..., 1:], block).reshape(p.shape[:-2] + (-1,))[..., :n]
    return codes, p[..., 0]


def mxfp4_row_bytes(n: int, block: int = BLOCK) -> int:
    """Bytes of one MXFP4 row of n elements (whole blocks): 17 per 32."""
    return n_blocks(n, block) * (1 + block // 2)


# ---- the integer arithmetic of the MXFP4 engine --------------------------------------

def mx8_round_int(v, block: int = BLOCK) -> np.ndarray:
    """MXFP8 (E4M3, blocks of ``block`` along the last axis) of an integer vector, returned in
    the source's own integer units: each block gets X = bitlen(max|v|) - 1 - 8 and every
    element becomes RNE_E4M3(v / 2^X) * 2^X, saturating at 448 * 2^X.

    The result is an integer (the E4M3 grid times 2^X is never finer than 1 where it rounds)
    of at most the source's width: |r| <= 1.75 * 2^floor(log2 max|v|).  For a 16-bit source,
    every r has at most 4 significant bits (8 + m, or m below the normal range) times a power
    of two, so a hardware multiplier sees a 4-bit mantissa and a shift.  Exact in float64
    for |v| < 2^53 (powers of two only)."""
    v = np.asarray(v, dtype=np.int64)
    codes, sb = mx_quantize(v.astype(np.float64), "e4m3", block)
    r = mx_dequantize(codes, sb, "e4m3", block)
    out = np.rint(r).astype(np.int64)
    if not np.array_equal(out.astype(np.float64), r):
        raise AssertionError("mx8_round_int: a rounded value is not an integer")
    return out


def mx_weight_ints(codes, sb, floor_byte: int, block: int = BLOCK):
    """An MXFP4 matrix in the engine's integer form: elements in half units (E2M1, |.| <= 12)
    and the per-block left shift ``sb - floor_byte`` (>= 0)."""
    sh = np.asarray(sb, dtype=np.int64) - int(floor_byte)
    if np.any(sh < 0):
        raise ValueError("mx_weight_ints: a scale byte below the matrix floor")
    return e2m1_half_units(codes), sh


def mx_block_dot(w_half, shifts, x, block: int = BLOCK):
    """The MXFP4 engine's accumulator for rows of W (..., out, n) against x (..., n):

      p_i   = w_i * x_i                         w_i E2M1 in half units (5 bits signed), x_i int
      psum  = sum_{i in block b} p_i            exact
      acc   = sum_b psum_b << shift_b           shift_b = scale byte - the matrix's floor byte

    Every step is exact integer arithmetic (widths in ``mx_widths``).  The real value of acc
    is acc * 2^-1 * 2^(floor - 127) * (x's scale): the engine requantises it with the
    matrix's (M, s) as every other matrix."""
    w = np.asarray(w_half, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64)
    n = w.shape[-1]
    nb = n_blocks(n, block)
    pad = nb * block - n
    if pad:
        w = np.concatenate([w, np.zeros(w.shape[:-1] + (pad,), np.int64)], axis=-1)
        x = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), np.int64)], axis=-1)
    wb = w.reshape(w.shape[:-1] + (nb, block))                     # (out, nb, block)
    xb = x.reshape(x.shape[:-1] + (nb, block))                     # (..., nb, block)
    psum = np.einsum("obk,...bk->...ob", wb, xb)                   # (..., out, nb)
    return np.sum(psum << np.asarray(shifts, dtype=np.int64), axis=-1)


def mx_widths(n: int, x_bits: int, scale_range: int, block: int = BLOCK) -> dict[str, int]:
    """Exact worst-case signed widths of the engine's integers for a row of n elements against
    ``x_bits``-bit signed inputs, block shifts 0..scale_range."""
    from moekda.numerics import clog2
    prod = 5 + x_bits - 1                      # |w| <= 12 < 2^4, |x| <= 2^(x_bits-1)
    psum = prod + clog2(min(n, block))
    return {"mx_prod": prod, "mx_psum": psum, "mx_acc": psum + scale_range + clog2(n_blocks(n, block))}
