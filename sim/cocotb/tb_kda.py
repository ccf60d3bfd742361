"""cocotb bench of the KDA unit (hw/kda/unit.py) against the integer model, bit for bit.

The RTL is the config's (hw/tops.py ``kda``, built by sim/cocotb_util.py): it
holds no model.  The case - config, weight image, the parameter bits driven
on ``params`` (hw/image/param_map.py ``region_value(cfg, qlayer.to_flat(), "kda")``),
input tokens, where sequences start, expected outputs - is made by
``kda_case`` in the pytest process from one quantised model and handed over
in one .npz file (KDA_CASE), so the parameters, the weights and the
expectations cannot come from two different versions of the model.  Inputs are realistic: residual-stream
tokens through the integer model's attention RMSNorm.

Checks: every output token equals the model's; stalls on the input stream,
the weight port (both directions) and back-pressure on the output when
KDA_STALL=1; the unit's ``token_cycles`` counter per token is written to
KDA_CYCLES_OUT (one number per line) for the constant-cost check.  The bench
waits at most sim/cocotb_util.py ``cycle_limit`` cycles for all outputs;
MOEKDA_RESP_STALL overrides the weight memory's response stall (1.0: it never
answers, how sim/tests/test_bench_limits.py makes the unit hang).
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hw.image.memory_map import build_image, memory_map
from hw.kda.unit import OPS
from hw.image.param_map import region_value
from moekda.config import load_config
from moekda.formats import formats_for
from sim.models.int_kda import IntKDAState, int_kda_step
from sim.models.int_layer import quantize_input
from sim.models.int_ops import int_rmsnorm
from sim.models.params import random_inputs, random_params
from sim.models.quantize import quantize_layer


@dataclass
class KdaCase:
    cfg: object
    qkda: object
    image: bytes
    params: int         # the bits of the ``params`` port
    xn: np.ndarray      # (T, d) int8 unit inputs
    first: np.ndarray   # (T,) bool: a sequence starts at this token
    want: np.ndarray    # (T, d) int8 model outputs


@lru_cache(maxsize=4)
def quantised(config: str, seed: int):
    cfg = load_config(config)
    return cfg, quantize_layer(random_params(cfg, seed), cfg)


def kda_case(config: str, seed: int, tokens: int, first=(0,)) -> KdaCase:
    cfg, qp = quantised(config, seed)
    fm = formats_for(cfg)
    x = quantize_input(random_inputs(cfg, tokens, seed=seed + 1), qp, cfg)
    xn = np.array([int_rmsnorm(t, qp.attn_norm, fm) for t in x], dtype=np.int64)
    starts = np.zeros(tokens, bool)
    starts[[f for f in first if f < tokens]] = True
    starts[0] = True
    want = np.zeros_like(xn)
    state = IntKDAState.zeros(cfg)
    for t in range(tokens):
        if starts[t]:
            state = IntKDAState.zeros(cfg)
        state, want[t] = int_kda_step(qp.kda, cfg, fm, state, xn[t])
    mm = memory_map(cfg)
    tensors = {name: np.zeros((reg.rows, reg.cols), np.int64) for name, reg in mm.regions.items()}
    for _, region, field, _ in OPS:
        tensors[region] = getattr(qp.kda, field).w
    return KdaCase(cfg, qp.kda, build_image(cfg, tensors, mm), region_value(cfg, qp.to_flat(), "kda"),
                   xn, starts, want)


def save_case(case: KdaCase, path) -> None:
    nbytes = max(1, -(-case.params.bit_length() // 8))
    np.savez(path, config=case.cfg.source, xn=case.xn, first=case.first, want=case.want,
             image=np.frombuffer(case.image, dtype=np.uint8),
             params=np.frombuffer(case.params.to_bytes(nbytes, "little"), dtype=np.uint8))


def case_from_env() -> KdaCase:
    z = np.load(os.environ["KDA_CASE"])
    return KdaCase(load_config(str(z["config"])), None, z["image"].tobytes(),
                   int.from_bytes(z["params"].tobytes(), "little"), z["xn"], z["first"], z["want"])


def pack(values, bits: int) -> int:
    out = 0
    for n, v in enumerate(values):
        out |= (int(v) & ((1 << bits) - 1)) << (n * bits)
    return out


def unpack(word: int, n: int, bits: int) -> list[int]:
    vals = [(word >> (i * bits)) & ((1 << bits) - 1) for i in range(n)]
    return [v - (1 << bits) if v >> (bits - 1) else v for v in vals]


try:
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

    from sim.cocotb.weight_memory import WeightMemory
    from sim.cocotb_util import cycle_limit, over_limit, roofline_cycles, tb_param
except ImportError:        # imported by pytest for kda_case only
    cocotb = None

if cocotb is not None:
    @cocotb.test()
    async def kda_matches_model(dut):
        case = case_from_env()
        cfg = case.cfg
        stall = os.environ.get("KDA_STALL", "1") == "1"
        rng = random.Random(int(os.environ.get("KDA_SEED", "0")))
        d, a = cfg.model.d_model, formats_for(cfg).act_bits
        T = len(case.xn)

        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        dut.rst.value = 1
        dut.params.value = case.params       # the model: stable from before reset on
        dut.i__valid.value = 0
        dut.o__ready.value = 0
        resp_stall = tb_param("resp_stall", 0.15 if stall else 0.0, float)
        mem = WeightMemory(dut, case.image, cfg.hw.weight_port_bytes, cfg.hw.weight_port_latency,
                           req_stall=0.2 if stall else 0.0, resp_stall=resp_stall,
                           seed=rng.randrange(1 << 30)).start()
        for _ in range(3):
            await RisingEdge(dut.clk)
        await FallingEdge(dut.clk)
        dut.rst.value = 0

        sent = got = 0
        offering = False
        cycles = []
        # the unit does a part of the layer's token: the layer's roofline bounds it (tiny 902
        # cycles per token without stalls against a bound of 916; small 3386 against 3560)
        bound = roofline_cycles(cfg)
        limit, waited = cycle_limit(bound, T), 0
        while got < T:
            await FallingEdge(dut.clk)
            waited += 1
            if waited > limit:
                raise AssertionError(over_limit("KDA unit", got, T, waited, limit, bound))
            if not offering and sent < T and (not stall or rng.random() < 0.7):
                dut.i__payload.value = pack(case.xn[sent], a) | (int(case.first[sent]) << (d * a))
                offering = True
            dut.i__valid.value = int(offering)
            ready = not stall or rng.random() < 0.6
            dut.o__ready.value = int(ready)
            await ReadOnly()
            if offering and int(dut.i__ready.value):
                offering = False
                sent += 1
            if ready and int(dut.o__valid.value):
                out = unpack(int(dut.o__payload.value), d, a)
                want = [int(v) for v in case.want[got]]
                assert out == want, f"token {got}: RTL {out} != model {want}"
                cycles.append(int(dut.token_cycles.value))
                got += 1
        assert mem.idle(), "weight requests left unanswered"
        path = os.environ.get("KDA_CYCLES_OUT")
        if path:
            with open(path, "w") as f:
                f.write("\n".join(map(str, cycles)) + "\n")
        dut._log.info(f"{T} tokens bit-exact; token_cycles first {cycles[:3]} last {cycles[-3:]}; "
                      f"weight bytes {mem.counters.bytes}; cycles used {waited} of limit {limit}")
