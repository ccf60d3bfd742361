"""The SDC follows the config: period from hw.clock_period_ns, IO delays 20 %."""
from __future__ import annotations

import re

import pytest

from flow.sdc import Constraints, write_sdc
from moekda.config import load_config
from pdk.kit import PLATFORM


def _numbers(sdc: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"^set (clk_period|io_delay) ([\d.]+)$", sdc, re.M)}


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_sdc_values_follow_the_config(name, tmp_path):
    cfg = load_config(name)
    cons = write_sdc(cfg, tmp_path / "x.sdc")
    vals = _numbers((tmp_path / "x.sdc").read_text())
    assert vals["clk_period"] == pytest.approx(cfg.hw.clock_period_ns)
    assert vals["io_delay"] == pytest.approx(cfg.hw.clock_period_ns * PLATFORM.io_delay_fraction)
    assert cons.period_ns == cfg.hw.clock_period_ns


def test_sdc_tracks_an_edited_period(tmp_path):
    base = (load_config("tiny").source)
    text = open(base).read()
    edited = re.sub(r"clock_period_ns = [\d.]+", "clock_period_ns = 2.5", text)
    cfg_file = tmp_path / "slow.toml"
    cfg_file.write_text(edited)
    sdc = Constraints.from_config(load_config(str(cfg_file))).sdc_text()
    assert _numbers(sdc) == {"clk_period": 2.5, "io_delay": pytest.approx(0.5)}


def test_clock_port_is_named_and_excluded_from_input_delays():
    sdc = Constraints(period_ns=1.0, io_delay_ns=0.2, clock_port="clk_core").sdc_text()
    assert "create_clock -name clk -period $clk_period [get_ports {clk_core}]" in sdc
    assert "delete_from_list [all_inputs] [get_ports {clk_core}]" in sdc
