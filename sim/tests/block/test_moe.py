"""The MoE unit (hw/moe/unit.py) against the integer model (model/int_moe.py), in cocotb.

Each case builds the RTL from a config alone (hw.tops, the `moe` top), runs the
bench sim/cocotb/tb_moe.py with stalls on every stream and a reset in the
middle of a token, and checks here what the bench measured: tokens, weight
bytes per token (against the analytic count for k + shared experts, which is
also printed next to a dense layer's), per-expert hit counters, the address of
every weight request (from the memory map), and the coverage of the routing
corner cases by the token set.  A model's case (issue 14) runs tokens of every
layer of model-tiny, its dense layer among them, in a mixed order on one unit.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from cocotb_tools.runner import get_runner

from hw.image.memory_map import layer_mixer, layer_prefix, memory_map
from hw.moe.unit import MoEUnit
from moekda.config import REPO_ROOT
from sim.cocotb_util import sim_config, sim_configs, simulator_available
from sim.cocotb.tb_moe_case import build_case, build_model_case, make_config, moe_params, save_case

BENCH_DIR = REPO_ROOT / "sim" / "cocotb"
# the benches build a unit only for its analytic counts (the Verilog comes from hw.tops)
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


needs_verilator = pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")


def build_moe_bench(cfg, workdir: Path, sim: str = "icarus") -> tuple:
    """The unit's Verilog for ``cfg`` (hw.tops, as `moekda rtl --top moe`: no model in it)
    built for ``sim``; returns (runner, build dir, Verilog text).  Any number of models run on it."""
    from hw.tops import top_verilog
    workdir.mkdir(parents=True, exist_ok=True)
    text = top_verilog("moe", cfg)
    (workdir / "moe.v").write_text(text)
    runner = get_runner(sim)
    # Icarus: -g2005 so that initialised regs create a time-0 event and every
    # always @* block of the Yosys-written netlist evaluates once (-g2012 does not)
    build_args = ["-Wno-fatal", "-O2"] if sim == "verilator" else ["-g2005"]
    build_dir = workdir / f"build_{sim}"
    runner.build(sources=[workdir / "moe.v"], hdl_toplevel="moe", build_dir=build_dir,
                 build_args=build_args, always=True, log_file=workdir / f"build_{sim}.log",
                 timescale=("1ns", "1ps"))
    return runner, build_dir, text


def config_case(cfg, n: int, seed: int, zero_bias: bool = False, paired_bias: bool = False):
    """The case of a config-level test: build_case on a layer chip; on a model config
    (`make sim CONFIG=model-tiny`) about ``n`` tokens of its layers in a mixed order, on a
    quickly quantised model of ``seed`` (build_model_case)."""
    if cfg.model.is_layer_chip:
        return build_case(cfg, n, seed=seed, zero_bias=zero_bias, paired_bias=paired_bias)
    from model.cases import quick_model
    _, qm = quick_model(cfg, seed)
    return build_model_case(cfg, qm, per_layer=-(-n // cfg.model.n_layers), seed=seed, zero_bias=zero_bias,
                            paired_bias=paired_bias)


def port_values(case):
    """What tells two models apart on the unit's parameter ports."""
    return moe_params(case) if case.layers is None else case.layer_ports


