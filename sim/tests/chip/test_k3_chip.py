"""configs/model-tiny-k3.toml on the model chip (issue 47): the hybrid of model-tiny-hybrid
with K3's options the chip builds (SiTU-GLU, the LatentMoE exit norm in the MoE unit, routed
scale 1.0, norm eps 1e-5, K3's global-layer placement, AttnRes blocks of 24 sub-layers: one
block on 4 layers, untied head), bit for bit against the integer model (int_model_step),
Verilator, with stalls on every port and the three restarts of test_attnres_chip's short
plan.  The exit norm is checked by this run because the integer model has it (a chip without
it gives other logits: sim/tests/block/test_moe.py cases exit_norm, k3_latent)."""
from __future__ import annotations

import pytest

from moekda.config import load_config
from sim.cocotb_util import simulator_available
from run.driver import ModelDriver, RunPlan
from model.quantize import quantize_random_model
from sim.tests.chip.test_attnres_chip import SHORT, check

pytestmark = [pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed"),
              pytest.mark.verilator]


@pytest.fixture(scope="module")
def k3_driver():
    cfg = load_config("model-tiny-k3")
    assert cfg.model.latent_exit_norm and cfg.model.glu == "situ" and cfg.model.attn_res_block == 24
    return ModelDriver(cfg, quantize_random_model(cfg, 0), label="seed0", model_seed=0)


@pytest.mark.slow
def test_model_tiny_k3_chip_short(k3_driver):
    """(slow: a Verilator build of its own, ~4 min) 14 tokens, both slots, stalls everywhere,
    a restart by the stream, one by CLEAR, a reset with two tokens inside."""
    check(k3_driver, SHORT, "k3_short")


@pytest.mark.slow
def test_model_tiny_k3_chip_64_tokens(k3_driver):
    """(slow) 64 tokens with the same kinds of restarts and stalls."""
    check(k3_driver, RunPlan(tokens=64, first=(0, 20), clears=(40,), reset_at=50, abandon=2, seed=7), "k3_64")
