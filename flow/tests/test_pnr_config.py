"""The [pnr] config section: optional, defaults, ranges, one-line errors."""
from __future__ import annotations

import pytest

import cli
from moekda.config import ConfigError, PnrConfig, config_from_dict, describe_fields, load_config


def _cfg(**pnr):
    return config_from_dict({"name": "t", "pnr": pnr})


def test_configs_without_pnr_get_the_defaults():
    for name in ("tiny", "small"):
        assert load_config(name).pnr == PnrConfig()
    assert PnrConfig().core_utilization == 0.5 and PnrConfig().aspect_ratio == 1.0


def test_values_are_taken_and_change_the_hash():
    cfg = _cfg(core_utilization=0.35, aspect_ratio=0.5, place_density=0.5)
    assert (cfg.pnr.core_utilization, cfg.pnr.aspect_ratio, cfg.pnr.place_density) == (0.35, 0.5, 0.5)
    assert cfg.hash() != _cfg().hash()


@pytest.mark.parametrize("field, value, message", [
    ("core_utilization", 0.95, "pnr.core_utilization = 0.95: allowed range is 0.1 to 0.9"),
    ("aspect_ratio", 0.1, "pnr.aspect_ratio = 0.1: allowed range is 0.25 to 4.0"),
    ("core_margin_um", -1, "pnr.core_margin_um = -1.0: allowed range is 0.0 to 100.0"),
    ("tapcell_distance_um", "far", "pnr.tapcell_distance_um = 'far': must be a number"),
    ("place_desnity", 0.5, "pnr.place_desnity: unknown field"),
])
def test_bad_values_are_one_line_errors(field, value, message):
    with pytest.raises(ConfigError) as e:
        _cfg(**{field: value})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_density_must_leave_room_above_the_utilisation():
    _cfg(core_utilization=0.5, place_density=0.55)
    with pytest.raises(ConfigError, match=r"pnr.place_density = 0.5: allowed range is pnr.core_utilization \+ 0.05"):
        _cfg(core_utilization=0.5, place_density=0.5)


def test_fields_are_described(capsys):
    assert "pnr.core_utilization" in describe_fields()
    assert cli.main(["config", "--fields"]) == 0
    assert "pnr.place_density" in capsys.readouterr().out
