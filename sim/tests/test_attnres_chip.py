"""The model chip with Attention Residuals (issue 15 item 2; hw/attnres/chip.py between the
datapath's stages, hw/chip/model.py) against the integer model's stack with AttnRes
(sim/models/int_model.py int_attn_res_stack_step), bit for bit.

configs/model-tiny-hybrid.toml: three KDA layers and an MLA layer, block AttnRes (one layer
a block), LatentMoE.  Every stage input (stage A's, stage B's, the final norm's) is a mix of
the depth unit; the stages' residual adds, requantisers with m_a = 0, go back to it.  The
same driver and bench as the other model chips (sim/driver.py ModelDriver,
sim/cocotb/tb_layer.py): stalls on the weight and cache ports and on both token streams,
stream-marked and CLEAR sequence starts, a reset with tokens inside, both slots, every
logit.  Verilator (one build for the file, about a minute; Icarus takes about 170 s a token).
"""
from __future__ import annotations

import pytest

from moekda.config import load_config
from sim.cocotb_util import simulator_available
from sim.driver import ModelDriver, RunPlan, sequence_positions
from sim.models.quantize import quantize_random_model

pytestmark = [pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed"),
              pytest.mark.verilator]


@pytest.fixture(scope="module")
def driver():
    cfg = load_config("model-tiny-hybrid")
    assert cfg.model.attn_res == "block" and cfg.hw.sequences == 2
    return ModelDriver(cfg, quantize_random_model(cfg, 0), label="seed0", model_seed=0)


def test_attnres_chip_short(driver):
    """14 tokens, two slots, stalls everywhere, a sequence restart by the stream (token 3),
    a CSR clear (token 6), a reset with two tokens inside (9, 10).  (Not the logits stream:
    the bench counts every token's, and a reset loses the abandoned ones'.)"""
    plan = RunPlan(tokens=14, first=(0, 3), clears=(6,), reset_at=9, abandon=2, seed=3)
    res = driver.run(plan, simulator="verilator", name="attnres_short")
    assert res.match, res.summary()
    assert res.tags.tolist() == sequence_positions(plan, driver.slots)[res.idx].tolist()


@pytest.mark.slow
def test_attnres_chip_256_tokens_verilator(driver):
    """(slow) The issue's run: 256 tokens with random stalls on every port, a sequence
    restart by the stream, one by CLEAR, and a reset mid-run."""
    plan = RunPlan(tokens=256, first=(0, 60), clears=(130,), reset_at=200, abandon=2, seed=5)
    res = driver.run(plan, simulator="verilator", name="attnres_long256")
    assert res.match, res.summary()
    print(res.summary())
