"""Randomised configs (issue 18, item 4): each run draws valid configs, generates their chip
and checks a few tokens bit-exact against the integer model through the layer driver
(run/driver.py LayerDriver: the RTL in cocotb, outputs placed by the chip's tags, the CSR
counters against the memory map).

The draw uses moekda/config.py's fields and ranges, capped small so one simulator build
is short (d_model <= 32, head_dim <= 16, <= 2 heads, <= 4 experts, d_ff <= 32, <= 8
lanes), and draws the related fields so the relations hold by construction (lanes =
weight_port_bytes, a power of two; state_lanes divides head_dim; top_k <= n_experts;
gate_rank <= d_model); every draw still goes through ``config_from_dict``'s checks.

The seed is printed (and is in every failure message); ``MOEKDA_RANDOM_SEED=N`` repeats a
run.  Without it each run draws a new seed.  The default suite checks one config (a few
tokens, Verilator); the slow test three more with a CSR clear, a reset and more tokens.
"""
from __future__ import annotations

import dataclasses
import os
import random
import time

import pytest

from moekda.config import ConfigError, FormatsConfig, HwConfig, ModelConfig, config_from_dict
from sim.cocotb_util import simulator_available
from run.driver import LayerDriver, RunPlan

# the caps on top of config.py's ranges (lo from the field, hi = min(field's hi, cap))
CAPS = {"model": {"d_model": 32, "n_heads": 2, "head_dim": 16, "n_experts": 4, "d_ff": 32, "n_shared": 1,
                  "conv_kernel": 4, "gate_rank": 8},
        "hw": {"lanes": 8, "weight_port_latency": 8, "clock_period_ns": 2.5},
        "formats": {"acc_bits": 32, "requant_mult_bits": 16, "state_bits": 20, "lut_in_bits": 8}}
SIMULATOR = "verilator" if simulator_available("verilator") else "icarus"


def _range(cls, name: str, section: str):
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    lo, hi = f.metadata["lo"], f.metadata["hi"]
    return lo, min(hi, CAPS[section].get(name, hi))


