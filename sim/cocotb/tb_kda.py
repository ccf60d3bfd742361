"""cocotb bench of the KDA unit (hw/kda/unit.py) against the integer model, bit for bit.

The RTL is the config's (hw/tops.py ``kda``, built by sim/cocotb_util.py): it
holds no model.  The case - config, weight image, the parameter bits driven
on ``params`` (hw/image/param_map.py ``region_value(cfg, qlayer.to_flat(), "kda")``),
input tokens, where sequences start, expected outputs - is made by
``kda_case`` in the pytest process from one quantised model and handed over
in one .npz file (KDA_CASE), so the parameters, the weights and the
expectations cannot come from two different versions of the model.  Inputs are realistic: residual-stream
tokens through the integer model's attention RMSNorm.

A model config (several layers on the one unit): ``model_kda_case`` makes the case
from one quantised model (model/cases.py ``quick_model``), its image
(model/image.py ``qmodel_image``: every layer's matrices at its own addresses),
one ``params`` value per layer, and per token its layer, in any order; each layer's
expected outputs come from ``int_kda_step`` with that layer's parameters and that
layer's own state, carried across the other layers' tokens.  The inputs are the
model's own: each layer's KDA input (``xn_unit``) from the integer model run on a
token sequence.  Optionally a reset in the middle of one token: the token is dropped,
and every layer's state starts from zero after it.

Checks: every output token equals the model's, and the unit's ``tokens`` counts them
(since the reset); stalls on the input stream,
the weight port (both directions) and back-pressure on the output when
KDA_STALL=1; the unit's ``token_cycles`` counter per token is written to
KDA_CYCLES_OUT (one number per line) for the constant-cost check.  The bench
drives ``layer`` with the token's layer when it offers the token and with a
random value as soon as the unit has taken it (the unit must have sampled it);
with several layers it changes ``params`` to the next token's layer only when no
token is inside the unit, a cycle before offering it.  The bench
waits at most sim/cocotb_util.py ``cycle_limit`` cycles for all outputs;
MOEKDA_RESP_STALL overrides the weight memory's response stall (1.0: it never
answers, how sim/tests/chip/test_bench_limits.py makes the unit hang).
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hw.image.memory_map import (build_image, layer_bits, layer_count, layer_mixer, memory_map, sequence_slots,
                                 slot_bits)
from hw.kda.unit import OPS
from hw.image.param_map import conv_taps_in_sram, region_value, tap_map
from moekda.config import config_from_dict, load_config
from moekda.formats import formats_for
from model.int_kda import IntKDAState, int_kda_step
from model.int_layer import quantize_input
from model.int_ops import int_rmsnorm
from model.params import random_inputs, random_params
from model.quantize import quantize_layer


@dataclass
class KdaCase:
    cfg: object
    qkda: object
    image: bytes
    params: list        # per layer: the bits of the ``params`` port (one on the layer chip)
    xn: np.ndarray      # (T, d) int8 unit inputs
    first: np.ndarray   # (T,) bool: a sequence starts at this token (for its layer)
    want: np.ndarray    # (T, d) int8 model outputs
    layer: np.ndarray = None    # (T,) the layer of each token (all 0 on the layer chip)
    reset_in: int = -1  # the token in whose middle the unit is reset (-1: none)
    slot: np.ndarray = None     # (T,) the sequence slot of each token (hw.sequences; all 0 for one)
    taps: bytes = b""   # the tap memory's words, when the taps live in SRAM (tap_image)

    def __post_init__(self):
        if self.layer is None:
            self.layer = np.zeros(len(self.xn), np.int64)
        if self.slot is None:
            self.slot = np.zeros(len(self.xn), np.int64)


def tap_image(cfg, flats: list) -> bytes:
    """The tap memory's contents (hw/image/param_map.py tap_map: every KDA layer's taps, in
    order) from each KDA layer's QLayer.to_flat(), or b"" when the taps are in the bank:
    what LOAD writes through ``tap_w``, one port beat a word."""
    if not conv_taps_in_sram(cfg):
        return b""
    return b"".join(tap_map(cfg).pack(flat) for flat in flats)


async def write_taps(dut, case) -> None:
    """LOAD's part the unit bench stands in for: the tap memory's words through ``tap_w``,
    one a cycle from a falling edge (nothing when the taps are in the bank)."""
    W = case.cfg.hw.weight_port_bytes
    for n in range(len(case.taps) // W):
        dut.tap_w__valid.value = 1
        dut.tap_w__addr.value = n
        dut.tap_w__data.value = int.from_bytes(case.taps[n * W:(n + 1) * W], "little")
        await FallingEdge(dut.clk)
    if case.taps:
        dut.tap_w__valid.value = 0


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
    return KdaCase(cfg, qp.kda, build_image(cfg, tensors, mm), [region_value(cfg, qp.to_flat(), "kda")],
                   xn, starts, want, taps=tap_image(cfg, [qp.to_flat()]))


def model_kda_case(config: str, seed: int, layers, first=(), reset_in: int = -1, slots=None) -> KdaCase:
    """The unit on a model config: token t of layer ``layers[t]`` and sequence slot
    ``slots[t]`` (default 0), a new sequence of that layer and slot where t is in ``first``;
    ``reset_in`` a token cut off by a reset (every state is zero after it).  Expected: per
    (slot, layer) its own IntKDAState."""
    from model.image import qmodel_image
    from model.int_model import int_run_model
    from model.params import random_tokens
    from model.cases import quick_model
    cfg = load_config(config)
    fm = formats_for(cfg)
    L = layer_count(cfg)
    _, qm = quick_model(cfg, seed)
    layers = np.asarray(layers, dtype=np.int64)
    T = len(layers)
    if layers.min() < 0 or layers.max() >= L:
        raise ValueError(f"layers {layers.tolist()}: {config} has {L}")
    S = sequence_slots(cfg)
    slots = np.zeros(T, np.int64) if slots is None else np.asarray(slots, dtype=np.int64)
    if len(slots) != T or slots.min() < 0 or slots.max() >= S:
        raise ValueError(f"slots {slots.tolist()}: one per token, 0 to {S - 1}")
    # each layer's own KDA inputs: the model's stack run over a token sequence
    traces: list = []
    int_run_model(qm, cfg, random_tokens(cfg, T, seed=seed + 1, model_seed=seed), traces=traces)
    xn = np.array([traces[t]["layers"][layers[t]]["xn_unit"] for t in range(T)], dtype=np.int64)
    starts = np.zeros(T, bool)
    starts[[f for f in first if f < T]] = True
    states = {}
    want = np.zeros_like(xn)
    for t in range(T):
        l, c = layers[t], (slots[t], layers[t])
        if starts[t] or c not in states:
            states[c] = IntKDAState.zeros(cfg)
        new, want[t] = int_kda_step(qm.layers[l].kda, cfg, fm, states[c], xn[t])
        if t == reset_in:
            states = {}
        else:
            states[c] = new
    params = [region_value(cfg, qm.layers[l].to_flat(), "kda", mixer=layer_mixer(cfg, l)) for l in range(L)]
    taps = tap_image(cfg, [qm.layers[l].to_flat() for l in range(L) if cfg.model.layers[l] == "kda"])
    return KdaCase(cfg, None, qmodel_image(cfg, qm), params, xn, starts, want, layers, reset_in, slots, taps)


def save_case(case: KdaCase, path) -> None:
    nbytes = max(1, max(-(-p.bit_length() // 8) for p in case.params))
    np.savez(path, config=case.cfg.source, xn=case.xn, first=case.first, want=case.want,
             layer=case.layer, reset_in=case.reset_in, slot=case.slot,
             image=np.frombuffer(case.image, dtype=np.uint8), taps=np.frombuffer(case.taps, dtype=np.uint8),
             params=np.array([np.frombuffer(p.to_bytes(nbytes, "little"), dtype=np.uint8) for p in case.params]))


def case_from_env() -> KdaCase:
    z = np.load(os.environ["KDA_CASE"])
    return KdaCase(load_config(str(z["config"])), None, z["image"].tobytes(),
                   [int.from_bytes(p.tobytes(), "little") for p in z["params"]], z["xn"], z["first"], z["want"],
                   z["layer"], int(z["reset_in"]), z["slot"] if "slot" in z.files else None, z["taps"].tobytes())


def unit_bound(cfg) -> float:
    """The roofline of the unit's work per token: the layer's (sim/cocotb_util.py
    roofline_cycles); on a model, that of the one-layer config of the same sizes, as the
    unit does one layer's KDA per token whichever layer it is."""
    from sim.cocotb_util import roofline_cycles
    if cfg.model.is_layer_chip:
        return roofline_cycles(cfg)
    raw = cfg.to_dict()
    for key in ("n_layers", "layers", "mixers", "vocab", "tie_embedding", "d_ff_dense"):
        raw["model"].pop(key, None)
    raw["hw"].pop("sequences", None)       # a layer chip runs one sequence
    return roofline_cycles(config_from_dict({**raw, "name": f"{cfg.name}-layer"}))


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

    from sim.cocotb.clocking import CLOCK_NS
    from sim.cocotb.weight_memory import WeightMemory
    from sim.cocotb_util import cycle_limit, over_limit, tb_param
