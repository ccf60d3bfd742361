"""cocotb bench of the Gated MLA unit (hw/mla/unit.py) against the integer model, bit for bit.

The case - config, weight image, the ``params`` bits of each MLA layer, the inputs, where
sequences start, the expected outputs - is made in the pytest process by ``mla_case`` from
one quantised model and handed over in one .npz file (MOEKDA_CASE).  The inputs are the
model's own: each MLA layer's ``xn_unit`` from the integer model run on a token sequence
(model/int_model.py); the expectations are ``int_mla_step`` with each (slot, layer)'s
own cache, restarted where ``first`` is set and dropped by a reset.  The bench gives each
token's position in its cache on ``pos``.  ``long_mla_case``: one long sequence whose first
tokens' latents the bench writes into the cache memory before the run (a host restoring a
saved cache), so the unit's tokens attend over a 4096-row cache in a few thousand cycles.

The bench drives the unit's two memories: the weight memory (sim/cocotb/weight_memory.py)
and a cache memory (``CacheMemory`` below: the same read timing, plus writes), both with
random stalls when MOEKDA_STALL=1, and back-pressure on ``o``.  ``layer``, ``slot`` and ``pos``
carry noise between acceptances.  A reset inside token ``reset_in`` drops that token; the
sequences start again after it (position 0: the memory's stale rows must not be read).
Checks: every output, the unit's ``tokens`` count, and that the cache memory holds each
written latent at its address (hw/mla/cache.py ``cache_address``).  Writes the
``token_cycles`` of each token to MOEKDA_CYCLES_OUT.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass

import numpy as np

from hw.image.memory_map import layer_bits, slot_bits
from hw.image.param_map import region_value
from hw.mla.cache import cache_address, cache_bytes, cache_context, mla_layers
from moekda.config import load_config
from moekda.formats import formats_for


@dataclass
class MlaCase:
    cfg: object
    image: bytes
    params: dict        # model layer -> the bits of its ``params`` value
    xn: np.ndarray      # (T, d) int8 unit inputs
    first: np.ndarray   # (T,) bool
    want: np.ndarray    # (T, d) int8 model outputs
    layer: np.ndarray   # (T,) the model layer of each token (an MLA layer)
    slot: np.ndarray    # (T,) its sequence slot
    latents: np.ndarray  # (T, r) int8: the latent each token appends to its cache
    pos: np.ndarray     # (T,) its position in its cache
    reset_in: int = -1
    prefill: int = 0    # tokens 0 .. prefill-1 are not run: their latents are written into the cache


def mla_case(config: str, seed: int, layers, slots, first=(), reset_in: int = -1) -> MlaCase:
    """Token t of MLA layer ``layers[t]`` in sequence slot ``slots[t]``; a new sequence of
    that (slot, layer) where t is in ``first`` (and at its first token)."""
    from model.image import qmodel_image
    from model.int_mla import IntMLACache, int_mla_step
    from model.int_model import int_run_model
    from model.params import random_tokens
    from model.cases import quick_model
    cfg = load_config(config)
    fm = formats_for(cfg)
    _, qm = quick_model(cfg, seed)
    layers, slots = np.asarray(layers, np.int64), np.asarray(slots, np.int64)
    T = len(layers)
    bad = [int(l) for l in layers if int(l) not in mla_layers(cfg)]
    if bad:
        raise ValueError(f"layers {bad}: not MLA layers of {config} ({mla_layers(cfg)})")
    traces: list = []
    int_run_model(qm, cfg, random_tokens(cfg, T, seed=seed + 1, model_seed=seed), traces=traces)
    xn = np.array([traces[t]["layers"][layers[t]]["xn_unit"] for t in range(T)], dtype=np.int64)
    starts = np.zeros(T, bool)
    starts[[f for f in first if f < T]] = True
    caches: dict = {}
    want, latents, pos = np.zeros_like(xn), np.zeros((T, cfg.model.kv_rank), np.int64), np.zeros(T, np.int64)
    for t in range(T):
        key = (int(slots[t]), int(layers[t]))
        if starts[t] or key not in caches:
            caches[key] = IntMLACache()
            starts[t] = True
        pos[t] = len(caches[key].latents)
        new, want[t] = int_mla_step(qm.layers[layers[t]].mla, cfg, fm, caches[key], xn[t])
        latents[t] = new.latents[-1]
        caches[key] = new
        if t == reset_in:
            caches = {}
    params = {l: region_value(cfg, qm.layers[l].to_flat(), "mla", mixer=cfg.model.mixers[l], kind="mla")
              for l in mla_layers(cfg)}
    return MlaCase(cfg, qmodel_image(cfg, qm), params, xn, starts, want, layers, slots, latents, pos, reset_in)


def long_mla_case(config: str, seed: int, context: int, run: int = 2, run_at=None) -> MlaCase:
    """One sequence of ``context`` tokens on the last MLA layer, slot 0: the tokens at the
    positions ``run_at`` (default the last ``run``) are run, every other token's latent is
    prefilled (the token at position p attends over p + 1 rows, its own included; a run
    token's row is written again by the unit, with the same latent).  Inputs: the layer's
    RMSNorm of residual-stream-like vectors (model/params.py random_inputs), as the
    KDA bench's; the integer model gives every latent and the run tokens' outputs."""
    from model.image import qmodel_image
    from model.int_layer import quantize_input
    from model.int_mla import IntMLACache, int_mla_latent, int_mla_step
    from model.int_ops import int_rmsnorm
    from model.params import random_inputs
    from model.cases import quick_model
    cfg = load_config(config)
    fm = formats_for(cfg)
    _, qm = quick_model(cfg, seed)
    l = mla_layers(cfg)[-1]
    q = qm.layers[l]
    x = quantize_input(random_inputs(cfg, context, seed=seed + 1, model_seed=seed), q, cfg)
    xn = int_rmsnorm(x, q.attn_norm, fm)
    T = context
    run_set = set(range(T - run, T) if run_at is None else (int(p) for p in run_at))
    runs = sorted(run_set)
    if not runs or runs[0] < 0 or runs[-1] >= T:
        raise ValueError(f"run_at {run_at}: positions 0 to {T - 1}")
    want, latents = np.zeros_like(xn), np.zeros((T, cfg.model.kv_rank), np.int64)
    cache = IntMLACache()
    for t in range(T):
        if t in run_set:
            new, want[t] = int_mla_step(q.mla, cfg, fm, cache, xn[t])
            latent = new.latents[-1]
        else:
            latent = int_mla_latent(q.mla, fm, xn[t])[1]
        cache = IntMLACache(cache.latents + [latent])
        latents[t] = latent
    # the case's entries: the prefilled positions, then the run ones in order
    order = np.array([t for t in range(T) if t not in run_set] + runs, np.int64)
    starts = np.zeros(T, bool)
    starts[0] = True
    params = {l: region_value(cfg, q.to_flat(), "mla", mixer=cfg.model.mixers[l], kind="mla")}
    return MlaCase(cfg, qmodel_image(cfg, qm), params, xn[order], starts, want[order], np.full(T, l),
                   np.zeros(T, np.int64), latents[order], order, -1, T - len(runs))


def run_mla_case(config: str, case: MlaCase, stall: bool = True, seed: int = 0, name: str = "run",
                 simulator: str = "icarus") -> list[int]:
    """Simulate ``case`` on the config's MLA unit (the ``mla`` top); the run tokens'
    token_cycles, in the case's order.  Raises if any output or cache row differs."""
    from moekda.config import REPO_ROOT
    from sim.cocotb_util import run_cocotb
    run_dir = REPO_ROOT / "build" / load_config(config).name / "sim" / "mla" / "cases"
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{name}.npz"
    save_case(case, path)
    cycles = run_dir / f"{name}.cycles"
    run_cocotb("mla", config, "sim.cocotb.tb_mla", simulator=simulator, test_name=name,
               env={"MOEKDA_CASE": path, "MOEKDA_STALL": int(stall), "MOEKDA_SEED": seed,
                    "MOEKDA_CYCLES_OUT": cycles})
    return [int(v) for v in cycles.read_text().split()]


def save_case(case: MlaCase, path) -> None:
    ls = sorted(case.params)
    nbytes = max(1, max(-(-case.params[l].bit_length() // 8) for l in ls))
    np.savez(path, config=case.cfg.source, xn=case.xn, first=case.first, want=case.want, layer=case.layer,
             slot=case.slot, latents=case.latents, pos=case.pos, reset_in=case.reset_in, prefill=case.prefill,
             image=np.frombuffer(case.image, dtype=np.uint8), param_layers=np.array(ls),
             params=np.array([np.frombuffer(case.params[l].to_bytes(nbytes, "little"), dtype=np.uint8) for l in ls]))


def case_from_env() -> MlaCase:
    z = np.load(os.environ["MOEKDA_CASE"])
    params = {int(l): int.from_bytes(p.tobytes(), "little") for l, p in zip(z["param_layers"], z["params"])}
    return MlaCase(load_config(str(z["config"])), z["image"].tobytes(), params, z["xn"], z["first"], z["want"],
                   z["layer"], z["slot"], z["latents"], z["pos"], int(z["reset_in"]), int(z["prefill"]))


def mla_bound(cfg, context: int) -> float:
    """The unit's roofline per token at ``context`` cached positions: its weight beats plus
    H rb (context + 1) score beats (one engine beat a cycle)."""
    from hw.mla.cache import row_beats
    from hw.mla.unit import OPS
    from hw.image.memory_map import layer_prefix, memory_map
    mm = memory_map(cfg)
    l = mla_layers(cfg)[0]
    weights = sum(mm[layer_prefix(cfg, l) + t].beats for _, t, _, _ in OPS)
    return weights + cfg.model.n_heads * row_beats(cfg) * (context + 1)


try:
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

    from sim.cocotb.clocking import CLOCK_NS
    from sim.cocotb.tb_kda import pack, unpack
    from sim.cocotb.weight_memory import WeightMemory
    from sim.cocotb_util import cycle_limit, over_limit, tb_param
except ImportError:        # imported by pytest for mla_case only
    cocotb = None

if cocotb is not None:
    class CacheMemory(WeightMemory):
        """The cache memory: WeightMemory's reads over a writable image, plus the ``wr``
        stream (single beats; applied when accepted, so a later read sees them)."""

        def __init__(self, dut, size: int, port_bytes: int, latency: int, write_stall: float = 0.0, **kw):
            super().__init__(dut, bytes(size), port_bytes, latency, prefix="cport", **kw)
            self.image = bytearray(size)
            self.wr_valid, self.wr_ready = dut.cport__wr__valid, dut.cport__wr__ready
            self.wr_payload = dut.cport__wr__payload
            self.write_stall = write_stall
            self.writes = 0

        def start(self):
            self.wr_ready.value = 0
            self._wtask = cocotb.start_soon(self._writes())
            return super().start()

        def stop(self):
            self._wtask.cancel()
            self.wr_ready.value = 0
            super().stop()

        async def _writes(self):
            while True:
                await FallingEdge(self.clk)
                take = self.rng.random() >= self.write_stall
                self.wr_ready.value = int(take)
                await ReadOnly()
                if take and int(self.wr_valid.value):
                    word = int(self.wr_payload.value)
                    addr = word & 0xFFFF_FFFF
                    if addr % self.port_bytes or addr + self.port_bytes > len(self.image):
                        raise AssertionError(f"cache port: write at {addr:#x} unaligned or beyond the memory")
                    self.image[addr:addr + self.port_bytes] = (word >> 32).to_bytes(self.port_bytes, "little")
                    self.writes += 1

    @cocotb.test()
    async def mla_matches_model(dut):
        case = case_from_env()
        cfg = case.cfg
        fm = formats_for(cfg)
        stall = tb_param("stall", "1") == "1"
        rng = random.Random(int(tb_param("seed", "0")))
        noise = random.Random(rng.randrange(1 << 30))
        d, a, r, W = cfg.model.d_model, fm.act_bits, cfg.model.kv_rank, cfg.hw.weight_port_bytes
        T = len(case.xn)

        def port_noise():
            dut.layer.value = noise.randrange(1 << layer_bits(cfg))
            dut.slot.value = noise.randrange(1 << slot_bits(cfg))
            dut.pos.value = noise.randrange(1 << fm.mla_context_bits)

        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
        dut.rst.value = 1
        dut.params.value = case.params[int(case.layer[0])]
        port_noise()
        dut.i__valid.value = 0
        dut.o__ready.value = 0
        kw = dict(req_stall=0.2 if stall else 0.0, resp_stall=0.15 if stall else 0.0)
        wmem = WeightMemory(dut, case.image, W, cfg.hw.weight_port_latency, seed=rng.randrange(1 << 30),
                            **kw).start()
        cmem = CacheMemory(dut, cache_bytes(cfg), W, cfg.hw.weight_port_latency, seed=rng.randrange(1 << 30),
                           write_stall=0.3 if stall else 0.0, **kw).start()
        for t in range(case.prefill):       # the host restores the sequence's cache
            addr = cache_address(cfg, cache_context(cfg, int(case.slot[t]), int(case.layer[t])), int(case.pos[t]))
            cmem.image[addr:addr + r] = (case.latents[t] & 0xFF).astype(np.uint8).tobytes()
        for _ in range(3):
            await RisingEdge(dut.clk)
        await FallingEdge(dut.clk)
        dut.rst.value = 0

        sent = got = case.prefill
        waited = 0
        offering = just_taken = False
        params_of, params_settled = int(case.layer[0]), True
        reset_countdown = -1
        cycles = []
        bound = mla_bound(cfg, int(case.pos.max()))
        limit = cycle_limit(bound, T - case.prefill)
        while got < T:
            await FallingEdge(dut.clk)
            waited += 1
            if waited > limit:
                raise AssertionError(over_limit("MLA unit", got, T, waited, limit, bound))
            if just_taken:
                port_noise()
                just_taken = False
            if reset_countdown == 0:
                assert got == case.reset_in == sent - 1, f"the reset was to land inside token {case.reset_in}"
                reset_countdown = -1
                wmem.stop()
                cmem.stop()
                dut.rst.value = 1
                dut.i__valid.value = 0
                for _ in range(3):
                    await RisingEdge(dut.clk)
                await FallingEdge(dut.clk)
                dut.rst.value = 0
                wmem.start()
                cmem.start()
                offering = False
                got += 1
                continue
            if reset_countdown > 0:
                reset_countdown -= 1
            nxt = int(case.layer[sent]) if sent < T else params_of
            if not offering and sent < T and got == sent and nxt != params_of:
                dut.params.value = case.params[nxt]     # no token inside: the next layer's values
                params_of, params_settled = nxt, False
            elif not offering and sent < T and params_settled and got == sent and (not stall or rng.random() < 0.7):
                dut.i__payload.value = pack(case.xn[sent], a)
                dut.layer.value = int(case.layer[sent])
                dut.slot.value = int(case.slot[sent])
                dut.pos.value = int(case.pos[sent])
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
                assert out == want, (f"token {got} (layer {case.layer[got]}, slot {case.slot[got]}, position "
                                     f"{case.pos[got]}): RTL {out} != model {want}")
                cycles.append(int(dut.token_cycles.value))
                got += 1
        assert wmem.idle() and cmem.idle(), "memory requests left unanswered"
        for _ in range(2):
            await RisingEdge(dut.clk)
        await ReadOnly()
        since = T - case.reset_in - 1 if case.reset_in >= 0 else T - case.prefill
        assert int(dut.tokens.value) == since, f"tokens = {int(dut.tokens.value)}, {since} outputs since reset"
        # every completed token's latent is in the cache memory at its row
        for t in range(case.prefill, T):
            if t == case.reset_in:
                continue
            ctx = cache_context(cfg, int(case.slot[t]), int(case.layer[t]))
            addr = cache_address(cfg, ctx, int(case.pos[t]))
            row = np.frombuffer(bytes(cmem.image[addr:addr + r]), dtype=np.int8).astype(np.int64)
            later = [u for u in range(t + 1, T) if u != case.reset_in and case.slot[u] == case.slot[t]
                     and case.layer[u] == case.layer[t] and case.pos[u] == case.pos[t]]
            if not later:
                assert row.tolist() == case.latents[t].tolist(), f"token {t}: cache row {row} != {case.latents[t]}"
        path = tb_param("cycles_out")
        if path:
            with open(path, "w") as f:
                f.write("\n".join(map(str, cycles)) + "\n")
        dut._log.info(f"{T - case.prefill} tokens bit-exact (positions up to {case.pos.max()}); token_cycles {cycles[:4]} .. {cycles[-4:]}; weight bytes "
                      f"{wmem.counters.bytes}, cache bytes read {cmem.counters.bytes}, beats written {cmem.writes}; "
                      f"cycles used {waited} of limit {limit}")
