"""The model chip with Gated MLA layers (hw/chip/model.py, hw/chip/datapath.py, hw/mla/unit.py)
against the integer model of the stack, bit for bit.

configs/model-tiny-kda-mla.toml: model-tiny's layers as kda, kda, kda, mla (kv_rank 8; no
Attention Residuals or LatentMoE, which the chip does not build yet): the three KDA layers
on the KDA unit, the MLA layer on the MLA unit, its latent cache in the sim top's cache
memory (sim/hdl/layer_sim.py, HdlCacheMemory: reads and chip-clock writes, random stalls
on both), the weights in the weight memory.  The same driver and bench as the KDA-only
model chip (run/driver.py ModelDriver, sim/cocotb/tb_layer.py): stalls everywhere, CSR
clears, stream-marked sequence starts, a reset with tokens inside, both sequence slots,
the logits stream, the MACS counter with the MLA's score beats at each token's position,
and the cache memory's error flags.  Verilator: one build (about a minute) for the file.

With LatentMoE (model.moe_latent = 8 on the same model: the three MoE layers' routed experts
at width 8, lat_down and lat_up at full width; hw/moe/unit.py) a second build runs a short
sequence the same way.
"""
from __future__ import annotations

import pytest

from moekda.config import load_config
from sim.cocotb_util import simulator_available
from run.driver import ModelDriver, RunPlan, sequence_positions
from model.quantize import quantize_random_model
from model.cases import hybrid_model_config

pytestmark = [pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed"),
              pytest.mark.verilator]


@pytest.fixture(scope="module")
def driver():
    cfg = load_config("model-tiny-kda-mla")
    assert cfg.model == hybrid_model_config("model-tiny").model and cfg.model.layers == ("kda", "kda", "kda", "mla") and cfg.hw.sequences == 2
    return ModelDriver(cfg, quantize_random_model(cfg, 0), label="seed0", model_seed=0)


@pytest.mark.slow     # its own Verilator build; fast twins: test_moe.py k3_latent, test_hybrid_chip_short
def test_latent_moe_chip_short():
    """model-tiny-kda-mla with LatentMoE (moe_latent 8): 6 tokens, two slots, stalls on both
    ports, a CSR clear, every logit compared; the dense first layer stays dense."""
    cfg = hybrid_model_config("model-tiny", moe_latent=8)
    assert cfg.model.mixers[0] == "dense" and "moe" in cfg.model.mixers
    drv = ModelDriver(cfg, quantize_random_model(cfg, 0), label="seed0", model_seed=0)
    plan = RunPlan(tokens=6, first=(0,), clears=(3,), seed=3)
    res = drv.run(plan, simulator="verilator", name="latent_short", logits=True)
    assert res.match, res.summary()
    assert res.counters["TOKENS"] == 6


def test_hybrid_chip_short(driver):
    """6 tokens, two slots, stalls on the weight and cache ports, a CSR clear before token
    3 (the MLA layer's cache starts again at row 0), every logit compared."""
    plan = RunPlan(tokens=6, first=(0,), clears=(3,), seed=3)
    res = driver.run(plan, simulator="verilator", name="hybrid_short", logits=True)
    assert res.match, res.summary()
    assert res.counters["TOKENS"] == 6
    assert res.tags.tolist() == sequence_positions(plan, driver.slots)[res.idx].tolist()


@pytest.mark.slow     # 80 tokens; fast twin: test_chip_counters.py (MACS counts every beat)
def test_hybrid_chip_counts_every_score_beat(driver):
    """Without stalls the MLA's score beats (cache port) and the MoE's weight beats (weight
    port) come at up to two a cycle for hundreds of cycles; MACS must count them all (with a
    counter of one beat a cycle it lost 86,528 of 4,109,432 over 257 tokens).  80 tokens,
    the two slots' sequences side by side, reach position 39: 78 score beats a token while
    the other slot's token streams its experts."""
    plan = RunPlan(tokens=80, stall=False, seed=2)
    res = driver.run(plan, simulator="verilator", name="hybrid_macs")
    assert res.match, res.summary()


@pytest.mark.slow
def test_hybrid_chip_256_tokens_verilator(driver):
    """(slow) The issue's run: 256 tokens with random stalls on every port, a sequence
    restart by the stream, one by CLEAR, and a reset mid-run; the MLA layer's caches grow
    to about 60 rows per slot between restarts."""
    plan = RunPlan(tokens=256, first=(0, 60), clears=(130,), reset_at=200, abandon=2, seed=5)
    res = driver.run(plan, simulator="verilator", name="hybrid_long256")
    assert res.match, res.summary()
    print(res.summary())
