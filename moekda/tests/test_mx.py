"""MX formats (moekda/mx.py, issue 48): elements, scales, block quantisation, packing and the
MXFP4 engine's integer arithmetic.  Each rule test names the wrong rule it would catch."""
import numpy as np
import pytest

from moekda import mx

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e2m1_every_code_round_trips():
    codes = np.arange(16)
    v = mx.e2m1_decode(codes)
    assert list(v[:8]) == E2M1 and list(-v[8:]) == E2M1
    assert np.all(np.signbit(v[8:]))                     # code 8 is -0.0
    assert list(mx.e2m1_encode(v)) == list(codes)        # -0.0 keeps its sign
    assert list(mx.e2m1_half_units(codes)) == [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    assert np.array_equal(mx.e2m1_half_units(codes) / 2.0, v)


def test_e2m1_bit_layout():
    # s e1 e0 m: (-1)^s 2^(e-1) (1 + m/2), e = 0: m/2 (the OCP spec's table)
    for c in range(16):
        s, e, m = c >> 3, (c >> 1) & 3, c & 1
        ref = (-1) ** s * (2.0 ** (e - 1) * (1 + m / 2) if e else m / 2)
        assert mx.e2m1_decode(c) == ref


def test_e2m1_ties_to_even_and_saturation():
    # every midpoint between neighbours goes to the even code (mantissa bit 0); ties away
    # from zero would give 0.5, 1.5, 2, 3, 4, 6 here, the reference port's argmin 0, 0.5, 1, 1.5, 3, 4
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    assert list(mx.e2m1_decode(mx.e2m1_encode(mids))) == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert list(mx.e2m1_decode(mx.e2m1_encode(np.negative(mids)))) == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]
    # just off a tie goes to the nearer one (a truncating rule would not)
    assert list(mx.e2m1_decode(mx.e2m1_encode([0.26, 0.74, 1.76, 3.49, 5.01]))) == [0.5, 0.5, 2.0, 3.0, 6.0]
    assert list(mx.e2m1_decode(mx.e2m1_encode([6.0, 6.9, 7.0, 100.0, -1e30]))) == [6.0, 6.0, 6.0, 6.0, -6.0]
    with pytest.raises(ValueError):
        mx.e2m1_encode([np.nan])


def test_e4m3_every_code_round_trips():
    codes = np.arange(256)
    v = mx.e4m3_decode(codes)
    nan = np.isnan(v)
    assert list(np.nonzero(nan)[0]) == [0x7F, 0xFF]      # no Inf; only s 1111 111 is NaN
    assert list(mx.e4m3_encode(v)) == list(codes)         # NaN keeps its sign bit too
    # the fixed-point form: units of 2^-9
    ok = codes[~nan]
    assert np.array_equal(mx.e4m3_units(ok) * 2.0 ** -9, v[~nan])
    with pytest.raises(ValueError):
        mx.e4m3_units([0x7F])


def test_e4m3_known_values():
    # OCP FP8 E4M3: bias 7, max normal 1.75 * 2^8 = 448, min normal 2^-6, min subnormal 2^-9
    assert mx.e4m3_decode(0x7E) == 448.0 and mx.e4m3_decode(0xFE) == -448.0
    assert mx.e4m3_decode(0x08) == 2.0 ** -6 and mx.e4m3_decode(0x01) == 2.0 ** -9
    assert mx.e4m3_decode(0x38) == 1.0 and mx.e4m3_decode(0x07) == 7 * 2.0 ** -9
    assert mx.e4m3_units(0x7E) == 448 * 512


def test_e4m3_rounding_and_saturation():
    enc = lambda xs: list(mx.e4m3_decode(mx.e4m3_encode(xs)))
    # ties to even: 1 + 1/16 lies between 1 (m = 0) and 1.125 (m = 1); 1 + 3/16 between 1.125 and 1.25 (m = 2)
    assert enc([1 + 1 / 16, 1 + 3 / 16, -(1 + 1 / 16)]) == [1.0, 1.25, -1.0]
    # subnormal ties and the subnormal/normal boundary (7.5 * 2^-9 -> 8 * 2^-9 = 2^-6)
    assert enc([2.0 ** -10, 3 * 2.0 ** -10, 7.5 * 2.0 ** -9]) == [0.0, 2 * 2.0 ** -9, 2.0 ** -6]
    # saturation at 448: 464 (the tie with the NaN pattern's 480) and beyond, and Inf
    assert enc([449.0, 463.9, 464.0, 1e6, np.inf, -np.inf]) == [448.0, 448.0, 448.0, 448.0, 448.0, -448.0]


def test_e8m0():
    assert mx.e8m0_decode(127) == 1.0 and mx.e8m0_decode(130) == 8.0 and mx.e8m0_decode(0) == 2.0 ** -127
    assert np.isnan(mx.e8m0_decode(255))


def test_block_scale_is_the_ocp_floor_rule():
    # X = floor(log2 amax) - emax_elem; the scale of ceil(log2(amax / 6)) would differ on the
    # first two blocks (amax 7 -> 2^1 instead of 2^0; amax 3 -> 2^-1 vs 2^-1 equal; amax 4.5 -> 2^0 vs 2^0)
    v = np.zeros((1, 4 * 32))
    v[0, 0], v[0, 32], v[0, 64], v[0, 96] = 7.0, 3.0, 4.0, -0.75
    sb = mx.block_scale_bytes(v)
    assert list(sb[0] - 127) == [0, -1, 0, -3]
    codes, sb2 = mx.mx_quantize(v)
    deq = mx.mx_dequantize(codes, sb2)
    assert deq[0, 0] == 6.0                # 7 saturates at 6 x 2^0: the floor rule's cost
    assert deq[0, 32] == 3.0 and deq[0, 64] == 4.0 and deq[0, 96] == -0.75
    assert list(mx.block_scale_bytes(np.zeros((2, 32)))[:, 0]) == [0, 0]       # all-zero block
    # E4M3: emax 8
    assert mx.block_scale_bytes(np.full(32, 300.0), "e4m3")[0] - 127 == 0
    assert mx.block_scale_bytes(np.full(32, 1.0), "e4m3")[0] - 127 == -8


