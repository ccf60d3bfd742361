"""The model chip with Attention Residuals (issue 15 item 2; hw/attnres/chip.py between the
datapath's stages, hw/chip/model.py) against the integer model's stack with AttnRes
(model/int_model.py int_attn_res_stack_step), bit for bit.

configs/model-tiny-hybrid.toml and configs/model-small-hybrid.toml: three KDA layers and an
MLA layer, block AttnRes (one layer a block), LatentMoE; model-tiny-hybrid's full-AttnRes
twin (every sub-layer's output kept).  Every stage input (stage A's, stage B's, the final
norm's) is a mix of the depth unit; the stages' residual adds, requantisers with m_a = 0,
go back to it.  The same driver and bench as the other model chips (run/driver.py
ModelDriver, sim/cocotb/tb_layer.py): stalls on the weight and cache ports and on both token
streams, stream-marked and CLEAR sequence starts, a reset with tokens inside, every slot,
every logit, the MACS counter (the depth unit's engine beats included).  Verilator: one
build per config, about 3 min for tiny and 10 min for small on the loaded machine (Icarus
takes about 170 s a tiny token), so only tiny's short run is in the default suite.
"""
from __future__ import annotations

import pytest

from moekda.config import load_config
from sim.cocotb_util import simulator_available
from run.driver import ModelDriver, RunPlan, sequence_positions
from model.quantize import quantize_random_model
from sim.tests.block.test_attnres import full_config

pytestmark = [pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed"),
              pytest.mark.verilator]

# the short run: 14 tokens, a sequence restart by the stream (token 3), a CSR clear (token 6),
# a reset with two tokens inside (9, 10).  (Not the logits stream: the bench counts every
# token's, and a reset loses the abandoned ones'.)
SHORT = RunPlan(tokens=14, first=(0, 3), clears=(6,), reset_at=9, abandon=2, seed=3)
# the run: 256 tokens, restarts by the stream (60) and by CLEAR (130), a reset at 200
LONG = RunPlan(tokens=256, first=(0, 60), clears=(130,), reset_at=200, abandon=2, seed=5)


@pytest.fixture(scope="module")
def drivers():
    """The seed-0 model's driver of a config, made once for the module (its build with it)."""
    made = {}

    def get(config: str) -> ModelDriver:
        if config not in made:
            cfg = load_config(config)
            assert cfg.model.attn_res != "none" and cfg.hw.sequences > 1
            made[config] = ModelDriver(cfg, quantize_random_model(cfg, 0), label="seed0", model_seed=0)
        return made[config]
    return get


def check(drv: ModelDriver, plan: RunPlan, name: str):
    res = drv.run(plan, simulator="verilator", name=name)
    assert res.match, res.summary()
    assert res.tags.tolist() == sequence_positions(plan, drv.slots)[res.idx].tolist()
    print(f"\n{drv.cfg.name}: {res.summary()}")
    return res


def test_attnres_chip_short(drivers):
    """model-tiny-hybrid, 14 tokens, both slots, stalls everywhere, the three restarts."""
    check(drivers("model-tiny-hybrid"), SHORT, "attnres_short")


@pytest.mark.slow
def test_attnres_chip_full_short(drivers):
    """(slow: a build of its own) full AttnRes on the chip: model-tiny-hybrid's twin keeps
    all N + 1 values (9 a slot); the short run's plan."""
    check(drivers(full_config("model-tiny-hybrid")), SHORT, "attnres_full_short")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["model-tiny-hybrid", "model-small-hybrid"])
def test_attnres_chip_256_tokens_verilator(drivers, config):
    """(slow) The issue's run: 256 tokens with random stalls on every port, a sequence
    restart by the stream, one by CLEAR, and a reset mid-run (254 checked, 2 abandoned)."""
    check(drivers(config), LONG, "attnres_long256")
