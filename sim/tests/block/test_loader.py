"""LOAD (hw/chip/loader.py) in the Amaranth simulator: a good image fills the bank and sets
``loaded``; each kind of damage sets its error bit and leaves ``loaded`` low."""
import random

import pytest

from hw.image.format import VERSION, image_layout
from hw.chip.loader import ERR, ImageLoader
from hw.image.param_map import param_map, tap_words
from moekda.config import load_config
from sim.cocotb_util import sim_config
from model.image import qlayer_image, random_layer_image, with_word
from model.quantize import quantize_random_layer
from sim.pysim import simulate


def run_load(cfg, image: bytes, seed: int = 1, stall: float = 0.3, loads: int = 1):
    """Start ``loads`` LOADs of ``image`` (memory with random stalls); returns
    (loaded, errors, cycles, bank integer) after the last."""
    dut = ImageLoader(cfg)
    W = cfg.hw.weight_port_bytes
    rng = random.Random(seed)
    out = {"taps": {}}

    async def memory(ctx):
        queue = []
        while True:
            ctx.set(dut.wport.req.ready, rng.random() > stall)
            if ctx.get(dut.wport.req.valid) and ctx.get(dut.wport.req.ready):
                addr, nb = ctx.get(dut.wport.req.payload.addr), ctx.get(dut.wport.req.payload.beats)
                pending = [addr + W * b for b in range(nb)]
            else:
                pending = []
            if queue and rng.random() > stall:
                a = queue[0]
                chunk = image[a:a + W].ljust(W, b"\0")
                ctx.set(dut.wport.resp.valid, 1)
                ctx.set(dut.wport.resp.payload.data, int.from_bytes(chunk, "little"))
            else:
                ctx.set(dut.wport.resp.valid, 0)
            taken = ctx.get(dut.wport.resp.valid) and ctx.get(dut.wport.resp.ready)
            if dut.tap_words and ctx.get(dut.tap_w.valid):       # the tap memory's writes
                out["taps"][ctx.get(dut.tap_w.addr)] = ctx.get(dut.tap_w.data)
            await ctx.tick()
            if taken:
                queue.pop(0)
            queue += pending       # a request's beats come from the next cycle on

    async def bench(ctx):
        for _ in range(loads):
            await ctx.tick()
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            assert ctx.get(dut.busy) and not ctx.get(dut.loaded)   # busy from the cycle after start
            for _ in range(20 * len(image) // W + 200):     # bounded: a hung loader fails
                await ctx.tick()
                if not ctx.get(dut.busy):
                    break
            else:
                raise AssertionError("LOAD did not finish")
        out.update(loaded=ctx.get(dut.loaded), errors=ctx.get(dut.errors), cycles=ctx.get(dut.cycles),
                   bank=ctx.get(dut.bank.as_value()))

    simulate(dut, bench, background=[memory], period_s=1e-9)
    run_load.taps = out["taps"]          # {tap memory word: value} of the last LOAD's writes
    return out["loaded"], out["errors"], out["cycles"], out["bank"]


@pytest.fixture(scope="module")
def tiny():
    """The model at hand: tiny's, or MOEKDA_CONFIG's (`make sim CONFIG=x`)."""
    return random_layer_image(sim_config("tiny"), 7)


def test_good_image_fills_the_bank(tiny):
    cfg, q, img = tiny
    loaded, errors, cycles, bank = run_load(cfg, img, stall=0.0)
    assert (loaded, errors) == (1, 0)
    lay = image_layout(cfg)
    # the bank: the layer's block; before it, with the taps in SRAM, the taps' words, each
    # written once into the tap memory, in order
    W, taps = cfg.hw.weight_port_bytes, tap_words(cfg)
    bank_at = lay.params_addr + W * taps
    assert bank == int.from_bytes(img[bank_at:lay.params_addr + lay.params_bytes], "little") \
        & ((1 << param_map(cfg).bits) - 1)
    assert run_load.taps == {n: int.from_bytes(img[lay.params_addr + W * n:lay.params_addr + W * (n + 1)], "little")
                             for n in range(taps)}
    # every beat once, plus the request, the latency of this memory and the checksum drain
    assert lay.beats <= cycles <= lay.beats + 30


@pytest.mark.parametrize("damage,bits", [
    (lambda img: with_word(img, 0, 0), ERR["MAGIC"] | ERR["CHECKSUM"]),
    (lambda img: with_word(img, 4, VERSION + 1), ERR["VERSION"] | ERR["CHECKSUM"]),
    (lambda img: with_word(img, 8, 0x1234), ERR["CONFIG_HASH"] | ERR["CHECKSUM"]),
    (lambda img: with_word(img, 12, len(img) - 4), ERR["LENGTH"] | ERR["CHECKSUM"]),
    (lambda img: img[:2000] + bytes([img[2000] ^ 4]) + img[2001:], ERR["CHECKSUM"]),   # a parameter byte
    (lambda img: img[:-64], ERR["CHECKSUM"]),                                           # truncated
])
def test_damaged_image_is_refused(tiny, damage, bits):
    cfg, _, img = tiny
    loaded, errors, _, _ = run_load(cfg, damage(img), seed=3)
    assert loaded == 0 and errors == bits


def test_a_good_load_after_a_bad_one(tiny):
    cfg, _, img = tiny
    # two LOADs of the good image with stalls: the second starts from a clean state
    loaded, errors, _, _ = run_load(cfg, img, seed=5, loads=2)
    assert (loaded, errors) == (1, 0)


@pytest.mark.parametrize("port", [2, 16])
def test_other_port_widths(port):
    from dataclasses import replace
    base = load_config(sim_config("tiny"))
    cfg = replace(base, hw=replace(base.hw, lanes=port, weight_port_bytes=port))
    img = qlayer_image(cfg, quantize_random_layer(cfg, 1))
    loaded, errors, _, _ = run_load(cfg, img, seed=2)
    assert (loaded, errors) == (1, 0)
    loaded, errors, _, _ = run_load(cfg, with_word(img, 0, 1), seed=2)
    assert errors == ERR["MAGIC"] | ERR["CHECKSUM"]
