"""End-to-end tests of the model chip (hw/chip/model.py) against the integer model of the stack.

The same driver, sim top and bench as the layer chip (run/driver.py ModelDriver,
sim/hdl/layer_sim.py, sim/cocotb/tb_layer.py): token ids in, the next id and its logit
out, bit-exact with model.int_model (every layer, the head, the argmax), every
input exactly one output in order, random stalls on the token streams and the weight
port, CSR clears, stream-marked sequence starts, a reset with tokens inside, and the
logits stream (CTRL.LOGITS) against the model's logits.

MOEKDA_CONFIG chooses a model config (`make sim CONFIG=model-small`); default model-tiny.
With ``hw.sequences = 2`` (both model configs) the plans' tokens alternate between the two
sequence slots (token t in slot t mod 2), each slot's outputs are placed by the chip's slot
and tag, and one run takes the same config with one sequence, the other scheduler path.
Verilator throughout: a model-tiny token is about 13 000 cycles (four layers, four parameter
FETCHes, the head), which Icarus simulates at a few hundred cycles per second; one Verilator
build (about a minute) serves every run.  Default suite: a few tokens; the 256-token run is
marked slow.
"""
from __future__ import annotations

import numpy as np
import pytest

from dataclasses import replace

from moekda.config import load_config
from sim.cocotb_util import sim_config, simulator_available
from run.driver import ModelDriver, RunPlan, sequence_positions

CONFIG = sim_config("model-tiny")
pytestmark = [pytest.mark.skipif(load_config(CONFIG).model.is_layer_chip,
                                 reason=f"{CONFIG} is a layer chip (test_layer.py)"),
              pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed"),
              pytest.mark.verilator]


@pytest.fixture(scope="module")
def driver():
    return ModelDriver.from_seed(CONFIG, seed=0)


def _check(res):
    assert res.match, res.summary()


def test_model_chip_short(driver):
    """Quick: 5 tokens through all layers and the head, stalls everywhere, a CSR clear
    before token 2, every logit read off the logits stream and compared."""
    plan = RunPlan(tokens=5, first=(0,), clears=(2,), seed=3)
    res = driver.run(plan, simulator="verilator", name="short", logits=True)
    _check(res)
    assert res.counters["TOKENS"] == 5
    # the CLEAR restarts every slot's sequence: one slot [0, 1, 0, 1, 2], two [0, 0, 0, 0, 1]
    want_tags = sequence_positions(plan, driver.slots)
    assert res.tags is not None and res.tags.tolist() == want_tags[res.idx].tolist()
    assert sorted(res.idx.tolist()) == list(range(5))


@pytest.mark.slow
def test_model_chip_one_sequence(driver):
    """The config with hw.sequences = 1 (when it has more): the scheduler with one slot, the
    layer-by-layer order of a single sequence; stalls, a CLEAR and the logits as above.
    Slow (its own Verilator build, about a minute): make test was at 19.9 of its 20 minutes."""
    if driver.slots == 1:
        pytest.skip(f"{CONFIG} runs one sequence: the other tests are this one")
    cfg = replace(driver.cfg, name=f"{driver.cfg.name}-1seq", hw=replace(driver.cfg.hw, sequences=1))
    one = ModelDriver(cfg, driver.q, label=driver.label, model_seed=driver.model_seed)
    res = one.run(RunPlan(tokens=4, first=(0,), clears=(2,), seed=6), simulator="verilator",
                  name="one_sequence", logits=True)
    _check(res)
    assert res.tags.tolist() == [0, 1, 0, 1]


def test_model_chip_reset_and_generation(driver):
    """A reset with a token inside: the chip takes nothing until LOADed again, and the next
    token starts a new sequence in every layer by itself.  Then greedy generation on the
    chip (each output fed back as the next input) against the integer model's."""
    res = driver.run(RunPlan(tokens=5, first=(0,), reset_at=2, abandon=1, seed=4), simulator="verilator",
                     name="reset")
    _check(res)
    assert res.counters["TOKENS"] == 2
    res, got, want = driver.generate([3, 1, 4], 4, simulator="verilator", stall=True)
    _check(res)
    assert got == want and len(got) == 4
    if driver.slots > 1:
        # two prompts side by side, one per slot, each fed its own outputs
        res, got, want = driver.generate_many([[3, 1, 4], [5, 9, 2]], 3, simulator="verilator", stall=True)
        _check(res)
        assert got == want and all(len(g) == 3 for g in got)


@pytest.mark.slow
def test_model_chip_256_tokens_verilator(driver):
    """The issue's run: 256 tokens with random stalls on every port, a sequence restart by
    the stream, one by CLEAR, and a reset mid-run."""
    plan = RunPlan(tokens=256, first=(0, 60), clears=(130,), reset_at=200, abandon=2, seed=5)
    res = driver.run(plan, simulator="verilator", name="long256")
    _check(res)
    print(res.summary())


def test_model_chip_next_token_is_the_argmax(driver):
    """The driver's expectation itself: the next id is the lowest index of the largest logit."""
    ids = driver.inputs(6, seed=9)
    resets = np.zeros(6, bool)
    resets[0] = True
    logits = driver.logits(ids, resets)
    want = driver.model(ids, resets)
    for t in range(6):
        best = logits[t].max()
        assert want[t, 0] == int(np.flatnonzero(logits[t] == best)[0]) and want[t, 1] == best
