"""The whole KDA unit (hw/kda/unit.py) in cocotb against the integer model, bit for bit.

The unit's RTL is a function of the config alone (issue 13): it is built once
per (config, simulator) from the Verilog of hw/tops.py's ``kda`` (written by
sim/cocotb_util.py, the text `moekda rtl --top kda` writes), and the model -
its parameter bits on ``params`` and its weight image - only drives the
bench.  So one build runs every seed's model.

Icarus for the short default runs, Verilator for the long ones (>= 512
tokens, two configs, a clear in the middle, stalls and back-pressure) and
the constant-cost check: cycles per token at token 4096 equal those at 16.

A model config (configs/model-tiny.toml, model-tiny-sram.toml) runs its L layers on the
one unit: tokens of the layers interleaved in any order, each layer's parameters and
weights, each layer's state carried apart from the others' (sim/cocotb/tb_kda.py
``model_kda_case``).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moekda.config import REPO_ROOT, load_config
from sim.cocotb_util import sim_build_dir, sim_config, sim_configs, simulator_available, write_top_verilog


def build_kda(config: str, simulator: str) -> Path:
    """The config's unit built once for ``simulator`` (the Verilog of hw/tops.py's ``kda``,
    written by sim/cocotb_util.py; the build is redone only when that text changes).
    Icarus in its default -g2012 mode applies declaration initialisers without an event,
    so the generated always @* blocks would never run: -g2005 semantics."""
    from cocotb_tools.runner import get_runner
    build = sim_build_dir("kda", config, simulator)
    build.mkdir(parents=True, exist_ok=True)
    build_args = ["-Wno-fatal", "-O2"] if simulator == "verilator" else ["-g2005"]
    # a lock keeps parallel pytest workers from building in the same directory at once
    with open(build / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = write_top_verilog("kda", config, build / "kda.v")
        key = hashlib.sha256((text + " ".join(build_args)).encode()).hexdigest()
        stamp = build / ".built"
        if not (stamp.exists() and stamp.read_text() == key):
            get_runner(simulator).build(sources=[build / "kda.v"], hdl_toplevel="kda", build_dir=build,
                                        build_args=build_args, always=True, timescale=("1ns", "1ps"))
            stamp.write_text(key)
    return build


def sequence_firsts(layers, starts) -> list[int]:
    """The tokens that carry ``first`` when a sequence starts at each token of ``starts``:
    from there on, the first token of every layer (a new sequence reaches each layer in turn)."""
    out, pending = [], set()
    for t, l in enumerate(layers):
        if t in starts:
            pending = set(range(max(layers) + 1))
        if l in pending:
            pending.discard(l)
            out.append(t)
    return out


def run_kda(config: str, simulator: str, tokens: int, first=(0,), stall=True, seed=0) -> list[int]:
    """Simulate the config's unit on the seeded model's ``tokens`` tokens; returns token_cycles per token.
    On a model config (`make sim CONFIG=model-tiny`) the tokens go to the layers in turn,
    and a sequence starting at a token of ``first`` reaches every layer."""
    from hw.image.memory_map import layer_count
    from sim.cocotb.tb_kda import kda_case, model_kda_case
    cfg = load_config(config)
    if cfg.model.is_layer_chip:
        case = kda_case(config, seed, tokens, first)
    else:
        layers = [t % layer_count(cfg) for t in range(tokens)]
        case = model_kda_case(config, seed, layers, sequence_firsts(layers, set(first) | {0}))
    return run_case(case, config, simulator, f"s{seed}_t{tokens}_{int(stall)}", stall, seed)


def run_model_kda(config: str, simulator: str, layers, first, reset_in=-1, stall=True, seed=0,
                  slots=None) -> list[int]:
    """The unit of a model config on tokens of the layers ``layers`` (and sequence slots
    ``slots``: sim/cocotb/tb_kda.py model_kda_case); returns token_cycles per token (the reset
    token's left out)."""
    from sim.cocotb.tb_kda import model_kda_case
    case = model_kda_case(config, seed, layers, first, reset_in, slots)
    name = hashlib.sha256(repr((list(layers), sorted(first), reset_in,
                                None if slots is None else list(slots))).encode()).hexdigest()[:8]
    return run_case(case, config, simulator, f"model_s{seed}_{name}_{int(stall)}", stall, seed)


def run_case(case, config: str, simulator: str, run_name: str, stall=True, seed=0) -> list[int]:
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    from sim.cocotb.tb_kda import save_case
    build = build_kda(config, simulator)
    run_dir = build / "runs" / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    case_file, cycles_out = run_dir / "case.npz", run_dir / "cycles.txt"
    save_case(case, case_file)
    results = get_runner(simulator).test(
        # the bench is imported as a module of the installed repository
        test_module="sim.cocotb.tb_kda", hdl_toplevel="kda", hdl_toplevel_lang="verilog",
        test_dir=run_dir, build_dir=build, timescale=("1ns", "1ps"),
        results_xml=str(run_dir / "results.xml"),
        extra_env={"KDA_CASE": str(case_file), "KDA_SEED": str(seed), "KDA_STALL": "1" if stall else "0",
                   "KDA_CYCLES_OUT": str(cycles_out),
                   "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])})
    n, failed = get_results(Path(results))
    assert n >= 1 and failed == 0, f"{failed} of {n} cocotb tests failed; see {run_dir}"
    return [int(v) for v in cycles_out.read_text().split()]


needs_verilator = pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")


def test_kda_tiny_icarus_short_with_clear():
    """Quick: 12 tokens, a new sequence at token 5, all stalls on (MOEKDA_CONFIG's config under
    `make sim CONFIG=x`, as every run here of tiny or small; tiny-flops is its own variant)."""
    run_kda(sim_config("tiny"), "icarus", 12, first=(0, 5))


@pytest.mark.slow     # fast twin: test_kda_verilog_is_model_free, test_kda_model_tiny_layers_icarus
def test_kda_one_netlist_runs_two_models():
    """The same build (no rebuild: the Verilog does not depend on the model) runs a
    second seed's model bit-exact, its parameters on ``params`` only."""
    run_kda(sim_config("tiny"), "icarus", 4, first=(0, 2), seed=2)
    run_kda(sim_config("tiny"), "icarus", 4, seed=3)


@pytest.mark.slow     # fast twin: test_kda_delta.py's flops cases
def test_kda_tiny_flops_icarus_short_with_clear():
    """The state in flip-flops (configs/tiny-flops.toml: hw.state_memory = "flops"; tiny has it
    in SRAM macros, whose RTL instantiates the fakeram45 cells and carries their behavioural
    model): the same outputs, 12 tokens with every stall on and a new sequence at token 5."""
    run_kda("tiny-flops", "icarus", 12, first=(0, 5))


# model-tiny's tokens: a sequence through the four layers in order (each layer's first token
# starts its sequence), layer 2 alone starting again (token 8) among irregular 2, 0, 2, 1 -
# layer 3 then continues from its token 7 state - a new sequence through all layers from
# token 13, and a reset inside token 17 (layer 1): token 18 (layer 2, no ``first``) must
# find its state zero, as every layer's
MODEL_LAYERS = [0, 1, 2, 3, 0, 1, 2, 3, 2, 0, 2, 1, 3, 0, 1, 2, 3, 1, 2]
MODEL_FIRST = [0, 1, 2, 3, 8, 13, 14, 15, 16]


def test_kda_model_tiny_layers_icarus():
    """model-tiny's four layers on the one unit, bit-exact with every stall on: each token
    its layer's weights (its own addresses) and parameters, each layer's state and
    short-conv history carried across the others' tokens, per-layer restarts, a reset
    mid-token; the layer port changes as soon as a token is taken."""
    run_model_kda("model-tiny", "icarus", MODEL_LAYERS, MODEL_FIRST, reset_in=17)


@pytest.mark.slow     # fast twin: test_model_chip_reset_and_generation (two sequences)
def test_kda_model_tiny_slots_icarus():
    """Two sequence slots (model-tiny's hw.sequences = 2): each (slot, layer) its own state
    and history, the same layer of the two slots back to back as the model chip runs them,
    a restart of one slot's layer 1 (token 6) that must leave the other slot's layer 1
    alone (token 7 continues it), and the slot port noise between acceptances."""
    layers = [0, 0, 1, 1, 0, 2, 1, 1, 2, 3, 3, 2]
    slots = [0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1, 1]
    run_model_kda("model-tiny", "icarus", layers, [0, 1, 2, 3, 5, 6, 9, 10], slots=slots)


@pytest.mark.slow     # fast twin: tiny's SRAM state + test_kda_model_tiny_layers_icarus
def test_kda_model_tiny_sram_layers_icarus():
    """The same with the four layers' states in SRAM macros (configs/model-tiny-sram.toml:
    2 x 2 fakeram45_64x32 a bank, the layer in the macro row and address): a shorter
    irregular order with a restart of one layer."""
    run_model_kda("model-tiny-sram", "icarus", [0, 1, 2, 3, 2, 0, 2, 1, 3], [0, 1, 2, 3, 6])


@pytest.mark.slow     # fast twin: test_kda_tiny_icarus_short_with_clear (same RTL, other widths)
def test_kda_small_icarus_short():
    """The second config, quick: 3 tokens with stalls, a new sequence at the third."""
    run_kda(sim_config("small"), "icarus", 3, first=(0, 2))


def test_kda_verilog_is_model_free(tmp_path):
    """`moekda rtl -c tiny --top kda` writes the text hw/tops.py generates (the bench's
    Verilog), byte for byte, with ``params`` as an input port; no model value is in it:
    three quantised models' requantisation multipliers, f_up biases and table entries
    are absent as Verilog literals."""
    from hw.tops import top_verilog
    from hw.image.param_map import KDA_LINEARS, param_layout
    from sim.cocotb.tb_kda import quantised
    config = sim_config("tiny")
    cfg = load_config(config)
    text = top_verilog("kda", cfg)
    out = tmp_path / "kda.v"
    subprocess.run([sys.executable, "-m", "cli", "rtl", "-c", config, "--top", "kda", "-o", str(out)],
                   check=True, cwd=REPO_ROOT, capture_output=True)
    assert out.read_text() == text, "moekda rtl's kda.v differs from hw/tops.py's"
    assert f"input [{param_layout(cfg, 'kda').size - 1}:0] params;" in text
    for seed in (0, 1, 2):
        kda = quantised(config, seed)[1].kda
        for lin in KDA_LINEARS:
            mm = int(getattr(kda, lin).m)
            assert f"16'h{mm:04x}" not in text and f"16'd{mm};" not in text, (seed, lin, mm)
        for b in np.unique(kda.f_up.bias):
            if abs(int(b)) > 1000:
                assert f"32'd{int(b) & 0xFFFFFFFF};" not in text and f"32'h{int(b) & 0xFFFFFFFF:08x}" not in text, b
    # generated again (a fresh elaboration): the same text
    assert top_verilog("kda", cfg) == text


@needs_verilator
@pytest.mark.verilator
@pytest.mark.parametrize("config", sim_configs("tiny", "small", slow=("tiny", "small")))
def test_kda_512_tokens_verilator(config):
    """>= 512 tokens, stalls and back-pressure everywhere, a state clear mid-run (a long run:
    slow suite; tiny 4 minutes on 2 cores, small more.  The default suite's short runs have
    the same stalls, clears and resets)."""
    run_kda(config, "verilator", 512, first=(0, 300), seed=1)


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_kda_tiny_flops_512_tokens_verilator():
    """The flip-flop state (tiny-flops) over >= 512 tokens, stalls and back-pressure everywhere,
    a clear mid-run (tiny's SRAM state runs the same in test_kda_512_tokens_verilator)."""
    run_kda("tiny-flops", "verilator", 512, first=(0, 300), seed=1)


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_kda_small_sram_verilator():
    """small-sram: 16 x fakeram45_64x32 in 2 banks of 4 rows (the multi-row read select),
    12 tokens with stalls and a new sequence at token 5, then without stalls at the cycles
    the schedule costs (measured 3 419 per token against 3 386 with flip-flops: a parity
    bubble before about half of the 64 columns' pass 2; docs/chip.md)."""
    run_kda("small-sram", "verilator", 12, first=(0, 5), seed=2)
    cycles = run_kda("small-sram", "verilator", 8, stall=False, seed=1)
    assert len(set(cycles)) == 1 and cycles[0] <= 3386 + 64, cycles


@pytest.mark.slow        # two Verilator builds for one cycle comparison: 2.5 minutes
@needs_verilator
@pytest.mark.verilator
def test_kda_sram_cycles_constant_and_near_flops():
    """Without stalls: every token the same cycles, and the SRAM schedule's bubbles (at most
    one cycle each time issue resumes after waiting for u) cost at most a few per token."""
    flops = run_kda("tiny-flops", "verilator", 16, stall=False, seed=1)
    sram = run_kda("tiny", "verilator", 16, stall=False, seed=1)
    assert len(set(sram)) == 1, sram
    assert 0 <= sram[0] - flops[0] <= 8, (flops[0], sram[0])


def test_kda_cycles_constant_short():
    """Without stalls every token costs the same cycles.  On Icarus, whose build the other
    tests of this file share: on Verilator it was the suite's only user of that build
    (155 s, most of it the build); the 4096-token check below stays on Verilator."""
    cycles = run_kda(sim_config("tiny"), "icarus", 8, stall=False, seed=1)
    assert len(set(cycles)) == 1, cycles


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_kda_cycles_at_4096_equal_16():
    cycles = run_kda(sim_config("tiny"), "verilator", 4097, stall=False, seed=1)
    assert cycles[4096] == cycles[16], (cycles[16], cycles[4096])


def random_layer_order(layers: int, tokens: int, seed: int) -> tuple[list[int], list[int]]:
    """(layer of each token, tokens with ``first``): layers in a random order, and now and
    then one layer alone starting a new sequence."""
    rng = np.random.default_rng(seed)
    order = [int(v) for v in rng.integers(0, layers, tokens)]
    return order, [t for t in range(tokens) if rng.random() < 0.04]


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_kda_model_tiny_256_tokens_verilator():
    """model-tiny's four layers over 256 tokens in a random order, stalls and back-pressure
    everywhere, restarts of single layers and a reset mid-run; then, without stalls, every
    token the cycles of the one-layer unit with the same state memory, tiny-flops (the layers
    share the schedule; tiny's SRAM state costs the unit one cycle, docs/chip.md)."""
    order, first = random_layer_order(4, 256, seed=3)
    run_model_kda("model-tiny", "verilator", order, first, reset_in=128, seed=1)
    cycles = run_model_kda("model-tiny", "verilator", [3, 1, 0, 2, 2, 0, 1, 3], [], stall=False, seed=1)
    assert set(cycles) == set(run_kda("tiny-flops", "verilator", 8, stall=False, seed=1)), cycles


@needs_verilator
@pytest.mark.verilator
@pytest.mark.slow
def test_kda_model_small_sram_verilator():
    """model-small-sram: the states of four layers of small's size for each of its three
    sequence slots (12 contexts) in SRAM (two banks of 3 x 2 fakeram45_1024x32, the context in
    the macro address), 12 tokens in an irregular order with stalls, a restart
    of one layer and a reset mid-token."""
    run_model_kda("model-small-sram", "verilator", [0, 1, 2, 3, 2, 0, 2, 1, 3, 0, 1, 2],
                  [0, 1, 2, 3, 6], reset_in=9, seed=2)
