"""The config is the single source of truth: it must refuse bad values with
one line naming the field and the allowed range, and accept the shipped ones."""
import subprocess
import sys

import pytest

from moekda.config import CONFIG_DIR, ConfigError, config_from_dict, load_config


def base(**sections):
    raw = {"name": "t", "model": {}, "hw": {}, "formats": {}}
    for sec, values in sections.items():
        raw[sec] = values
    return raw


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_configs_are_valid(path):
    cfg = load_config(path)
    assert cfg.name == path.stem
    assert cfg.model.top_k <= cfg.model.n_experts


def test_issue_sizes():
    tiny, small = load_config("tiny"), load_config("small")
    assert (tiny.model.d_model, tiny.model.n_heads, tiny.model.head_dim, tiny.model.n_experts,
            tiny.model.top_k, tiny.model.d_ff, tiny.model.n_shared, tiny.hw.lanes) == (16, 1, 16, 4, 2, 16, 1, 4)
    assert (small.model.d_model, small.model.n_heads, small.model.head_dim, small.model.n_experts,
            small.model.top_k, small.model.d_ff, small.model.n_shared, small.hw.lanes,
            small.hw.weight_port_bytes) == (64, 2, 32, 8, 2, 64, 1, 16, 16)


@pytest.mark.parametrize("raw, needle", [
    (base(model={"d_model": 2}), "model.d_model = 2: allowed range is 4 to 4096"),
    (base(model={"top_k": 5, "n_experts": 4}), "model.top_k = 5: allowed range is 1 to model.n_experts (4)"),
    (base(hw={"lanes": 3}), "hw.lanes = 3: must be a power of two"),
    (base(hw={"lanes": 8, "weight_port_bytes": 4}), "hw.lanes = 8: must equal hw.weight_port_bytes (4)"),
    (base(hw={"clock_period_ns": "fast"}), "hw.clock_period_ns = 'fast': must be a number"),
    (base(formats={"act_bits": 16}), "formats.act_bits = 16: allowed values are 8"),
    (base(formats={"acc_bits": 40, "requant_mult_bits": 24}),
     "formats.requant_mult_bits = 24: acc_bits + requant_mult_bits must be at most 61 (allowed range here 8 to 21)"),
    (base(model={"heads": 2}), "model.heads: unknown field"),
    (base(model={"n_heads": True}), "model.n_heads = True: must be an integer"),
    ({"name": "t", "modle": {}}, "[modle]: unknown section"),
    ({"model": {}}, "name = None"),
])
def test_bad_values_name_field_and_range(raw, needle):
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)
    msg = str(e.value)
    assert needle in msg
    assert "\n" not in msg


def test_hash_changes_with_values_only():
    a = config_from_dict(base(), source="a")
    b = config_from_dict(base(), source="b")
    c = config_from_dict(base(hw={"lanes": 8, "weight_port_bytes": 8}))
    assert a.hash() == b.hash() != c.hash()


def test_cli_bad_config_is_one_line_and_nonzero(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n[hw]\nlanes = 1000\n')
    r = subprocess.run([sys.executable, "-m", "moekda", "config", "-c", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == "moekda config: error: hw.lanes = 1000: allowed range is 1 to 256"
    assert "Traceback" not in r.stderr


def test_cli_unknown_config_lists_known():
    r = subprocess.run([sys.executable, "-m", "moekda", "config", "-c", "nosuch"], capture_output=True, text=True)
    assert r.returncode == 2 and "known configs:" in r.stderr and "tiny" in r.stderr


@pytest.mark.parametrize("model, needle", [
    ({"d_model": 4096, "n_experts": 1024, "d_ff": 16384}, "the layer's weights would be"),
    ({"d_model": 1024, "n_heads": 4, "head_dim": 256}, "the KDA state would be"),
])
def test_resource_limits_refuse_huge_configs(model, needle):
    """Configs every field of which is in range but that no machine here could generate: refused
    in one line before any array is built."""
    with pytest.raises(ConfigError) as e:
        config_from_dict(base(model=model))
    assert needle in str(e.value) and "limit is" in str(e.value) and "\n" not in str(e.value)


def test_config_loader_fuzz(tmp_path):
    """Random TOML-ish and random-valued configs (a bounded number, fixed seed): the loader
    either accepts or raises ConfigError with one line, never another exception."""
    import random

    from moekda.config import SECTIONS
    import dataclasses
    rng = random.Random(1234)
    fields = [(sec, f) for sec, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
    values = [0, 1, -1, 3, 7, 64, 4096, 1 << 40, 0.5, -2.5, "x", True, None, [], {}, 1e300]
    ok = refused = 0
    for n in range(300):
        raw = base()
        for _ in range(rng.randrange(1, 5)):
            sec, f = rng.choice(fields)
            v = rng.choice(values)
            if v is None:
                continue
            raw.setdefault(sec, {})[f.name] = v
        try:
            config_from_dict(raw)
            ok += 1
        except ConfigError as e:
            assert "\n" not in str(e)
            refused += 1
    for n in range(100):    # raw bytes as TOML
        p = tmp_path / f"f{n}.toml"
        p.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 80))))
        try:
            load_config(p)
        except ConfigError as e:
            assert "\n" not in str(e) or "TOML" in str(e)
    assert ok and refused