def run_moe_case(case, built, workdir: Path, sim: str = "icarus", stalls: float = 0.25,
                 reset_after: int = 2, seed: int = 1) -> dict:
    """Run the bench on a built unit with ``case``'s model (image + ``params`` value)."""
    workdir.mkdir(parents=True, exist_ok=True)
    runner, build_dir, _ = built
    unit = MoEUnit(case.cfg)     # for the analytic counts only
    # the roofline of the bench's cycle limit: the heavier token kind
    per_token = max(unit.bytes_per_token(mx) for mx in set(case.cfg.model.mixers))
    save_case(case, workdir / "case.npz", req_stall=stalls, resp_stall=stalls, in_stall=stalls,
              out_stall=stalls, reset_after=reset_after, seed=seed, bytes_per_token=per_token,
              out_bits=unit.out_bits)
    result_path = workdir / "result.json"
    if result_path.exists():
        result_path.unlink()
    env = {"MOE_CASE": str(workdir / "case.npz"), "MOE_RESULT": str(result_path)}
    # the runner passes this process's sys.path to the simulator's Python
    saved = list(sys.path)
    sys.path[:0] = [str(BENCH_DIR), str(REPO_ROOT)]
    try:
        runner.test(hdl_toplevel="moe", test_module="tb_moe", build_dir=build_dir,
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


def run_moe_bench(case, workdir: Path, sim: str = "icarus", stalls: float = 0.25, reset_after: int = 2,
                  seed: int = 1) -> dict:
    built = build_moe_bench(case.cfg, workdir, sim)
    return run_moe_case(case, built, workdir, sim, stalls=stalls, reset_after=reset_after, seed=seed)


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
    if case.layers is not None:
        return check_model_counters(case, res)
    unit = res["unit"]
    n = len(case.tokens)
    assert res["tokens_done"] == n
    per_token = unit.bytes_per_token()
    assert res["weight_bytes"] == n * per_token == res["memory_bytes"]
    E = case.cfg.model.n_experts
    want_hits = np.bincount(case.idx.reshape(-1), minlength=E)
    assert res["hits"] == [int(v) for v in want_hits]
    m = case.cfg.model
    # analytic: router + (k + shared) experts of 3 padded matrices each, independent of the RTL;
    # a LatentMoE's routed experts at width l and its two projections l x d, d x l
    pb = case.cfg.hw.weight_port_bytes
    pad = lambda c: -(-c // pb) * pb  # noqa: E731
    expert = 2 * m.d_ff * pad(m.d_model) + m.d_model * pad(m.d_ff)
    lat = m.moe_latent
    routed = 2 * m.d_ff * pad(lat) + lat * pad(m.d_ff) if lat else expert
    fixed = m.n_experts * pad(m.d_model) + m.n_shared * expert + (lat * pad(m.d_model) + m.d_model * pad(lat))
    assert per_token == fixed + m.top_k * routed
    dense = fixed + m.n_experts * routed
    print(f"\n{case.cfg.name}: {per_token} weight bytes/token measured = analytic "
          f"(k={m.top_k} + shared={m.n_shared}); dense E={m.n_experts}: {dense} "
          f"({per_token / dense:.2f}x); {res['cycles'] / n:.1f} cycles/token with stalls")


def expected_requests(case) -> list[tuple[int, int]]:
    """(addr, beats) of every weight request of the case's tokens, in order, from the memory
    map alone: a MoE layer's token its router, then its experts' matrices (shared experts,
    then the chosen ones in rank order; a dense layer's token: its chunks), each matrix a
    request, each expert's down matrix after the next expert's gate matrix:
    G1 U1 G2 D1 U2 G3 D2 U3 D3; a LatentMoE's lat_down after the router, lat_up last."""
    cfg, m = case.cfg, case.cfg.model
    mmap = memory_map(cfg)
    out = []

    def mat(name):
        r = mmap[name]
        return r.addr, r.beats

    def interleaved(experts):
        order = []
        for i, e in enumerate(experts):
            order.append(mat(f"{e}.gate"))
            if i:
                order.append(mat(f"{experts[i - 1]}.down"))
            order.append(mat(f"{e}.up"))
        return order + [mat(f"{experts[-1]}.down")]

    layers = case.layers if case.layers is not None else np.zeros(len(case.tokens), dtype=int)
    for l, sel in zip(layers, case.idx):
        pre = layer_prefix(cfg, int(l))
        if layer_mixer(cfg, int(l)) == "dense":
            out += interleaved([f"{pre}dense.chunk{c}" for c in range(m.dense_chunks)])
        else:
            router = mmap[f"{pre}moe.router"]
            out.append((router.addr, router.beats))
            if m.moe_latent:
                out.append(mat(f"{pre}moe.lat_down"))
            out += interleaved([f"{pre}moe.shared{j}" for j in range(m.n_shared)] +
                               [f"{pre}moe.expert{int(e)}" for e in sel])
            if m.moe_latent:
                out.append(mat(f"{pre}moe.lat_up"))
    return out


def check_requests(case, res):
    got = [tuple(r) for r in res["request_log"]]
    want = expected_requests(case)
    assert len(got) == len(want), f"{len(got)} weight requests, the tokens need {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"weight request {i}: (addr, beats) {g}, the memory map says {w}"


def check_coverage(case, *, all_equal: bool):
    E, k = case.cfg.model.n_experts, case.cfg.model.top_k
    routed = case.idx[:, 0] >= 0           # a model's dense layers' tokens have no router
    choices, idx = case.choice[routed], case.idx[routed]
    assert set(idx.reshape(-1)) == set(range(E)), "not every expert was chosen"
    assert case.saturated.any(), "no token saturated an engine output"
    # a tie that the rule decides: equal choices across the selection boundary or inside it
    ties = [np.sum(c == c[i[-1]]) > 1 for c, i in zip(choices, idx)]
    assert any(ties), "no token with tied router choices"
    if all_equal:
        eq = [len(set(c)) == 1 for c in choices]
        assert any(eq), "no token with all router choices equal"
        for c, i in zip(choices, idx):
            if len(set(c)) == 1:
                assert list(i) == list(range(k))  # model and RTL both: lowest indices win


CASES = {
    # name: (config overrides, tokens, zero_bias); the corner tokens come first.  "tiny" is the
    # config itself (MOEKDA_CONFIG's under `make sim CONFIG=x`); the others are corners of
    # routing and padding built on tiny's geometry (k = E and the padded rows need its sizes)
    "tiny": ({}, 24, False),
    "k1_zero_bias": ({"top_k": 1}, 16, True),
    "kE_no_shared": ({"top_k": 4, "n_shared": 0}, 16, True),
    "padded_rows": ({"d_model": 12, "d_ff": 20, "n_experts": 5, "top_k": 2, "n_shared": 2}, 16, False),
    # LatentMoE (issue 15): routed experts at width 8 of 16; and at width 6 (z, zr padded to
    # two beats) with every expert chosen and no shared expert (lat_up's sum starts from zero)
    "latent": ({"moe_latent": 8}, 16, False),
    "latent6_kE_no_shared": ({"moe_latent": 6, "top_k": 4, "n_shared": 0}, 16, True),
    # SiTU-GLU (issue 47): the SITU table and the up cap, on the plain and the latent MoE
    "situ": ({"glu": "situ"}, 24, False),
    "situ_latent": ({"glu": "situ", "moe_latent": 8}, 16, False),
    # K3's LatentMoE exit norm (issue 47 difference 4): the routed sum's RMSNorm before lat_up,
    # with SwiGLU, and as K3 has it (SiTU-GLU, routed scale 1.0); and at width 6 (zp, zr padded)
    "exit_norm": ({"moe_latent": 8, "latent_exit_norm": True}, 16, False),
    "k3_latent": ({"glu": "situ", "moe_latent": 8, "latent_exit_norm": True, "routed_scaling": 1,
                   "norm_eps": 1e-5}, 16, False),
    "exit_norm6_kE_no_shared": ({"moe_latent": 6, "top_k": 4, "n_shared": 0, "latent_exit_norm": True}, 16, True),
}


# the exit norm's other cases (SwiGLU; width 6 with kE and no shared expert) and SiTU-GLU in the
# LatentMoE are slow: each is minutes of Icarus, and k3_latent (SiTU-GLU, latent, exit norm)
# runs the same paths in the default suite (issue 49 item 7: a default suite under 15 minutes)
# The default suite keeps tiny (the plain unit) and k3_latent (SiTU-GLU, latent, exit norm);
# the other corners each repeat those paths with one dimension moved and run in the slow
# suite (`pytest -m slow`, `make sim CONFIG=...`): minutes of Icarus each, 1.8k s together.
SLOW_CASES = {"exit_norm", "exit_norm6_kE_no_shared", "situ_latent", "situ", "kE_no_shared",
              "k1_zero_bias", "padded_rows", "latent6_kE_no_shared", "latent"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CASES else n for n in CASES])
def test_moe_bit_exact_icarus(name, tmp_path):
    over, n, zero_bias = CASES[name]
    if name == "padded_rows":
        cfg = make_config("tiny", **over)
        cfg = type(cfg)(**{**cfg.__dict__, "hw": type(cfg.hw)(**{**cfg.hw.__dict__, "weight_port_bytes": 8,
                                                                   "lanes": 8})})
    else:
        cfg = make_config(sim_config("tiny") if name == "tiny" else "tiny", **over)
    case = config_case(cfg, n, seed=3, zero_bias=zero_bias)
    res = run_moe_bench(case, tmp_path, "icarus")
    check_counters(case, res)
    check_requests(case, res)
    if zero_bias:
        assert any(len(set(c)) == 1 for c in case.choice)


def test_lanes_must_equal_port_bytes():
    """One port beat is one engine beat: any other pairing is a one-line config error."""
    from moekda.config import ConfigError
    cfg = make_config("tiny")
    cfg = type(cfg)(**{**cfg.__dict__, "hw": type(cfg.hw)(**{**cfg.hw.__dict__, "weight_port_bytes": 8})})
    with pytest.raises(ConfigError, match="hw.lanes = 4: .*weight_port_bytes"):
        MoEUnit(cfg)


@pytest.mark.slow     # fast twin: test_moe_model_tiny_icarus (one netlist, four layers' models)
def test_one_unit_runs_two_models(tmp_path):
    """Issue 13: the RTL is a function of the config alone.  One generated unit (the
    `moekda rtl --top moe` Verilog, built once) runs two different quantised models,
    each bit-exact, told apart only by the weight image and the ``params`` port; the
    Verilog is the same text whatever model is at hand, with ``params`` an input of the
    MoE sub-bank's width, and hw/ imports nothing of sim/."""
    import re

    from hw.image.param_map import param_layout
    from hw.tops import top_verilog
    cfg = make_config(sim_config("tiny"))
    cases = [config_case(cfg, 10, seed=3), config_case(cfg, 10, seed=11, zero_bias=True)]
    assert port_values(cases[0]) != port_values(cases[1])
    built = build_moe_bench(cfg, tmp_path / "unit", "icarus")
    text = built[2]
    width = param_layout(cfg, "moe").size
    assert re.search(rf"input \[{width - 1}:0\] params;", text), "no params input port of the sub-bank's width"
    for n, case in enumerate(cases):
        res = run_moe_case(case, built, tmp_path / f"model{n}", "icarus", stalls=0.2, reset_after=0)
        check_counters(case, res)
        # the model at hand (quantised, routed through the integer model) changes nothing in the RTL
        assert top_verilog("moe", cfg) == text
    assert not list(cases[0].expected.reshape(-1)) == list(cases[1].expected.reshape(-1))
    # hw/ importing nothing from sim/ is checked once, in test_dependencies.py


def _long_run(cfg, n, tmp_path, zero_bias=False, seed=5):
    case = config_case(cfg, n, seed=seed, zero_bias=zero_bias, paired_bias=not zero_bias)
    check_coverage(case, all_equal=zero_bias)
    res = run_moe_bench(case, tmp_path, "verilator", stalls=0.2, reset_after=3, seed=seed)
    check_counters(case, res)
    return case, res


@needs_verilator
@pytest.mark.verilator
@pytest.mark.parametrize("config", sim_configs("tiny", "small", slow=("tiny", "small")))   # long runs
def test_moe_256_tokens_verilator(config, tmp_path):
    """>= 256 tokens bit-exact with stalls and a reset; every expert chosen, ties, saturation."""
    _long_run(make_config(config), 256, tmp_path)


@pytest.mark.slow
@needs_verilator
@pytest.mark.verilator
@pytest.mark.parametrize("k", ["1", "E"], ids=["k1", "kE"])
def test_moe_256_tokens_verilator_k_extremes(k, tmp_path):
    """k = 1 and k = E over 256 tokens; zero bias so all-equal choices occur (the all-zero token)."""
    base = sim_config("tiny")
    over = {"top_k": 1} if k == "1" else {"top_k": make_config(base).model.n_experts, "n_shared": 0}
    _long_run(make_config(base, **over), 256, tmp_path, zero_bias=True)


@pytest.mark.parametrize("config", sim_configs("tiny", "small", slow=("small",)) +
                         [pytest.param(c, marks=pytest.mark.slow) for c in ("latent", "exit_norm")])
def test_moe_cycles_per_token_without_stalls(config, tmp_path):
    """The port is the roofline: with no stalls a token takes its weight beats plus a
    bounded overhead: the memory latency, and the MAC drain and hidden conversion of its
    LAST expert only (every other expert's hide behind the next one's gate rows,
    hw/moe/unit.py next_phase; with one wait per expert, as before that order, small's
    three experts are over this bound).  On a model config each token against its own
    layer's kind (a dense layer: C chunks).  A LatentMoE ("latent": tiny with
    moe_latent 8) waits once more, for zr: the last routed expert's down rows drain through
    the engine, the running sum and the combine pipeline before lat_up's rows can go
    (measured 73 cycles over 464 beats against plain tiny's 52 over 592); with K3's exit
    norm ("exit_norm") the normaliser's run on top."""
    if config in ("latent", "exit_norm"):
        cfg = make_config("tiny", moe_latent=8, latent_exit_norm=config == "exit_norm")
    else:
        cfg = make_config(config)
    case = config_case(cfg, 12, seed=9)
    res = run_moe_bench(case, tmp_path, "icarus", stalls=0.0, reset_after=0)
    unit = res["unit"]
    # the last expert: MAC + product pipelines drain, exponent, conversion (nb_f beats + 3)
    last_expert = 32 + unit.nb_f
    zr_wait = 24 if cfg.model.moe_latent else 0
    if cfg.model.latent_exit_norm:
        # and K3's exit norm, on the same chain: the normaliser's 2 l + its rsqrt and sums
        # (hw/kda/norm.py) before zr is complete (measured on tiny, l = 8: 615 cycles a token
        # against 537 without the norm, 78 more)
        zr_wait += 2 * cfg.model.moe_latent + 64

    def beats_and_bound(kind):
        beats = unit.bytes_per_token(kind) // cfg.hw.weight_port_bytes
        return beats, beats + cfg.hw.weight_port_latency + 24 + last_expert + zr_wait
    outs = res["out_cycles"]
    if case.layers is None:
        beats, bound = beats_and_bound("moe")
        steady = (outs[-1] - outs[len(outs) // 2]) / (len(outs) - 1 - len(outs) // 2)
        print(f"\n{config}: {steady:.1f} cycles/token without stalls, {beats} weight beats/token, "
              f"bound {bound}; {unit.bytes_per_token()} B/token vs dense {unit.dense_bytes_per_token()} B")
        assert beats <= steady <= bound
        return
    # one token inside at a time, nothing stalls: token i's cycles are the gap between outputs
    for i in range(1, len(outs)):
        kind = layer_mixer(cfg, int(case.layers[i]))
        beats, bound = beats_and_bound(kind)
        gap = outs[i] - outs[i - 1]
        assert beats <= gap <= bound, f"token {i} ({kind} layer): {gap} cycles, {beats} beats, bound {bound}"


# ---- a model: every layer of the stack on one unit (issue 14) ---------------------------

def check_model_counters(case, res):
    """Bytes per token by the token's mixer kind (analytic, independent of the RTL), hits of
    the MoE layers' tokens only."""
    cfg, m = case.cfg, case.cfg.model
    unit = res["unit"]
    pb = cfg.hw.weight_port_bytes
    pad = lambda c: -(-c // pb) * pb  # noqa: E731
    expert = 2 * m.d_ff * pad(m.d_model) + m.d_model * pad(m.d_ff)
    per_kind = {"moe": m.n_experts * pad(m.d_model) + (m.top_k + m.n_shared) * expert,
                "dense": m.dense_chunks * expert}
    for kind, n in per_kind.items():
        assert unit.bytes_per_token(kind) == n
    want = sum(per_kind[layer_mixer(cfg, int(l))] for l in case.layers)
    assert res["tokens_done"] == len(case.tokens)
    assert res["weight_bytes"] == want == res["memory_bytes"]
    moe_idx = case.idx[case.idx[:, 0] >= 0]
    assert res["hits"] == [int(v) for v in np.bincount(moe_idx.reshape(-1), minlength=m.n_experts)]


def layer_order_coverage(layers, mixers) -> dict:
    """What the token order exercises: a dense token after a MoE one and the reverse, two
    different MoE layers back to back, and one layer twice in a row."""
    pairs = list(zip(layers, layers[1:]))
    kind = lambda l: mixers[int(l)]  # noqa: E731
    return {"moe_to_dense": any(kind(a) == "moe" and kind(b) == "dense" for a, b in pairs),
            "dense_to_moe": any(kind(a) == "dense" and kind(b) == "moe" for a, b in pairs),
            "moe_to_other_moe": any(kind(a) == kind(b) == "moe" and a != b for a, b in pairs),
            "same_layer": any(a == b for a, b in pairs)}


@pytest.mark.parametrize("rows", ["config"] + [pytest.param(r, marks=pytest.mark.slow) for r in ("one_beat_rows", "situ")])
def test_moe_model_tiny_icarus(rows, tmp_path):
    """model-tiny's four layers (layer 0 dense, 1..3 MoE) on one unit: tokens of every layer in
    a mixed order, each with its layer index and that layer's parameters on the ports (random
    bits on the port of the other kind, a random ``layer`` while no token is offered), the
    model's image as the weight memory, stalls on every stream and a reset in the middle of a
    token; bit-exact with int_dense_step / int_moe_step of the token's layer, every weight
    request at the address the memory map gives that layer.  ``one_beat_rows``: a 16-byte
    port (every row one beat), so a segment's first beat ends a row and takes its (m, s)
    from the bank of the segment just begun (the unit's registered bank).  ``situ``: the same
    model with K3's SiTU-GLU (model.glu = "situ", issue 47) in the dense layer's chunks and
    every expert."""
    from moekda.config import with_settings
    from model.cases import model_config, quick_model
    cfg = model_config(sim_config("model-tiny"))
    if rows == "situ":
        cfg = with_settings(cfg, ['model.glu="situ"'])
    if cfg.model.is_layer_chip:
        pytest.skip(f"{cfg.name} is a layer chip: no layers to sequence (the cases above run it)")
    if rows == "one_beat_rows":
        if cfg.model.d_model > 16 or cfg.model.d_ff > 16:
            pytest.skip(f"{cfg.name}: rows longer than one 16-byte beat")
        cfg = type(cfg)(**{**cfg.__dict__, "hw": type(cfg.hw)(**{**cfg.hw.__dict__, "weight_port_bytes": 16,
                                                                   "lanes": 16})})
    _, qm = quick_model(cfg, seed=4)
    case = build_model_case(cfg, qm, per_layer=4, seed=4)
    cover = layer_order_coverage(list(case.layers), cfg.model.mixers)
    assert all(cover.values()), f"token order does not cover {[k for k, v in cover.items() if not v]}"
    assert case.saturated.any(), "no token saturated an engine output"
    res = run_moe_bench(case, tmp_path, "icarus", stalls=0.25, reset_after=2, seed=4)
    check_model_counters(case, res)
    check_requests(case, res)


@pytest.mark.parametrize("chunks", [3, 16])
def test_dense_accumulator_width(chunks):
    """The unit's combine accumulators are as wide as int_moe.dense_combine_bits says a dense
    layer's sum needs (on model-tiny wider than the MoE's from 16 chunks on), the
    same formula written twice because hw/ may not import sim/."""
    from moekda.formats import derived_widths, formats_for
    from model.int_moe import dense_combine_bits
    from model.cases import model_config
    cfg = model_config("model-tiny", d_ff_dense=chunks * 16)
    unit = MoEUnit(cfg)
    assert unit.acc_bits == dense_combine_bits(cfg, formats_for(cfg))
    assert (unit.acc_bits > derived_widths(cfg)["moe_combine_acc"]) == (chunks == 16)
    tiny = make_config("tiny")
    assert MoEUnit(tiny).acc_bits == derived_widths(tiny)["moe_combine_acc"]
