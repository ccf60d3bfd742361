"""The quantiser: weights, folded norms, multipliers and tables against the float parameters."""
import math

import numpy as np
import pytest

from moekda.config import load_config
from moekda.formats import formats_for
from model import float_layer as fl
from model.int_layer import int_run_layer, quantize_input
from model.int_ops import int_rmsnorm
from model.params import random_inputs, random_params
from model.qparams import QLayer
from model.quantize import act_scale, calibration_sequences, quant_weight, quantize_layer


@pytest.fixture(scope="module")
def tiny():
    cfg = load_config("tiny")
    p = random_params(cfg, seed=0)
    return cfg, p, quantize_layer(p, cfg, calibration_sequences(cfg, n_seq=2, n_tokens=64))


def test_weight_quantisation_error_is_half_lsb():
    fm = formats_for(load_config("tiny"))
    w = np.random.default_rng(0).normal(size=(16, 16))
    q, s = quant_weight(w, fm)
    assert q.max() <= 127 and q.min() >= -127 and np.max(np.abs(w - q * s)) <= s / 2 + 1e-12


def _qmse(v, s):
    return np.mean((np.clip(np.floor(v / s + 0.5), -127, 127) * s - v) ** 2)


def test_mse_scale_is_no_worse_than_max_scaling():
    rng = np.random.default_rng(1)
    flat = rng.uniform(-1, 1, 10000)
    assert math.isclose(act_scale(flat) * 127, 1.0, rel_tol=0.05)     # nothing to clip
    heavy = rng.normal(size=20000) * rng.normal(size=20000)           # like the SwiGLU hidden
    amax = np.max(np.abs(heavy))
    s = act_scale(heavy)
    assert s * 127 <= amax
    assert _qmse(heavy, s) <= _qmse(heavy, amax / 127) and _qmse(heavy, s) <= _qmse(heavy, amax / 254)
    assert math.isclose(act_scale(heavy, mse=False) * 127, amax)


def test_folded_rmsnorm_matches_float(tiny):
    cfg, p, qp = tiny
    fm = formats_for(cfg)
    for x in random_inputs(cfg, 20, seed=2):
        xi = quantize_input(x, qp, cfg)
        y = int_rmsnorm(xi, qp.attn_norm, fm) * qp.scales["xn_unit"]
        ref = np.clip(fl.rms_unit(x, cfg.model.norm_eps), -127 * qp.scales["xn_unit"], 127 * qp.scales["xn_unit"])
        assert np.max(np.abs(y - ref)) < 0.6 * qp.scales["xn_unit"] + 1e-3 * np.max(np.abs(ref))


def test_tables_follow_their_functions(tiny):
    cfg, p, qp = tiny
    fm = formats_for(cfg)
    codes = np.arange(-(1 << (fm.lut_in_bits - 1)), 1 << (fm.lut_in_bits - 1))
    beta = fl.sigmoid(codes * qp.scales["b_logit"]) * (1 << fm.unit_frac)
    assert np.max(np.abs(qp.kda.beta.table - beta)) <= 0.5
    assert np.all(np.diff(qp.kda.alpha.table) <= 0)   # larger z: faster decay, never above 1
    assert qp.kda.alpha.table.max() < 1 << fm.alpha_frac
    # SiLU is c * sigmoid (QSilu): within |x| (sigmoid's input step and table rounding, under
    # 0.005) and half an output step of SiLU in float, where v does not saturate
    from model.int_ops import int_silu
    x = codes * qp.scales["c_v"]
    silu_v = fl.silu(x)
    inside = np.abs(silu_v / qp.scales["v"]) < (1 << (fm.qkv_bits - 1)) - 1
    got = int_silu(qp.kda.silu_v, codes, fm) * qp.scales["v"]
    assert np.all(np.abs(got - silu_v)[inside] <= 0.005 * np.abs(x[inside]) + 0.5 * qp.scales["v"] + 1e-9)


def test_multipliers_reproduce_scales(tiny):
    cfg, p, qp = tiny
    lin = qp.kda.q_proj
    assert lin.m < 1 << formats_for(cfg).mult_bits
    sw = np.max(np.abs(p.kda.w_q * p.attn_norm_w)) / 127
    assert math.isclose(lin.m / 2 ** lin.s, sw * qp.scales["xn_unit"] / qp.scales["a_q"], rel_tol=1e-4)