def draw_config(rng: random.Random, name: str):
    """One valid config, its fields drawn from config.py's ranges under CAPS."""
    def pick(cls, section, field):
        lo, hi = _range(cls, field, section)
        return rng.randint(lo, hi)
    m = {f: pick(ModelConfig, "model", f) for f in CAPS["model"]}
    m["top_k"] = rng.randint(1, m["n_experts"])
    m["gate_rank"] = rng.randint(1, min(m["gate_rank"], m["d_model"]))
    m["head_dim"] = min(m["head_dim"], 4 * m["d_model"] // m["n_heads"])    # n_heads*head_dim <= 4*d_model
    lo, hi = _range(HwConfig, "lanes", "hw")
    lanes = rng.choice([1 << n for n in range(8) if lo <= 1 << n <= hi])
    hw = {"lanes": lanes, "weight_port_bytes": lanes, "weight_port_latency": pick(HwConfig, "hw", "weight_port_latency"),
          "state_lanes": rng.choice([s for s in (1, 2, 4, 8) if m["head_dim"] % s == 0]),
          "clock_period_ns": rng.choice([p for p in (0.8, 1.0, 1.25, 2.0, 2.5)
                                         if _range(HwConfig, "clock_period_ns", "hw")[0] <= p
                                         <= _range(HwConfig, "clock_period_ns", "hw")[1]]),
          "state_memory": rng.choice(["flops", "flops", "flops", "sram"])}
    fm = {f: pick(FormatsConfig, "formats", f) for f in ("state_bits", "lut_in_bits")}
    fm["acc_bits"] = rng.choice([24, 32])
    return config_from_dict({"name": name, "model": m, "hw": hw, "formats": fm}, source=f"draw {name}")


def draw_configs(seed: int, n: int, top_k=()) -> list:
    """``n`` configs; ``top_k``: for the first ones, "1" (k = 1) or "E" (k = E, E >= 2)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        try:
            cfg = draw_config(rng, f"rand{seed}-{len(out)}")
        except ConfigError:      # a relation the draw does not build in (none known): draw again
            continue
        want = top_k[len(out)] if len(out) < len(top_k) else None
        if want == "1" and not (cfg.model.top_k == 1 and cfg.model.n_experts >= 2) \
                or want == "E" and not cfg.model.top_k == cfg.model.n_experts >= 2:
            continue
        out.append(cfg)
    return out


def _seed(offset: int) -> int:
    env = os.environ.get("MOEKDA_RANDOM_SEED")
    return int(env) + offset if env else random.SystemRandom().randrange(1 << 31)


def _describe(cfg) -> str:
    d = cfg.to_dict()
    return f"model {d['model']} hw {d['hw']} formats {d['formats']}"


def tie_experts(q) -> None:
    """Routed experts 0 and 1 get the same router row and selection bias: their choices are
    equal on every token, so whenever one of them is chosen and the other is not, the
    "lowest index first" rule decides (a tie at the top-k boundary), through the whole chip."""
    q.moe.router.w[1] = q.moe.router.w[0]
    q.moe.bias[1] = q.moe.bias[0]


def _run(cfg, seed: int, plan: RunPlan, root, name: str, ties: bool = False):
    from model.quantize import quantize_random_layer
    q = quantize_random_layer(cfg, seed)
    if ties:
        tie_experts(q)
    drv = LayerDriver(cfg, q, label=f"seed{seed}", build_root=root / cfg.name, model_seed=seed)
    t0 = time.monotonic()
    res = drv.run(plan, simulator=SIMULATOR, name=name)
    print(f"{cfg.name}: {_describe(cfg)}: {'MATCH' if res.match else 'MISMATCH'} in {time.monotonic() - t0:.0f} s")
    assert res.match, f"model seed {seed}, config {_describe(cfg)}:\n{res.summary()}"
    return drv, res


def test_draws_are_valid_and_varied():
    """The draw itself: valid configs over the capped ranges, repeatable from the seed."""
    cfgs = draw_configs(12345, 40)
    assert [c.to_dict() for c in cfgs] == [c.to_dict() for c in draw_configs(12345, 40)]
    for field, lo, hi in (("d_model", 4, 32), ("n_experts", 1, 4), ("d_ff", 4, 32)):
        values = {getattr(c.model, field) for c in cfgs}
        assert min(values) >= lo and max(values) <= hi and len(values) > 3, (field, values)
    assert {c.hw.lanes for c in cfgs} >= {1, 2, 4, 8}
    assert any(c.model.top_k == 1 for c in cfgs) and any(c.model.top_k == c.model.n_experts for c in cfgs)
    k1, kE, _ = draw_configs(7, 3, top_k=("1", "E"))
    assert k1.model.top_k == 1 and kE.model.top_k == kE.model.n_experts >= 2


@pytest.mark.verilator
def test_random_config_bit_exact(tmp_path_factory):
    """One drawn config, 4 tokens with stalls on every port and a CSR clear."""
    seed = _seed(0)
    print(f"MOEKDA_RANDOM_SEED={seed}")
    (cfg,) = draw_configs(seed, 1)
    _run(cfg, seed, RunPlan(tokens=4, clears=(2,), seed=seed % 1000), tmp_path_factory.mktemp("random"), "rand4")


@pytest.mark.slow
@pytest.mark.verilator
def test_random_configs_long(tmp_path_factory):
    """Three drawn configs, 24 tokens each, a stream-marked start, a CSR clear and a reset
    with a token inside; one with k = 1 and experts 0 and 1 tied (tie_experts), one with
    k = E.  Coverage (run/coverage.py) in build/random/reports/coverage.md."""
    from run.coverage import holes, layer_coverage, record
    seed = _seed(1)
    print(f"MOEKDA_RANDOM_SEED={seed - 1}")
    root = tmp_path_factory.mktemp("random_long")
    covered = set()
    # one config with k = 1, one with k = E: the coverage items the fixed configs cannot have
    for n, cfg in enumerate(draw_configs(seed, 3, top_k=("1", "E"))):
        plan = RunPlan(tokens=24, first=(0, 9), clears=(15,), reset_at=18, abandon=1, seed=seed % 1000)
        drv, res = _run(cfg, seed, plan, root, "rand24", ties=n == 0)
        cov = layer_coverage(drv, plan, res)
        record("random", f"{cfg.name}: {_describe(cfg)}", cov, note=f"MOEKDA_RANDOM_SEED={seed - 1}, 24 tokens"
               + (", experts 0 and 1 tied" if n == 0 else ""))
        assert not holes(cov, ("restart_first", "restart_clear", "restart_reset", "tokens")
                         + (("ties",) if n == 0 else ()))
        covered |= {key for key in ("k1", "kE") if cov[key].covered}
    assert covered == {"k1", "kE"}
