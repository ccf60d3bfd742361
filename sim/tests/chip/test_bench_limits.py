"""A design that stops answering fails its bench within the config's cycle limit, never hangs.

Each bench (KDA unit, MoE unit, layer chip) bounds its wait for outputs by
sim/cocotb_util.py ``cycle_limit`` (the config's roofline cycles per token times a
margin).  Here each design is made to hang for real - the KDA and MoE units' weight
memory never answers (MOEKDA_RESP_STALL=1), the layer chip is given a damaged image
as its good one, so its LOAD is refused and it takes no token - and the run must end
with the limit's message.  Without the limits the first two would wait forever: the
timeout marks are the backstop that turns that into a failure.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from moekda.config import load_config
from sim.cocotb_util import CYCLE_MARGIN, cycle_limit, roofline_cycles, sim_build_dir, sim_config, simulator_available

CONFIG = sim_config("tiny")      # MOEKDA_CONFIG under `make sim CONFIG=x`

pytestmark = [pytest.mark.skipif(not simulator_available("icarus"), reason="icarus not installed"),
              pytest.mark.timeout(600)]


def _failure_messages(results_xml) -> list[str]:
    return [f.get("message", "") for tc in ET.parse(results_xml).getroot().iter("testcase")
            for f in tc.findall("failure") + tc.findall("error")]


def test_limit_scales_with_the_roofline():
    """The limit is the roofline's: small's is larger than tiny's by their bounds' ratio."""
    tiny, small = (roofline_cycles(load_config(n)) for n in ("tiny", "small"))
    assert cycle_limit(small, 10) > cycle_limit(tiny, 10)
    assert cycle_limit(tiny, 10) - cycle_limit(tiny, 9) == int(CYCLE_MARGIN * tiny)


def test_kda_bench_ends_when_the_memory_never_answers(monkeypatch):
    from sim.tests.block.test_kda_unit import run_kda
    monkeypatch.setenv("MOEKDA_RESP_STALL", "1.0")
    with pytest.raises((AssertionError, SystemExit)):   # cocotb's runner exits on a failed test
        run_kda(CONFIG, "icarus", 1, seed=5)
    messages = _failure_messages(sim_build_dir("kda", CONFIG, "icarus") / "runs" / "s5_t1_1" / "results.xml")
    limit = cycle_limit(roofline_cycles(load_config(CONFIG)), 1)
    assert any(f"cycle limit: KDA unit: 0 of 1 outputs after {limit + 1} cycles" in m for m in messages), messages


def test_moe_bench_ends_when_the_memory_never_answers(monkeypatch, tmp_path):
    from sim.cocotb.tb_moe_case import build_case, make_config
    from sim.tests.block.test_moe import run_moe_bench
    monkeypatch.setenv("MOEKDA_RESP_STALL", "1.0")
    case = build_case(make_config(CONFIG), 1, seed=3)
    with pytest.raises(AssertionError, match=r"cycle limit: MoE unit: 0 of 1 outputs after \d+ cycles"):
        run_moe_bench(case, tmp_path, "icarus", stalls=0.0, reset_after=0)


@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_layer_bench_ends_when_the_chip_takes_no_token():
    """On Verilator (the build test_layer.py's damaged-image test uses): Icarus runs the idle
    chip at ~1000 cycles/s, 35 s for the limit."""
    from run.driver import LayerDriver, RunPlan
    from model.image import damaged_image

    class RefusedImage(LayerDriver):
        def image(self):
            return damaged_image(super().image(), "checksum")[0]

    drv = RefusedImage.from_seed(CONFIG, seed=0)
    res = drv.run(RunPlan(tokens=1, stall=False, seed=4), simulator="verilator", name="refused_image")
    assert not res.match
    assert any(p.startswith("LOAD of the good image") for p in res.problems), res.problems
    hit = [p for p in res.problems if p.startswith("cycle limit: layer chip: 0 of 1 outputs")]
    assert hit, res.problems
    # the run ended at the limit: the tokens' share of it is the roofline's, not more
    cfg = drv.cfg
    image_beats = len(drv.image()) // cfg.hw.weight_port_bytes
    assert res.sim_cycles <= cycle_limit(roofline_cycles(cfg), 1) + 2 * 4 * image_beats + 1000 + 100


def test_every_test_has_a_timeout(request):
    """pytest-timeout ends a test that hangs anyway (a bench without limits, a tool that never
    returns): a default for every test (pyproject.toml), conftest.py's longer one for slow tests."""
    import conftest
    assert request.config.pluginmanager.hasplugin("timeout")
    assert 0 < float(request.config.getini("timeout")) < conftest.SLOW_TIMEOUT

    class Item:
        def __init__(self, *marks):
            self.marks = {m.name: m for m in marks}

        def get_closest_marker(self, name):
            return self.marks.get(name)

        def add_marker(self, mark):
            self.marks[mark.name] = mark.mark

    slow, own, fast = Item(pytest.mark.slow.mark), Item(pytest.mark.slow.mark, pytest.mark.timeout(7).mark), Item()
    conftest.pytest_collection_modifyitems(request.config, [slow, own, fast])
    assert slow.get_closest_marker("timeout").args == (conftest.SLOW_TIMEOUT,)
    assert own.get_closest_marker("timeout").args == (7,)
    assert fast.get_closest_marker("timeout") is None
