"""`make sim CONFIG=x` reaches every simulation test that is about a config.

The Makefile sets MOEKDA_CONFIG=x; a config-level simulation test takes its config(s)
from sim/cocotb_util.py ``sim_config`` / ``sim_configs``, which return x alone when it is
set and the test's own otherwise (so `make test` runs exactly what it ran before).  The
block tests below keep their own geometry: each sweeps a grid of sizes chosen for its
corners, and a config adds nothing to it.  A new simulation test file must do one or the
other; this test says which files do neither.
"""
from __future__ import annotations

import os
import subprocess
import sys

from moekda.config import REPO_ROOT

TESTS = REPO_ROOT / "sim" / "tests"
# what makes a test file a simulation test: it runs RTL in cocotb or Amaranth's simulator
SIMULATES = ("run_cocotb", "LayerDriver", "run_kda", "run_moe", "from amaranth.sim import", "Simulator(",
             "from sim.pysim import simulate")
# block tests that do not take MOEKDA_CONFIG, and why (README: `make sim`)
OWN_GEOMETRY = {
    "test_cocotb_util.py": "tests the runner itself (a run that ran no test), any config would do",
    "test_counter.py": "counter widths and chunkings, no config",
    "test_fakeram.py": "the SRAM macro model against the kit's macro table, no config",
    "test_kda_blocks.py": "KDA sub-blocks over sizes chosen for their corners",
    "test_kda_delta.py": "delta rule over a grid of heads, head sizes, lanes and shifts (tiny's formats)",
    "test_layer_arbiter.py": "arbiter over client counts and stall patterns, no config",
    "test_layer_weight_memory.py": "the HDL weight memory over port widths and stalls, no config",
    "test_mla_unit.py": "model-tiny / model-small with MLA layers in place of KDA ones: no config "
                        "file's image holds MLA layers yet (the hybrid configs add AttnRes and LatentMoE)",
    "test_moe_divider.py": "the divider over widths, no config",
    "test_prefix_add.py": "the prefix adder over widths, no config",
    "test_random_configs.py": "draws its own configs from config.py's ranges (a printed seed)",
    "test_situ_chip.py": "K3's SiTU-GLU on its own config (tiny-situ): another config's chip has SwiGLU",
    "test_skid.py": "the register slice over stall patterns, no config",
    "test_topk.py": "top-k over (n, k) pairs, no config",
}


def _simulation_files():
    return sorted(p for p in TESTS.rglob("test_*.py") if any(s in p.read_text() for s in SIMULATES))


def _test_file(name: str):
    """sim/tests/<level>/<name>, or None (the tests are grouped by level: block/, chip/)."""
    found = sorted(TESTS.rglob(name))
    return found[0] if found else None


def test_every_simulation_test_takes_the_config_or_says_why_not():
    undecided = [p.name for p in _simulation_files()
                 if "sim_config" not in p.read_text() and p.name not in OWN_GEOMETRY]
    assert not undecided, f"simulation tests that ignore MOEKDA_CONFIG without a reason here: {undecided}"
    stale = [n for n in OWN_GEOMETRY if _test_file(n) is None or "sim_config" in _test_file(n).read_text()]
    assert not stale, f"listed as keeping their own geometry but gone or config-driven: {stale}"


def _collected(config: str | None, *files: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "MOEKDA_CONFIG"}
    if config:
        env["MOEKDA_CONFIG"] = config
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *(str(_test_file(f)) for f in files)], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line.split("::", 1)[1] for line in out.stdout.splitlines() if "::" in line}


def test_config_x_replaces_the_configs_of_the_parametrised_tests():
    files = ("test_matvec.py", "test_moe.py", "test_kda_norm.py", "test_residual.py", "test_kda_unit.py")
    default = _collected(None, *files)
    assert {"test_rtl_matches_model[tiny-icarus]", "test_rtl_matches_model[small-icarus]",
            "test_moe_cycles_per_token_without_stalls[small]", "test_params_port_is_the_bank_slice[tiny]",
            "test_normalizer_matches_model[tiny-12]", "test_kda_512_tokens_verilator[small]"} <= default
    small = _collected("small", *files)
    assert not [t for t in small if "[tiny" in t and "test_moe_bit_exact_icarus" not in t], small
    assert {"test_rtl_matches_model[small-icarus]", "test_moe_256_tokens_verilator[small]",
            "test_normalizer_matches_model[small-12]", "test_params_port_is_the_bank_slice[small]",
            "test_kda_512_tokens_verilator[small]"} <= small