def test_block_quantisation_error_bound_and_partial_blocks():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 80)) * np.exp(rng.standard_normal((8, 1)))       # 2.5 blocks a row
    codes, sb = mx.mx_quantize(w)
    assert sb.shape == (8, 3)
    deq = mx.mx_dequantize(codes, sb)
    scale = np.repeat(mx.e8m0_decode(sb), 32, axis=-1)[:, :80]
    # below the saturation region the error is at most half a step of the E2M1 grid
    step = np.where(np.abs(w) / scale < 2, 0.5, np.where(np.abs(w) / scale < 4, 1.0, 2.0)) * scale
    inside = np.abs(w) / scale <= 6
    assert np.all(np.abs(deq - w)[inside] <= step[inside] / 2 + 1e-12)
    # the partial block is the zero-padded one
    pad = np.concatenate([w, np.zeros((8, 16))], axis=1)
    c2, sb2 = mx.mx_quantize(pad)
    assert np.array_equal(sb2, sb) and np.array_equal(c2[:, :80], codes)
    # min_byte raises small blocks to the floor
    _, sbf = mx.mx_quantize(w, min_byte=int(sb.max()))
    assert np.all(sbf == sb.max())


def test_packing_round_trip_and_layout():
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 16, (3, 64))
    sb = rng.integers(0, 255, (3, 2))
    p = mx.pack_mxfp4(codes, sb)
    assert p.shape == (3, 34) and mx.mxfp4_row_bytes(32) == 17 and mx.mxfp4_row_bytes(16) == 17
    assert p[0, 0] == sb[0, 0] and p[0, 17] == sb[0, 1]                       # scale byte first
    assert p[0, 1] == codes[0, 0] | (codes[0, 1] << 4)                        # low nibble first
    c2, sb2 = mx.unpack_mxfp4(p, 64)
    assert np.array_equal(c2, codes) and np.array_equal(sb2, sb)
    # a row of 16 (model-tiny) pads to one block of 17 bytes
    c16 = codes[:, :16]
    c3, sb3 = mx.unpack_mxfp4(mx.pack_mxfp4(c16, sb[:, :1]), 16)
    assert np.array_equal(c3, c16)
    # split form: the checkpoint's weight_packed
    assert np.array_equal(mx.unpack_nibbles(mx.pack_nibbles(codes), 64), codes)


def test_mx8_round_int_is_e4m3_in_the_sources_units():
    rng = np.random.default_rng(3)
    v = rng.integers(-32768, 32768, (16, 64)) >> rng.integers(0, 15, (16, 1))
    r = mx.mx8_round_int(v)
    codes, sb = mx.mx_quantize(v.astype(float), "e4m3")
    assert np.array_equal(r, mx.mx_dequantize(codes, sb, "e4m3"))
    assert np.max(np.abs(r)) <= 28672                     # 448 * 2^6: fits 16 bits
    # at most 4 significant bits: r / 2^ctz(r) < 16
    nz = r[r != 0]
    odd = np.abs(nz) >> np.array([int(np.log2(a & -a)) for a in np.abs(nz)])
    assert np.all(odd < 16)
    # small integers are exact (4 significant bits), except the floor rule's saturation: a block
    # maximum of 15 scales to 480 > 448 and becomes 14
    s = rng.integers(-14, 15, (4, 32))
    assert np.array_equal(mx.mx8_round_int(s), s)
    s[0, 0] = 15
    assert mx.mx8_round_int(s)[0, 0] == 14


@pytest.mark.parametrize("x_kind", ["int8", "mxfp8"])
def test_mx_engine_matches_dequantise_then_matmul(x_kind):
    """The integer accumulator times its LSB equals the float matmul of the dequantised matrix
    (to float rounding), with scale bytes spread over the floor's range."""
    rng = np.random.default_rng(7)
    out, n = 6, 96
    w = rng.standard_normal((out, n)) * np.exp2(rng.integers(-4, 4, (out, n // 32))).repeat(32, axis=1)
    sb0 = mx.block_scale_bytes(w)
    floor = int(sb0.max()) - 8
    codes, sb = mx.mx_quantize(w, min_byte=floor)
    half, sh = mx.mx_weight_ints(codes, sb, floor)
    assert sh.min() >= 0 and sh.max() <= 8
    if x_kind == "int8":
        x = rng.integers(-128, 128, (5, n))
        bits = 8
    else:
        x = mx.mx8_round_int(rng.integers(-32768, 32768, (5, n)))
        bits = 16
    acc = mx.mx_block_dot(half, sh, x)
    ref = x.astype(float) @ mx.mx_dequantize(codes, sb).T
    lsb = 0.5 * 2.0 ** (floor - 127)
    np.testing.assert_allclose(acc * lsb, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    wid = mx.mx_widths(n, bits, 8)["mx_acc"]
    assert np.all(np.abs(acc) < 2 ** (wid - 1))
    # worst case reaches the width's order: all +12 against the most negative input, every shift 8
    worst = mx.mx_block_dot(np.full((1, n), 12), np.full((1, 3), 8), np.full(n, -(1 << (bits - 1))))
    assert -(1 << (wid - 1)) <= worst[0] < -(1 << (wid - 2))
