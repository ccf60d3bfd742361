"""End-to-end tests of the layer chip (hw/chip/layer.py) against the integer layer model.

Every run goes through run/driver.py (RTL from the quantised model inside
sim/hdl/layer_sim.py with the weight memory in the HDL, cocotb bench
sim/cocotb/tb_layer.py, comparison with model.int_layer): bit-exact
outputs, every input token exactly one output in order, random stalls on both
token streams and on the weight port, CSR clears, a reset with tokens inside.

The config comes from MOEKDA_CONFIG (default tiny; sim/cocotb_util.py sim_config), so
`make sim CONFIG=small` runs the same tests on small.  Default suite: a short Icarus run; the
>= 256-token runs use Verilator (one build per config, shared).
"""
from __future__ import annotations

import numpy as np
import pytest

from sim.cocotb_util import sim_config, simulator_available
from run.coverage import holes, layer_coverage, record
from run.driver import LayerDriver, RunPlan, compare

CONFIG = sim_config("tiny")
needs_verilator = pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")


@pytest.fixture(scope="module")
def driver():
    return LayerDriver.from_seed(CONFIG, seed=0)


def _check(res):
    assert res.match, res.summary()


# On Verilator in the default suite (the build the damaged-image and bench-limit tests share);
# on Icarus, 7 minutes of a loaded machine, in the slow one
@pytest.mark.parametrize("simulator", [pytest.param("verilator", marks=[needs_verilator, pytest.mark.verilator]),
                                       pytest.param("icarus", marks=pytest.mark.slow)])
def test_layer_short(driver, simulator):
    """Quick: 8 tokens with stalls everywhere, a CSR clear before token 2, a reset with
    token 4 inside (the chip resumes at token 5 with a fresh state by itself)."""
    res = driver.run(RunPlan(tokens=8, first=(0,), clears=(2,), reset_at=4, abandon=1, seed=3),
                     simulator=simulator, name=f"short_{simulator}")
    _check(res)
    # the counters count the part after the reset: tokens 5..7
    assert res.counters["TOKENS"] == 3
    # the chip's tags (token_out_layout seq): positions in the sequences 0 | 1 | 2 3 4 | 5 6 7,
    # token 4 possibly lost to the reset; the driver placed the outputs by them
    assert res.tags is not None and res.tags[:4].tolist() == [0, 1, 0, 1] and res.tags[-3:].tolist() == [0, 1, 2]
    assert res.idx[:4].tolist() == [0, 1, 2, 3] and res.idx[-3:].tolist() == [5, 6, 7]


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_layer_256_tokens_verilator(driver):
    """>= 256 tokens with stalls on both streams and the weight port, a CSR clear, a
    stream-marked sequence start and a reset in the middle."""
    plan = RunPlan(tokens=256, first=(0, 40), clears=(85,), reset_at=170, abandon=2, seed=5)
    res = driver.run(plan, simulator="verilator", name="long256")
    _check(res)
    # functional coverage (run/coverage.py) into build/<cfg>/reports/coverage.md; what this
    # test claims to exercise must be there: each kind of restart, every expert
    cov = layer_coverage(driver, plan, res)
    print(record(CONFIG, "test_layer_256_tokens_verilator", cov, note="256 tokens, seed 0, stalls"))
    assert not holes(cov, ("restart_first", "restart_clear", "restart_reset", "every_expert", "tokens"))


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_layer_cycles_per_token_without_stalls(driver):
    """No stalls: once the two-stage pipeline is full every token costs the same (constant
    work per token, no KV cache); the interval is the cycles per token docs/chip.md reports."""
    res = driver.run(RunPlan(tokens=32, stall=False, seed=7), simulator="verilator", name="nostall32")
    _check(res)
    # the last token runs alone (no next token's KDA competing for the port): leave it out
    gaps = np.diff(res.out_cycles[4:-1])
    assert len(set(gaps.tolist())) == 1, f"output gaps vary without stalls: {gaps.tolist()}"
    print(f"{CONFIG}: one token every {gaps[0]} cycles, latency TOKEN_CYCLES {res.counters['TOKEN_CYCLES']}")


@needs_verilator
@pytest.mark.verilator
def test_damaged_images_are_refused_then_a_good_load_runs(driver):
    """Every kind of damaged image is LOADed and refused with its error bits, the chip taking
    no token meanwhile (nor before the first LOAD); then the good image loads and runs."""
    from model.image import DAMAGE_KINDS
    res = driver.run(RunPlan(tokens=3, bad_images=DAMAGE_KINDS, seed=11), simulator="verilator", name="badimg")
    _check(res)
    beats = len(driver.image()) // driver.cfg.hw.weight_port_bytes
    assert beats <= res.load_cycles[0] <= 2 * beats + 100      # stalls on the port: up to ~1.5x


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_one_build_runs_three_models():
    """The chip's Verilog is model-independent: three models run on the one simulator build,
    256 tokens each with stalls on every port, bit-exact against their integer models."""
    drivers = [LayerDriver.from_seed(CONFIG, seed=s) for s in (21, 22, 23)]
    texts = {d.verilog() for d in drivers}
    assert len(texts) == 1
    dirs = set()
    for d in drivers:
        plan = RunPlan(tokens=256, first=(0, 100), clears=(170,), seed=int(d.label[len("seed"):]))
        res = d.run(plan, simulator="verilator", name=f"three_{d.label}")
        _check(res)
        cov = layer_coverage(d, plan, res)
        record(CONFIG, f"test_one_build_runs_three_models[{d.label}]", cov, note="256 tokens, stalls")
        assert not holes(cov, ("restart_first", "restart_clear", "every_expert", "tokens"))
        dirs.add(d.build("verilator"))
    assert len(dirs) == 1


def test_macs_per_token_from_the_model_shapes(driver):
    """The MACS counter's per-token constant, counted independently from the quantised
    weight matrices' shapes."""
    from hw.chip.layer import macs_per_token
    from hw.image.param_map import KDA_LINEARS
    q, m = driver.q, driver.cfg.model
    kda = sum(getattr(q.kda, f).w.size for f in KDA_LINEARS)
    expert = q.moe.routed.gate_w[0].size + q.moe.routed.up_w[0].size + q.moe.routed.down_w[0].size
    assert macs_per_token(driver.cfg) == kda + q.moe.router.w.size + (m.n_shared + m.top_k) * expert


def test_compare_finds_every_kind_of_error():
    """The driver's comparison is what makes a run fail: lost, duplicated, reordered
    and wrong tokens are all reported (and a correct run is not)."""
    want = np.arange(12).reshape(6, 2)
    plan = RunPlan(tokens=6, reset_at=2, abandon=1)
    ok_idx = np.array([0, 1, 3, 4, 5])
    assert compare(plan, want, ok_idx, want[ok_idx]) == []
    assert compare(plan, want, np.array([0, 1, 2, 3, 4, 5]), want) == []     # the abandoned one may come out
    lost = np.array([0, 1, 3, 5])
    assert any("without an output" in p for p in compare(plan, want, lost, want[lost]))
    dup = np.array([0, 1, 1, 3, 4, 5])
    assert any("out of order or duplicated" in p for p in compare(plan, want, dup, want[dup]))
    swapped = np.array([0, 1, 4, 3, 5])
    assert any("out of order" in p for p in compare(plan, want, swapped, want[swapped]))
    wrong = want[ok_idx].copy()
    wrong[2, 1] += 1
    assert any(p.startswith("token 3:") for p in compare(plan, want, ok_idx, wrong))