def test_decay_bias_centres_the_code_range(tiny):
    cfg, p, qp = tiny
    tr = {}
    fl.kda_step(p.kda, cfg, fl.KDAState.zeros(cfg), np.zeros(cfg.model.d_model), tr)
    # f = 0: the bias alone gives z = A * dt_bias; the table must map it back to exp(g)
    fm = formats_for(cfg)
    from moekda.numerics import lut_lookup, requantize
    code = requantize(qp.kda.f_up.bias, qp.kda.f_up.m, qp.kda.f_up.s, fm.lut_in_bits)
    alpha = lut_lookup(qp.kda.alpha.table, code, fm.lut_in_bits) / (1 << fm.alpha_frac)
    assert np.max(np.abs(alpha - tr["alpha"])) < 0.02


def test_flat_roundtrip_is_exact(tiny, tmp_path):
    cfg, p, qp = tiny
    flat = qp.to_flat()
    np.savez(tmp_path / "q.npz", **flat)
    with np.load(tmp_path / "q.npz") as z:
        qp2 = QLayer.from_flat({k: z[k] for k in z.files})
    xs = quantize_input(random_inputs(cfg, 8, seed=3), qp, cfg)
    assert np.array_equal(int_run_layer(qp, cfg, xs), int_run_layer(qp2, cfg, xs))
    assert qp2.scales == qp.scales


def test_every_stored_parameter_is_an_integer(tiny):
    cfg, p, qp = tiny
    for name, v in qp.to_flat().items():
        if not name.startswith("scales."):
            assert np.asarray(v).dtype.kind == "i", name


def _write_safetensors(path, tensors):
    """A safetensors file written by hand (8-byte header size, JSON header, raw little-endian data)."""
    import json
    import struct
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_safetensors_checkpoint_loads_and_quantises(tiny, tmp_path):
    from model.params import load_params
    cfg, p, qp = tiny
    _write_safetensors(tmp_path / "ckpt.safetensors", p.to_flat())
    q = load_params(tmp_path / "ckpt.safetensors", cfg)
    for name, arr in p.to_flat().items():
        assert np.allclose(q.to_flat()[name], arr, rtol=1e-6, atol=1e-6)   # float32 in the file


def test_checkpoint_option_errors_are_one_line(tmp_path, capsys):
    from cli import main
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    assert main(["accuracy", "-c", "tiny", "-n", "8", "--params", str(tmp_path / "bad.npz"), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moekda accuracy: error: --params") and err.count("\n") == 1


def test_checkpoint_option_runs(tiny, tmp_path):
    from cli import main
    from model.params import save_params
    cfg, p, qp = tiny
    save_params(p, tmp_path / "p.npz")
    assert main(["vectors", "-c", "tiny", "-n", "4", "--params", str(tmp_path / "p.npz"), "-o", str(tmp_path / "v")]) == 0


def test_calibration_uses_the_models_channel_profile():
    """A layer drawn from seed P is calibrated on P's input channel profile (issue 13.6):
    tiny P = 12 has outlier channels that profile 0 lacks; calibrated on profile 0 its
    16-bit residual input saturated on its own evaluation sequence (range 17.8, inputs up
    to 29.8), calibrated on its own profile it covers them."""
    from model.quantize import quantize_random_layer
    cfg = load_config("tiny")
    seqs = calibration_sequences(cfg, n_seq=2, n_tokens=64, model_seed=12)
    ev = random_inputs(cfg, 256, seed=12, model_seed=12)
    # same per-channel profile: the channel RMS of the calibration and evaluation inputs agree
    rms = lambda a: np.sqrt(np.mean(np.concatenate(a) ** 2, axis=0))
    assert np.corrcoef(np.log(rms(seqs)), np.log(rms([ev])))[0, 1] > 0.9
    full = (1 << (formats_for(cfg).resid_bits - 1)) - 1
    own = quantize_random_layer(cfg, 12)
    assert np.abs(ev).max() <= own.scales["x"] * full
    stale = quantize_layer(random_params(cfg, 12), cfg, model_seed=0)   # the old default
    assert np.abs(ev).max() > stale.scales["x"] * full


def test_quantize_layer_takes_seqs_or_model_seed_not_both():
    cfg = load_config("tiny")
    with pytest.raises(ValueError, match="not both"):
        quantize_layer(random_params(cfg, 1), cfg, calibration_sequences(cfg, n_seq=1, n_tokens=8), model_seed=1)