except ImportError:        # imported by pytest for kda_case only
    cocotb = None

if cocotb is not None:
    @cocotb.test()
    async def kda_matches_model(dut):
        case = case_from_env()
        cfg = case.cfg
        stall = os.environ.get("KDA_STALL", "1") == "1"
        seed = int(os.environ.get("KDA_SEED", "0"))
        rng = random.Random(seed)
        noise = random.Random(seed + 7919)        # the layer port between acceptances
        d, a = cfg.model.d_model, formats_for(cfg).act_bits
        T = len(case.xn)
        per_layer = len(case.params) > 1
        layer_values = 1 << layer_bits(cfg)
        slot_values = 1 << slot_bits(cfg)

        def port_noise():
            """The layer and slot ports between acceptances: anything (the unit must not look)."""
            dut.layer.value = noise.randrange(layer_values)
            dut.slot.value = noise.randrange(slot_values)

        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
        dut.rst.value = 1
        dut.params.value = case.params[int(case.layer[0])]   # stable from before reset on
        if case.taps:
            dut.tap_w__valid.value = 0
        port_noise()
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
        await write_taps(dut, case)

        sent = got = 0
        offering = False
        params_of = int(case.layer[0])     # the layer whose block is on ``params``
        params_settled = True              # ... since at least one cycle
        reset_countdown = -1               # cycles from the reset token's acceptance to the reset
        just_taken = False
        cycles = []
        # the unit does a part of the layer's token: the layer's roofline bounds it (tiny 902
        # cycles per token without stalls against a bound of 916; small 3386 against 3560)
        bound = unit_bound(cfg)
        limit, waited = cycle_limit(bound, T), 0
        while got < T:
            await FallingEdge(dut.clk)
            waited += 1
            if waited > limit:
                raise AssertionError(over_limit("KDA unit", got, T, waited, limit, bound))
            if just_taken:
                # the unit took the token with its layer: from now on the port means nothing to it
                port_noise()
                just_taken = False
            if reset_countdown == 0:
                # the reset lands inside the token: it is dropped, and every layer starts anew
                assert got == case.reset_in == sent - 1, \
                    f"the reset was to land inside token {case.reset_in}: {got} out, {sent} in"
                reset_countdown = -1
                mem.stop()
                dut.rst.value = 1
                dut.i__valid.value = 0
                for _ in range(3):
                    await RisingEdge(dut.clk)
                await FallingEdge(dut.clk)
                dut.rst.value = 0
                mem.start()
                offering = False
                got += 1
                dut._log.info(f"reset inside token {case.reset_in} (layer {case.layer[case.reset_in]})")
                continue
            if reset_countdown > 0:
                reset_countdown -= 1
            nxt = int(case.layer[sent]) if sent < T else params_of
            if per_layer and not offering and sent < T and got == sent and nxt != params_of:
                # no token inside: the next token's layer block goes on ``params`` a cycle ahead
                dut.params.value = case.params[nxt]
                params_of, params_settled = nxt, False
            elif not offering and sent < T and params_settled and (not per_layer or got == sent) \
                    and (not stall or rng.random() < 0.7):
                dut.i__payload.value = pack(case.xn[sent], a) | (int(case.first[sent]) << (d * a))
                dut.layer.value = int(case.layer[sent])
                dut.slot.value = int(case.slot[sent])
                offering = True
            else:
                params_settled = True
            dut.i__valid.value = int(offering)
            ready = not stall or rng.random() < 0.6
            dut.o__ready.value = int(ready)
            await ReadOnly()
            if offering and int(dut.i__ready.value):
                offering = False
                if sent == case.reset_in:
                    reset_countdown = int(bound) // 2
                sent += 1
                just_taken = True
            if ready and int(dut.o__valid.value):
                out = unpack(int(dut.o__payload.value), d, a)
                want = [int(v) for v in case.want[got]]
                assert out == want, f"token {got} (layer {case.layer[got]}): RTL {out} != model {want}"
                if got != case.reset_in:
                    cycles.append(int(dut.token_cycles.value))
                got += 1
        assert mem.idle(), "weight requests left unanswered"
        # the unit's token count (it steps a cycle after each hand-over): the outputs since reset
        for _ in range(2):
            await RisingEdge(dut.clk)
        await ReadOnly()
        since = T - case.reset_in - 1 if case.reset_in >= 0 else T
        assert int(dut.tokens.value) == since, f"tokens = {int(dut.tokens.value)}, {since} outputs since reset"
        path = os.environ.get("KDA_CYCLES_OUT")
        if path:
            with open(path, "w") as f:
                f.write("\n".join(map(str, cycles)) + "\n")
        dut._log.info(f"{T} tokens bit-exact; token_cycles first {cycles[:3]} last {cycles[-3:]}; "
                      f"weight bytes {mem.counters.bytes}; cycles used {waited} of limit {limit}")
