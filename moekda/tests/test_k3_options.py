"""Kimi K3's configuration knobs (issue 47, difference 6) and the K3 configs: the global-layer
placement ``model.layers = "k3"``, AttnRes blocks of K3's 24 sub-layers, norm eps 1e-5, and
the LatentMoE exit norm's field (difference 4)."""
import pytest

from hw.attnres.kept import kept_vectors
from moekda.config import ConfigError, config_from_dict, k3_layers, load_config


def test_k3_placement_is_the_released_models():
    """K3: 93 layers, global layers 3, 7, ..., 91 and 92 (24 of them)."""
    kinds = k3_layers(93)
    assert [i for i, k in enumerate(kinds) if k == "mla"] == list(range(3, 92, 4)) + [92]
    assert kinds.count("mla") == 24 and k3_layers(4) == ("kda", "kda", "kda", "mla")
    assert k3_layers(8) == ("kda", "kda", "kda", "mla") * 2


def _cfg(**model):
    d = load_config("model-tiny-hybrid").to_dict()
    d["name"] = "t"
    d["model"].update(model)
    return config_from_dict(d)


def test_layers_k3_expands_and_round_trips():
    cfg = _cfg(layers="k3")
    assert cfg.model.layers == ("kda", "kda", "kda", "mla")
    assert cfg.to_dict()["model"]["layers"] == ["kda", "kda", "kda", "mla"]
    assert cfg == _cfg(layers=["kda", "kda", "kda", "mla"])
    with pytest.raises(ConfigError, match=r"^model\.layers = 'k4': must be \"k3\" or a non-empty list"):
        _cfg(layers="k4")


def test_model_tiny_k3_has_every_k3_option_the_chip_builds():
    m = load_config("model-tiny-k3").model
    assert m.layers == k3_layers(4) and m.mixers[0] == "dense" and m.moe_latent and m.latent_exit_norm
    assert m.glu == "situ" and m.attn_res == "block" and m.attn_res_block == 24
    assert m.norm_eps == 1e-5 and m.routed_scaling == 1.0 and not m.tie_embedding


def test_a_k3_block_on_four_layers_is_one_block():
    """AttnRes blocks of 24 sub-layers on a 4-layer chip (8 sub-layers): v_0 and one running
    partial, 2 kept values a slot (block 2, one layer a block: 5)."""
    assert kept_vectors("block", 8, 24) == 2 and kept_vectors("block", 8, 2) == 5
    assert kept_vectors("block", 2 * 93, 24) == 1 + 8          # K3: 186 sub-layers, 8 blocks


def test_exit_norm_defaults_leave_configs_unchanged():
    for name in ("tiny", "model-tiny-sram", "model-tiny-hybrid"):
        assert "latent_exit_norm" not in load_config(name).to_dict()["model"]
