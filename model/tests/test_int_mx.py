"""MXFP4 routed experts and MXFP8 expert inputs in the config, the quantiser and the integer
model (issue 48 items 1-2; moekda/mx.py, docs/numerics.md section 11)."""
import subprocess
import sys

import numpy as np
import pytest

from moekda import mx
from moekda.config import (ConfigError, REPO_ROOT, config_from_dict, load_config, require_chip_formats,
                           require_chip_model, require_image_model, with_settings)
from moekda.formats import derived_widths, formats_for
from model.int_model import dequantize_logits, int_next_tokens, int_run_model
from model.int_moe import _bank_acc
from model.float_model import next_tokens, run_model
from model.params import random_model_params, random_tokens
from model.qparams import QModel
from model.quantize import quantize_model


def test_formats_default_to_int8_and_leave_every_config_unchanged():
    for name in ("tiny", "small", "model-tiny", "model-small-sram", "model-tiny-hybrid"):
        cfg = load_config(name)
        assert (cfg.formats.routed_expert_weights, cfg.formats.shared_expert_weights,
                cfg.formats.expert_inputs) == ("int8", "int8", "int8")
        assert "routed_expert_weights" not in cfg.to_dict()["formats"]       # the hash is what it was
        require_chip_formats(cfg)
        assert "mx_acc" not in derived_widths(cfg)


def test_bad_and_unbuilt_formats_are_one_line_errors():
    base = load_config("model-tiny-sram")
    with pytest.raises(ConfigError, match=r"formats.routed_expert_weights = 'fp4': allowed values are int8, mxfp4"):
        with_settings(base, ['formats.routed_expert_weights="fp4"'])
    with pytest.raises(ConfigError, match=r"formats.expert_inputs = 'e4m3': allowed values are int8, mxfp8_e4m3"):
        with_settings(base, ['formats.expert_inputs="e4m3"'])
    with pytest.raises(ConfigError, match=r'formats.expert_inputs = "mxfp8_e4m3": needs formats.routed_expert_weights'):
        with_settings(base, ['formats.expert_inputs="mxfp8_e4m3"'])
    cfg = load_config("model-tiny-mxfp4")
    assert (cfg.formats.routed_expert_weights, cfg.formats.expert_inputs) == ("mxfp4", "mxfp8_e4m3")
    for check in (require_chip_model, require_image_model, require_chip_formats):
        with pytest.raises(ConfigError, match="the chip's MXFP4 engine is not built yet") as e:
            check(cfg)
        assert "\n" not in str(e.value)
    shared = with_settings(base, ['formats.shared_expert_weights="mxfp4"'])
    with pytest.raises(ConfigError, match="shared_expert_weights"):
        require_chip_model(shared)


def test_chip_commands_refuse_in_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "cli", "rtl", "-c", "model-tiny-mxfp4"], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "MXFP4 engine is not built yet" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def tiny_mx():
    cfg = load_config("model-tiny-mxfp4")
    mp = random_model_params(cfg, 31)
    return cfg, mp, quantize_model(mp, cfg, model_seed=31)


def test_quantiser_puts_routed_experts_in_mxfp4(tiny_mx):
    cfg, mp, qm = tiny_mx
    fm = formats_for(cfg)
    for l, q in enumerate(qm.layers):
        if q.moe is None:
            assert q.dense.chunks.gate_sb is None                 # the dense layer stays int8 (K3)
            continue
        b = q.moe.routed
        assert q.moe.shared.gate_sb is None and q.moe.mx_norm is not None
        for name in ("gate", "up", "down"):
            w, sb, sf = getattr(b, f"{name}_w"), getattr(b, f"{name}_sb"), getattr(b, f"{name}_sf")
            assert set(np.unique(np.abs(w))) <= {0, 1, 2, 3, 4, 6, 8, 12}
            assert sb.shape == w.shape[:2] + (1,)                 # rows of 16: one partial block
            sh = sb - sf[:, None, None]
            assert sh.min() >= 0 and sh.max() <= fm.mx_scale_range
            # the stored elements are the MX quantisation of the folded float matrix
            e = 1
            wf = getattr(mp.layers[l].moe, {"gate": "w_gate", "up": "w_up", "down": "w_down"}[name])[e]
            if name != "down":
                wf = wf * mp.layers[l].mlp_norm_w[None, :]
            codes, sb_ref = mx.mx_quantize(wf, min_byte=int(sf[e]))
            assert np.array_equal(mx.e2m1_half_units(codes), w[e]) and np.array_equal(sb_ref, sb[e])
    # the integer parameters survive the flat form (what vectors and images are written from)
    back = QModel.from_flat(qm.to_flat(), cfg.model.n_layers)
    assert np.array_equal(back.layers[1].moe.routed.up_sb, qm.layers[1].moe.routed.up_sb)
    assert back.layers[1].moe.mx_norm == qm.layers[1].moe.mx_norm


def test_bank_accumulator_is_the_dequantised_matmul(tiny_mx):
    cfg, _, qm = tiny_mx
    fm = formats_for(cfg)
    b = qm.layers[2].moe.routed
    rng = np.random.default_rng(4)
    x = mx.mx8_round_int(rng.integers(-32768, 32768, (7, cfg.model.d_model)))
    for e in range(b.gate_w.shape[0]):
        acc = _bank_acc(b, "gate", e, x, fm, "t")
        deq = b.gate_w[e] * (2.0 ** (b.gate_sb[e] - b.gate_sf[e])).repeat(32, axis=1)[:, :cfg.model.d_model]
        assert np.array_equal(acc, (x @ deq.T).astype(np.int64))


@pytest.mark.parametrize("settings", [[], ['formats.expert_inputs="int8"'], ["model.moe_latent=8"]])
def test_integer_model_runs_mxfp4_experts_close_to_float(settings):
    """End to end: the integer model with MXFP4 experts (and MXFP8 inputs) tracks the float
    model; bounds well below the measured means (docs/numerics.md section 11).  One fixed
    seed pair, so the test cannot flake: top-1 agreement on a random model's near-tied logits
    has a long tail (CI drew a seed at 0.48 once; seeds 2000-2039 span 0.54-1.0), and the
    fresh-seed measurement is the study's job (`python -m model.mx_accuracy`)."""
    cfg = with_settings(load_config("model-tiny-mxfp4"), settings)
    seed = 2000                                   # the first of the range, not a chosen one
    mp = random_model_params(cfg, seed)
    qm = quantize_model(mp, cfg, model_seed=seed)
    toks = random_tokens(cfg, 48, seed=seed + 1, model_seed=seed)
    traces = []
    li = int_run_model(qm, cfg, toks, traces=traces)
    lf = run_model(mp, cfg, toks)
    cos = np.sum(lf * dequantize_logits(qm, li), 1) / (np.linalg.norm(lf, axis=1) *
                                                       np.linalg.norm(dequantize_logits(qm, li), axis=1))
    print(f"seed {seed}: logits cos mean {cos.mean():.4f}, top-1 agree "
          f"{np.mean(next_tokens(lf) == int_next_tokens(li)):.3f}")
    assert cos.mean() > 0.85                      # sanity bounds on 48 tokens of a random pair
    assert np.mean(next_tokens(lf) == int_next_tokens(li)) > 0.5
    if cfg.formats.expert_inputs == "mxfp8_e4m3":
        t = traces[5]["layers"][1]
        assert np.array_equal(t["mx_in"], mx.mx8_round_int(t["mx_src"]))
        assert np.max(np.abs(t["mx_in"])) < 1 << 15
