"""The MoE unit (hw/moe.py) against the integer model (sim/models/int_moe.py), in cocotb.

Each case builds the RTL from a config and its quantised parameters, runs the
bench sim/cocotb/tb_moe.py with stalls on every stream and a reset in the
middle of a token, and checks here what the bench measured: tokens, weight
bytes per token (against the analytic count for k + shared experts, which is
also printed next to a dense layer's), per-expert hit counters, and the
coverage of the routing corner cases by the token set.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from amaranth.back import verilog
from cocotb_tools.runner import get_runner

from hw.moe import MoEUnit
from moekda.config import REPO_ROOT
from sim.cocotb.tb_moe_case import build_case, make_config, save_case

BENCH_DIR = REPO_ROOT / "sim" / "cocotb"


def run_moe_bench(case, workdir: Path, sim: str = "icarus", stalls: float = 0.25, reset_after: int = 2,
                  seed: int = 1) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    unit = MoEUnit(case.cfg, case.qlayer.moe)
    (workdir / "moe.v").write_text(verilog.convert(unit, name="moe"))
    save_case(case, workdir / "case.npz", req_stall=stalls, resp_stall=stalls, in_stall=stalls,
              out_stall=stalls, reset_after=reset_after, seed=seed, bytes_per_token=unit.bytes_per_token(),
              out_bits=unit.out_bits)
    runner = get_runner(sim)
    # Icarus: -g2005 so that initialised regs create a time-0 event and every
    # always @* block of the Yosys-written netlist evaluates once (-g2012 does not)
    build_args = ["-Wno-fatal", "-Wno-WIDTH"] if sim == "verilator" else ["-g2005"]
    runner.build(sources=[workdir / "moe.v"], hdl_toplevel="moe", build_dir=workdir / f"build_{sim}",
                 build_args=build_args, always=True, log_file=workdir / f"build_{sim}.log",
                 timescale=("1ns", "1ps"))
    result_path = workdir / "result.json"
    if result_path.exists():
        result_path.unlink()
    env = {"MOE_CASE": str(workdir / "case.npz"), "MOE_RESULT": str(result_path)}
    # the runner passes this process's sys.path to the simulator's Python
    saved = list(sys.path)
    sys.path[:0] = [str(BENCH_DIR), str(REPO_ROOT)]
    try:
        runner.test(hdl_toplevel="moe", test_module="tb_moe", build_dir=workdir / f"build_{sim}",
                    test_dir=workdir, extra_env=env, log_file=workdir / f"test_{sim}.log",
                    results_xml=str(workdir / "results.xml"), timescale=("1ns", "1ps"))
    except SystemExit:   # the runner exits on a failed test; the xml says why
        pass
    finally:
        sys.path[:] = saved
    xml = workdir / "results.xml"
    if not xml.exists():
        pytest.fail(f"simulation ended abnormally, see {workdir / f'test_{sim}.log'}")
    failures = _failures(xml)
    assert not failures, f"cocotb bench failed: {failures[0]} (log: {workdir / f'test_{sim}.log'})"
    result = json.loads(result_path.read_text())
    result["unit"] = unit
    return result


def _failures(xml_path) -> list[str]:
    import xml.etree.ElementTree as ET
    root = ET.parse(xml_path).getroot()
    out = []
    for tc in root.iter("testcase"):
        for f in tc.findall("failure") + tc.findall("error"):
            out.append(f"{tc.get('name')}: {f.get('message', '')[:800]}")
    if not list(root.iter("testcase")):
        out.append("no test ran")
    return out


def check_counters(case, res):
    unit = res["unit"]
    n = len(case.tokens)
    assert res["tokens_done"] == n
    per_token = unit.bytes_per_token()
    assert res["weight_bytes"] == n * per_token == res["memory_bytes"]
    E = case.cfg.model.n_experts
    want_hits = np.bincount(case.idx.reshape(-1), minlength=E)
    assert res["hits"] == [int(v) for v in want_hits]
    m = case.cfg.model
    # analytic: router + (k + shared) experts of 3 padded matrices each, independent of the RTL
    pb = case.cfg.hw.weight_port_bytes
    pad = lambda c: -(-c // pb) * pb  # noqa: E731
    expert = 2 * m.d_ff * pad(m.d_model) + m.d_model * pad(m.d_ff)
    assert per_token == m.n_experts * pad(m.d_model) + (m.top_k + m.n_shared) * expert
    dense = m.n_experts * pad(m.d_model) + (m.n_experts + m.n_shared) * expert
    print(f"\n{case.cfg.name}: {per_token} weight bytes/token measured = analytic "
          f"(k={m.top_k} + shared={m.n_shared}); dense E={m.n_experts}: {dense} "
          f"({per_token / dense:.2f}x); {res['cycles'] / n:.1f} cycles/token with stalls")


def check_coverage(case, *, all_equal: bool):
    E, k = case.cfg.model.n_experts, case.cfg.model.top_k
    assert set(case.idx.reshape(-1)) == set(range(E)), "not every expert was chosen"
    assert case.saturated.any(), "no token saturated an engine output"
    # a tie that the rule decides: equal choices across the selection boundary or inside it
    ties = [np.sum(c == c[i[-1]]) > 1 for c, i in zip(case.choice, case.idx)]
    assert any(ties), "no token with tied router choices"
    if all_equal:
        eq = [len(set(c)) == 1 for c in case.choice]
        assert any(eq), "no token with all router choices equal"
        for c, i in zip(case.choice, case.idx):
            if len(set(c)) == 1:
                assert list(i) == list(range(k))  # model and RTL both: lowest indices win


CASES = {
    # name: (config overrides, tokens, zero_bias)
    "tiny": ({}, 64, False),
    "k1_zero_bias": ({"top_k": 1}, 48, True),
    "kE_no_shared": ({"top_k": 4, "n_shared": 0}, 48, True),
    "padded_rows": ({"d_model": 12, "d_ff": 20, "n_experts": 5, "top_k": 2, "n_shared": 2}, 48, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_moe_bit_exact_icarus(name, tmp_path):
    over, n, zero_bias = CASES[name]
    if name == "padded_rows":
        cfg = make_config("tiny", **over)
        cfg = type(cfg)(**{**cfg.__dict__, "hw": type(cfg.hw)(**{**cfg.hw.__dict__, "weight_port_bytes": 8})})
    else:
        cfg = make_config("tiny", **over)
    case = build_case(cfg, n, seed=3, zero_bias=zero_bias)
    res = run_moe_bench(case, tmp_path, "icarus")
    check_counters(case, res)
    if zero_bias:
        assert any(len(set(c)) == 1 for c in case.choice)
