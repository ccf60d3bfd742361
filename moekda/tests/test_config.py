"""The config is the single source of truth: it must refuse bad values with
one line naming the field and the allowed range, and accept the shipped ones."""
import subprocess
import sys

import pytest

from moekda.config import CONFIG_DIR, ConfigError, config_from_dict, load_config, resource_estimate


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
    r = subprocess.run([sys.executable, "-m", "cli", "config", "-c", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == "moekda config: error: hw.lanes = 1000: allowed range is 1 to 256"
    assert "Traceback" not in r.stderr


def test_cli_unknown_config_lists_known():
    r = subprocess.run([sys.executable, "-m", "cli", "config", "-c", "nosuch"], capture_output=True, text=True)
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


# ---- the model stack (issue 14) ----------------------------------------------------------

def test_one_layer_configs_keep_their_hash_and_dict():
    """The stack fields at their defaults are not in the dict: small's hash (and so its images'
    CONFIG_HASH and every cached result) is what it was before issue 14; tiny's too until its
    KDA state moved to SRAM (issue 45: a28410a27b81 before)."""
    assert load_config("tiny").hash() == "61281021d124"
    assert load_config("small").hash() == "ab9697d08b4b"
    for name in ("tiny", "small"):
        cfg = load_config(name)
        assert cfg.model.is_layer_chip and cfg.model.n_layers == 1 and cfg.model.vocab == 0
        assert cfg.model.layers == ("kda",) and cfg.model.mixers == ("moe",)
        assert not {"n_layers", "layers", "mixers", "d_ff_dense", "vocab", "tie_embedding"} & set(cfg.to_dict()["model"])


def test_model_configs():
    # model-tiny keeps its KDA state in flip-flops (model-tiny-sram has SRAM): tiny-flops' layer
    for name, layer, vocab, tied, slots in (("model-tiny", "tiny-flops", 64, True, 2),
                                            ("model-small", "small", 256, False, 3)):
        cfg, one = load_config(name), load_config(layer)
        m = cfg.model
        assert (m.n_layers, m.layers, m.mixers, m.vocab, m.tie_embedding) == (
            4, ("kda",) * 4, ("dense", "moe", "moe", "moe"), vocab, tied)
        assert 64 <= m.vocab <= 256 and not m.is_layer_chip
        # the layers are the one-layer config's, field for field
        same = {k: v for k, v in one.to_dict()["model"].items()}
        assert {k: cfg.to_dict()["model"][k] for k in same} == same
        # the layer config's hardware, running two (model-small: three) sequences side by side
        assert cfg.hw.sequences == slots and one.hw.sequences == 1
        assert {k: v for k, v in cfg.to_dict()["hw"].items() if k != "sequences"} == one.to_dict()["hw"]
        assert cfg.to_dict()["formats"] == one.to_dict()["formats"]
        assert m.d_ff_dense == (m.top_k + m.n_shared) * m.d_ff and m.dense_chunks == m.top_k + m.n_shared


def test_stack_defaults_and_round_trip():
    cfg = config_from_dict(base(model={"n_layers": 3, "vocab": 32}))
    assert cfg.model.layers == ("kda",) * 3 and cfg.model.mixers == ("moe",) * 3
    assert cfg.model.d_ff_dense == 3 * cfg.model.d_ff and not cfg.model.tie_embedding
    explicit = config_from_dict(base(model={"n_layers": 3, "vocab": 32, "layers": ["kda"] * 3,
                                            "mixers": ["moe"] * 3, "d_ff_dense": 48}))
    assert explicit.hash() == cfg.hash()
    other = config_from_dict(base(model={"n_layers": 3, "vocab": 32, "mixers": ["dense", "moe", "moe"]}))
    assert other.hash() != cfg.hash()
    d = other.to_dict()
    assert d["model"]["mixers"] == ["dense", "moe", "moe"]          # lists, as TOML writes them
    back = config_from_dict({"name": "t", **d})
    assert back == other
    from studies.sweep import to_toml                                  # the sweep writes configs as TOML
    import tomllib
    assert config_from_dict(tomllib.loads(to_toml({"name": "t", **d}))) == other


@pytest.mark.parametrize("model, needle", [
    ({"n_layers": 0}, "model.n_layers = 0: allowed range is 1 to 64"),
    ({"n_layers": 65}, "model.n_layers = 65: allowed range is 1 to 64"),
    ({"n_layers": 2, "layers": ["kda"]}, "model.layers has 1 entry: must have one per layer, model.n_layers = 2"),
    ({"n_layers": 2, "mixers": ["moe", "moe", "dense"]}, "model.mixers has 3 entries: must have one per layer"),
    ({"layers": ["attn"]}, "model.layers[0] = 'attn': allowed values are kda, mla"),
    ({"n_layers": 2, "mixers": ["moe", "sparse"]}, "model.mixers[1] = 'sparse': allowed values are moe, dense"),
    ({"layers": "kda"}, "model.layers = 'kda': must be \"k3\" or a non-empty list of 'kda', 'mla', one per layer"),
    ({"mixers": []}, "model.mixers = []: must be a non-empty list"),
    ({"mixers": [1]}, "model.mixers[0] = 1: allowed values are moe, dense"),
    ({"vocab": 8}, "model.vocab = 8: allowed values are 0 (no embedding or LM head) or 16 to 65536"),
    ({"vocab": 65537}, "model.vocab = 65537: allowed range is 0 to 65536"),
    ({"vocab": -1}, "model.vocab = -1: allowed range is 0 to 65536"),
    ({"vocab": 64, "tie_embedding": 1}, "model.tie_embedding = 1: must be true or false"),
    ({"tie_embedding": True}, "model.tie_embedding = True: needs a vocabulary"),
    ({"d_ff_dense": 40, "mixers": ["dense"]}, "model.d_ff_dense = 40: must be a multiple of model.d_ff (16)"),
    ({"d_ff_dense": -16}, "model.d_ff_dense = -16: allowed range is 0 to 262144"),
])
def test_bad_stack_values_name_field_and_range(model, needle):
    with pytest.raises(ConfigError) as e:
        config_from_dict(base(model=model))
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("model, needle", [
    # each layer alone is fine; the stack is not
    ({"d_model": 1024, "d_ff": 1024, "n_experts": 16, "n_layers": 8, "gate_rank": 16},
     "model.n_layers = 8, model.vocab = 0: the model's weights would be"),
    ({"d_model": 2048, "d_ff": 64, "n_experts": 4, "vocab": 65536, "gate_rank": 16}, "the model's weights would be"),
    ({"d_model": 256, "n_heads": 4, "head_dim": 64, "n_layers": 8}, "in 8 layers: the KDA state would be"),
])
def test_resource_limits_count_the_stack(model, needle):
    one = {k: v for k, v in model.items() if k not in ("n_layers", "vocab")}
    config_from_dict(base(model=one))                    # one layer of it is accepted
    with pytest.raises(ConfigError) as e:
        config_from_dict(base(model=model))
    assert needle in str(e.value) and "limit is" in str(e.value) and "\n" not in str(e.value)


def test_tied_embedding_counts_once():
    from moekda.config import resource_estimate
    tied = config_from_dict(base(model={"vocab": 256, "tie_embedding": True}))
    untied = config_from_dict(base(model={"vocab": 256}))
    layer = config_from_dict(base())
    d = layer.model.d_model
    assert resource_estimate(tied)["weight_bytes"] - resource_estimate(layer)["weight_bytes"] == 256 * d
    assert resource_estimate(untied)["weight_bytes"] - resource_estimate(layer)["weight_bytes"] == 2 * 256 * d


def test_cli_bad_stack_value_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n[model]\nn_layers = 2\nmixers = ["moe"]\n')
    r = subprocess.run([sys.executable, "-m", "cli", "config", "-c", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == ("moekda config: error: model.mixers has 1 entry: must have one per layer, "
                                "model.n_layers = 2")


def test_state_memory_field():
    """hw.state_memory (issue 14 item 3): flops by default and then absent from the dict, so
    small keeps its hash; each pair of configs differs in this one field (tiny has its state
    in SRAM since issue 45, tiny-flops in flip-flops; small in flip-flops, small-sram not)."""
    for flops_name, sram_name in (("tiny-flops", "tiny"), ("small", "small-sram")):
        cfg, sram = load_config(flops_name), load_config(sram_name)
        assert cfg.hw.state_memory == "flops" and sram.hw.state_memory == "sram" and sram.hash() != cfg.hash()
        a, b = cfg.to_dict(), sram.to_dict()
        assert b["hw"].pop("state_memory") == "sram" and a["hw"].pop("state_memory", "flops") == "flops"
        assert {**a, "name": None} == {**b, "name": None}
    assert "state_memory" not in load_config("small").to_dict()["hw"]
    explicit = config_from_dict(base(hw={"state_memory": "flops"}))
    assert explicit.hash() == config_from_dict(base()).hash()
    with pytest.raises(ConfigError, match="hw.state_memory = 'latches': allowed values are flops, sram"):
        config_from_dict(base(hw={"state_memory": "latches"}))


def test_sequences_field():
    """hw.sequences: 1 to 4, more than one only on a model chip; one line naming the field."""
    raw = load_config("model-tiny").to_dict()
    assert config_from_dict({**raw, "name": "x", "hw": {**raw["hw"], "sequences": 4}}).hw.sequences == 4
    for bad, says in ((5, "hw.sequences"), (0, "hw.sequences")):
        with pytest.raises(ConfigError, match=says):
            config_from_dict({**raw, "name": "x", "hw": {**raw["hw"], "sequences": bad}})
    tiny = load_config("tiny").to_dict()
    with pytest.raises(ConfigError, match="hw.sequences = 2: more than one sequence needs the model chip"):
        config_from_dict({**tiny, "name": "x", "hw": {**tiny["hw"], "sequences": 2}})
    assert "sequences" not in tiny["hw"]          # the default keeps older configs' hashes


# ---- K3's hybrid (issue 15) --------------------------------------------------------------

@pytest.mark.parametrize("model, needle", [
    ({"layers": ["mla"]}, 'model.kv_rank = 0: an "mla" layer in model.layers needs its latent width'),
    ({"layers": ["mla"], "kv_rank": 5000}, "model.kv_rank = 5000: allowed range is 0 to 4096"),
    ({"attn_res": "half"}, "model.attn_res = 'half': allowed values are none, full, block"),
    ({"attn_res": "block", "attn_res_block": 0}, "model.attn_res_block = 0: allowed range is 1 to 128"),
    ({"moe_latent": 16}, "model.moe_latent = 16: allowed range is 1 to model.d_model - 1 (15)"),
    ({"moe_latent": 8, "mixers": ["dense"]}, 'model.moe_latent = 8: no "moe" in model.mixers'),
])
def test_bad_hybrid_values_name_field_and_range(model, needle):
    with pytest.raises(ConfigError) as e:
        config_from_dict(base(model=model))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_hybrid_fields_keep_old_hashes_and_attn_res_is_refused_by_the_chip():
    from moekda.config import hybrid_parts, layer_weight_bytes, require_chip_model
    plain = config_from_dict(base())
    assert not any(k in plain.to_dict()["model"] for k in ("kv_rank", "attn_res", "attn_res_block", "moe_latent"))
    require_chip_model(plain)
    hy = config_from_dict(base(model={"n_layers": 4, "layers": ["kda", "kda", "kda", "mla"], "kv_rank": 8,
                                      "attn_res": "block", "moe_latent": 8}))
    assert hy.to_dict()["model"]["kv_rank"] == 8 and hy.hash() != plain.hash()
    assert len(hybrid_parts(hy.model)) == 3
    with pytest.raises(ConfigError, match='model.attn_res = "block" runs on the model chip only'):
        require_chip_model(hy)              # vocab 0: the layer chip, which has no depth unit
    # an MLA layer has no KDA state; LatentMoE's routed experts shrink by moe_latent / d_model
    assert resource_estimate(hy)["state_bits"] == 3 * resource_estimate(plain)["state_bits"]
    m = hy.model
    lat_moe = layer_weight_bytes(hy, "moe", "kda") - layer_weight_bytes(plain, "moe", "kda")
    assert lat_moe == m.n_experts * 3 * m.d_ff * (8 - 16) + 2 * 8 * 16


def test_the_image_holds_the_hybrid_and_the_chip_refuses_attn_res_without_a_vocabulary():
    from moekda.config import require_chip_model, require_image_model
    require_image_model(config_from_dict(base()))
    mla = config_from_dict(base(model={"n_layers": 4, "layers": ["kda", "kda", "kda", "mla"], "kv_rank": 8}))
    require_image_model(mla)
    require_chip_model(mla)                 # the model chip runs MLA layers
    hy = config_from_dict(base(model={"n_layers": 4, "layers": ["kda", "kda", "kda", "mla"], "kv_rank": 8,
                                      "attn_res": "block", "moe_latent": 8}))
    require_image_model(hy)                 # the image holds Attention Residuals (model/tests/test_model_image.py)
    with pytest.raises(ConfigError) as e:
        require_chip_model(hy)
    assert str(e.value) == ('config t: model.attn_res = "block" runs on the model chip only, which needs '
                            'model.vocab (16 to 65536)')
    with_vocab = base(model={"n_layers": 4, "attn_res": "full", "vocab": 64})
    require_chip_model(config_from_dict(with_vocab))      # the model chip's depth unit
    lat = config_from_dict(base(model={"moe_latent": 8}))
    require_image_model(lat)
    require_chip_model(lat)


def test_with_settings_replaces_fields_and_checks_them():
    from moekda.config import with_settings
    base = load_config("model-tiny")
    cfg = with_settings(base, ["model.moe_latent=8", 'model.layers=["kda", "kda", "kda", "mla"]', "model.kv_rank = 8"])
    assert cfg.model.moe_latent == 8 and cfg.model.layers == ("kda", "kda", "kda", "mla") and cfg.model.kv_rank == 8
    assert cfg.name == base.name and cfg.hash() != base.hash()
    assert with_settings(base, []).hash() == base.hash()
    for bad, msg in (("moe_latent=8", "must be section.field=value"), ("mdl.x=1", "unknown section 'mdl'"),
                     ("model.moe_latnt=8", "model.moe_latnt: unknown field"), ("model.moe_latent=eight", "not a TOML value"),
                     ("model.moe_latent=16", "model.moe_latent = 16: allowed range is 1 to model.d_model - 1")):
        with pytest.raises(ConfigError, match=msg):
            with_settings(base, [bad])


@pytest.mark.parametrize("bad, why", [("columns", "allowed are"), (3.0, "must be a string"),
                                      ("configs/nothing.tcl", "allowed are")])
def test_a_macro_placement_is_a_method_or_a_committed_file(bad, why):
    d = dict(load_config("tiny").to_dict(), name="x", pnr={"macro_placement": bad})
    with pytest.raises(ConfigError, match=f"pnr.macro_placement = .*{why}"):
        config_from_dict(d)
    assert load_config("tiny").pnr.macro_placement == "column"
    # a field added at its default leaves the config's hash alone (bench records keep it)
    assert "macro_placement" not in load_config("tiny").to_dict()["pnr"]
