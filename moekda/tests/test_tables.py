"""The tables the config fixes (moekda/tables.py): each entry is its function at its code's
value to half an output step, computed here independently with Python's math; the
quantiser uses exactly them; an image whose table differs is refused in one line; the
parameter bank carries none of them."""
from __future__ import annotations

import math

import numpy as np
import pytest

from moekda.config import load_config
from moekda.formats import formats_for
from moekda.tables import (ALPHA_Z_MID, FIXED_TABLES, SILU_SIGMOID, fixed_in_scale, fixed_table, fixed_table_bits,
                           silu_sigmoid_in_bits, table_in_offset, table_in_scale)

CONFIGS = ("tiny", "small", "model-tiny-hybrid")


def _in_bits(cfg, name: str) -> int:
    fm = formats_for(cfg)
    return silu_sigmoid_in_bits(fm) if name == SILU_SIGMOID else fm.lut_in_bits


def _expected(cfg, name: str, code: int) -> float:
    """The real output value the entry of ``code`` stands for."""
    x = (0.0 if name == SILU_SIGMOID else table_in_offset(name)) + code * fixed_in_scale(_in_bits(cfg, name))
    sig = 1.0 / (1.0 + math.exp(-x))
    return math.exp(cfg.model.decay_lower_bound * sig) if name == "kda.alpha" else sig


def _out_step(cfg, name: str) -> float:
    fm = formats_for(cfg)
    return 2.0 ** -{"kda.alpha": fm.alpha_frac, "moe.score": fm.score_frac}.get(name, fm.unit_frac)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", (*FIXED_TABLES, SILU_SIGMOID))
def test_every_entry_is_its_function_to_half_a_step(config, name):
    cfg = load_config(config)
    lb = _in_bits(cfg, name)
    table = fixed_table(cfg, name)
    assert table.shape == (1 << lb,) and table.dtype == np.int64
    step = _out_step(cfg, name)
    codes = range(-(1 << (lb - 1)), 1 << (lb - 1))
    for code, entry in zip(codes, table):
        want = _expected(cfg, name, code)
        if name == "kda.alpha":
            want = min(max(want, step), 1.0 - step)     # alpha's codes are 1 .. 2**alpha_frac - 1
        assert abs(entry * step - want) <= step / 2 + 1e-12, (name, code, entry, want)
    assert 0 <= table.min() and table.max() < 1 << fixed_table_bits(cfg, name)
    diffs = np.diff(table)
    assert (diffs <= 0).all() if name == "kda.alpha" else (diffs >= 0).all()   # monotone


def test_the_input_format_spans_eight_either_side_of_its_centre():
    cfg = load_config("tiny")
    lb = formats_for(cfg).lut_in_bits
    assert table_in_scale(cfg) * (1 << (lb - 1)) == 8.0
    assert table_in_offset("kda.alpha") == ALPHA_Z_MID and table_in_offset("moe.score") == 0.0
    with pytest.raises(KeyError, match="not a fixed table"):
        fixed_table(cfg, "moe.silu")


def test_the_quantiser_uses_the_configs_tables_and_the_bank_has_none():
    from hw.image.param_map import param_fields
    from model.quantize import quantize_random_layer
    cfg = load_config("tiny")
    q = quantize_random_layer(cfg, 3)
    flat = q.to_flat()
    for name in ("kda.alpha", "kda.beta", "kda.gate", "moe.score"):
        assert np.array_equal(flat[f"{name}.table"], fixed_table(cfg, name)), name
    loaded = {f.name for f in param_fields(cfg)}
    assert not [n for n in loaded if n.endswith(".table")]     # SiLU too: c * sigmoid, no table
    assert {"kda.silu_q.t_m", "kda.silu_v.s", "moe.silu.t_s", "moe.silu.m"} <= loaded


@pytest.mark.parametrize("s_code", (0.004, 0.03, 0.1, 0.5))
@pytest.mark.parametrize("out_step", (1.0, 2.0 ** -8, 1.7 ** -8))
def test_silu_as_c_times_sigmoid_is_silu_within_its_error_bound(s_code, out_step):
    """int_silu over every code against SiLU in float (math), at output scales of the code's
    (the MoE's), of c * sigmoid (q, k) and another (v): the sigmoid's input code is rounded
    to half a step of its format (sigmoid's slope is at most 1/4), its table to half an output
    step, its input clipped at +-8 (sigmoid within 3.4e-4 of 1); the product's
    requantisation rounds to half an output step."""
    from model.int_ops import int_silu
    from model.quantize import _silu
    fm = formats_for(load_config("tiny"))
    uf, tb = fm.unit_frac, silu_sigmoid_in_bits(fm)
    s_out = s_code * out_step
    q = _silu(s_code, s_out, fm.qkv_bits, fm)
    codes = np.arange(-(1 << (fm.lut_in_bits - 1)), 1 << (fm.lut_in_bits - 1))
    x = codes * s_code
    want = np.array([v / (1.0 + math.exp(-v)) for v in x])
    if want.max() / s_out >= 2 ** (fm.qkv_bits - 1):
        pytest.skip("the output format saturates")
    got = int_silu(q, codes, fm) * s_out
    d_sig = 0.25 * 0.5 * fixed_in_scale(tb) * (1 + 2.0 ** -14) + 2.0 ** -(uf + 1) + 3.4e-4
    bound = np.abs(x) * (d_sig + 2.0 ** -14) + s_out / 2 + 1e-12
    assert (np.abs(got - want) <= bound).all(), float(np.max(np.abs(got - want) - bound))


def test_an_image_with_another_table_is_refused_in_one_line():
    from hw.image.format import pack_image
    from hw.image.memory_map import qlayer_tensors
    from model.quantize import quantize_random_layer
    cfg = load_config("tiny")
    q = quantize_random_layer(cfg, 3)
    flat = q.to_flat()
    flat["kda.beta.table"] = flat["kda.beta.table"].copy()
    flat["kda.beta.table"][7] += 1
    with pytest.raises(ValueError, match=r"^parameter kda\.beta\.table: not the table this config fixes") as e:
        pack_image(cfg, flat, qlayer_tensors(q))
    assert "\n" not in str(e.value)
