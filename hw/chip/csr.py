"""Control and status registers of the layer chip, on a Wishbone classic bus.

The bus (``WishboneSignature``, built with amaranth.lib.wiring: PyPI's
amaranth-soc is only a name placeholder) is 32 bits wide and word addressed:
``adr`` is the register number, byte address = 4 * adr.  Every access is
acknowledged one cycle after ``cyc & stb`` (registered ack, no wait states,
no errors); reads of an unmapped register return 0, writes to a read-only
register are ignored.

The register map is ``REGISTERS`` (one source: the RTL decodes it, the
driver and docs/chip.md read it):

==== ============== == ======================================================
word name           rw meaning
==== ============== == ======================================================
0x00 ID             r  0x4D4B4441 ("MKDA")
0x01 CTRL           rw bit0 RUN: the chip takes input tokens only while set
                       (reset 0); bit1 CLEAR (write 1): the next token starts
                       a new sequence - the KDA state and short-convolution
                       history are cleared before it; reads 1 until then;
                       bit2 COUNTERS_RESET (write 1): zero every counter;
                       bit3 LOAD (write 1): read the memory image into the
                       parameter bank (hw/chip/loader.py), as soon as no token is
                       inside; the next token starts a new sequence; bit4 LOGITS
                       (the model chip): every logit goes out on the ``logits``
                       stream too, which then holds the chip until it is read
                       (reset 0: the stream stays idle and never stalls)
0x02 STATUS         r  bit0 BUSY (a token is inside), bit1 CLEAR pending,
                       bit2 input token waiting (i.valid), bit3 output token
                       waiting (o.valid), bit4 LOADING (LOAD asked or
                       running), bit5 LOADED (the last LOAD was good: tokens
                       are taken only while set), bit6 LOAD_ERROR
0x03 CYCLES         r  clock cycles since reset / counter reset
0x04 BUSY_CYCLES    r  cycles with a token inside the chip
0x05 TOKENS         r  tokens delivered on the output stream
0x06 MACS           r  int8 multiply-accumulates done: LANES per beat the matrix-vector
                       engines (KDA's, MLA's, MoE's, the head's) take, counted from their ``beat``
                       outputs (padding lanes of a row included: per token
                       MACS_PER_TOKEN + the padding lanes, hw/chip/layer.py
                       engine_macs_per_token)
0x07 WEIGHT_BYTES   r  bytes received on the weight port
0x08 TOKEN_CYCLES   r  cycles the last token took, input accepted to output offered
0x09 MACS_PER_TOKEN r  weight elements used per token (analytic, hw/chip/layer.py
                       macs_per_token; MACS grows by this plus the padding lanes)
0x0A LOAD_CYCLES    r  cycles the last LOAD took
0x0B LOAD_ERRORS    r  what the last LOAD found wrong, one bit each
                       (hw/chip/loader.py LOAD_ERRORS): bit0 MAGIC, bit1 VERSION,
                       bit2 CONFIG_HASH, bit3 LENGTH, bit4 CHECKSUM
0x0C IMAGE_BYTES    r  the image length this chip expects
0x0D FETCH_CYCLES   r  model chip: cycles with a FETCH of a parameter half in flight
0x0E LAYER_CYCLES   r  model chip: cycles with a token in the layer datapath
0x0F HEAD_CYCLES    r  model chip: cycles with a token in the head (LM head, argmax)
0x10 D_MODEL ...    r  configuration read-back: D_MODEL, N_HEADS, HEAD_DIM,
     0x1C              N_EXPERTS, TOP_K, D_FF, N_SHARED, GATE_RANK,
                       PORT_BYTES, LANES, CONFIG_HASH (first 8 hex digits of
                       the config hash), N_LAYERS, VOCAB
==== ============== == ======================================================

Counters are 32 bits and wrap.
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.arith.counter import ChunkedCounter

ADDR_BITS = 6
DATA_BITS = 32
CHIP_ID = 0x4D4B4441

CTRL_RUN, CTRL_CLEAR, CTRL_COUNTERS_RESET, CTRL_LOAD, CTRL_LOGITS = 1, 2, 4, 8, 16
STATUS_BITS = ("BUSY", "CLEAR_PENDING", "IN_WAITING", "OUT_WAITING", "LOADING", "LOADED", "LOAD_ERROR")
STATUS = {name: 1 << n for n, name in enumerate(STATUS_BITS)}

COUNTERS = ("CYCLES", "BUSY_CYCLES", "TOKENS", "MACS", "WEIGHT_BYTES", "TOKEN_CYCLES")
# the model chip's phase counters (hw/chip/model.py): cycles spent fetching layer parameter
# blocks, in the layers, and in the head, summed over tokens (per layer: / (TOKENS x N_LAYERS))
STAGE_COUNTERS = ("FETCH_CYCLES", "LAYER_CYCLES", "HEAD_CYCLES")
CONFIG_FIELDS = (("D_MODEL", "model.d_model"), ("N_HEADS", "model.n_heads"), ("HEAD_DIM", "model.head_dim"),
                 ("N_EXPERTS", "model.n_experts"), ("TOP_K", "model.top_k"), ("D_FF", "model.d_ff"),
                 ("N_SHARED", "model.n_shared"), ("GATE_RANK", "model.gate_rank"),
                 ("PORT_BYTES", "hw.weight_port_bytes"), ("LANES", "hw.lanes"))

REGISTERS: dict[str, int] = {"ID": 0x00, "CTRL": 0x01, "STATUS": 0x02,
                             **{name: 0x03 + n for n, name in enumerate(COUNTERS)},
                             "MACS_PER_TOKEN": 0x09, "LOAD_CYCLES": 0x0A, "LOAD_ERRORS": 0x0B,
                             "IMAGE_BYTES": 0x0C,
                             **{name: 0x0D + n for n, name in enumerate(STAGE_COUNTERS)},
                             **{name: 0x10 + n for n, (name, _) in enumerate(CONFIG_FIELDS)},
                             "CONFIG_HASH": 0x10 + len(CONFIG_FIELDS),
                             # after CONFIG_HASH, so the layer chip's map is unchanged
                             "N_LAYERS": 0x11 + len(CONFIG_FIELDS), "VOCAB": 0x12 + len(CONFIG_FIELDS)}


def config_words(cfg) -> dict[str, int]:
    """The configuration read-back registers' values for ``cfg``."""
    out = {}
    for name, path in CONFIG_FIELDS:
        section, field = path.split(".")
        out[name] = int(getattr(getattr(cfg, section), field))
    out["CONFIG_HASH"] = int(cfg.hash()[:8], 16)
    out["N_LAYERS"], out["VOCAB"] = int(cfg.model.n_layers), int(cfg.model.vocab)
    return out


class WishboneSignature(wiring.Signature):
    """Wishbone B4 classic, initiator side (the chip uses it flipped: ``In``)."""

    def __init__(self, addr_bits: int = ADDR_BITS, data_bits: int = DATA_BITS):
        self.addr_bits, self.data_bits = addr_bits, data_bits
        super().__init__({
            "cyc": Out(1), "stb": Out(1), "we": Out(1),
            "adr": Out(addr_bits), "dat_w": Out(data_bits), "sel": Out(data_bits // 8),
            "dat_r": In(data_bits), "ack": In(1),
        })

    def __eq__(self, other):
        return (isinstance(other, WishboneSignature) and other.addr_bits == self.addr_bits
                and other.data_bits == self.data_bits)

    def __hash__(self):
        return hash(("WishboneSignature", self.addr_bits, self.data_bits))


class LayerCsr(wiring.Component):
    """The register file and the performance counters.

    Events in (one cycle each): ``ev_busy`` (a token is inside this cycle),
    ``ev_token`` (a token left), ``ev_beat`` (a weight-port beat arrived),
    ``ev_mac`` (one bit per matrix-vector engine: it took a beat of ``lanes`` MACs),
    ``token_cycles`` (latency of the last token, from the top).  Controls out:
    ``run`` (level), ``clear`` (one-cycle pulse on a CLEAR write); the top
    keeps the clear pending and reports it back on ``clear_pending``.
    """

    def __init__(self, cfg, macs_per_token: int, image_bytes: int, engines: int = 2, stages: bool = False,
                 mac_rate: int = 1):
        self.cfg, self.macs_per_token = cfg, int(macs_per_token)
        self.lanes, self.engines = cfg.hw.lanes, engines
        # the engines' sustained beats per cycle: one per memory port that feeds an engine
        # (2 on a chip with an MLA latent cache port beside the weight port)
        if mac_rate not in (1, 2):
            raise ValueError(f"mac_rate {mac_rate}: the MACS counter takes 1 or 2 beats a cycle")
        self.mac_rate = mac_rate
        self.port_bytes = cfg.hw.weight_port_bytes
        self.constants = {"ID": CHIP_ID, "MACS_PER_TOKEN": self.macs_per_token, "IMAGE_BYTES": int(image_bytes),
                          **config_words(cfg)}
        for name, value in self.constants.items():
            if not 0 <= value < 1 << DATA_BITS:
                raise ValueError(f"CSR {name} = {value} does not fit {DATA_BITS} bits")
        self.stages = stages
        super().__init__({
            **({"ev_fetch": In(1), "ev_layer": In(1), "ev_head": In(1)} if stages else {}),
            "bus": In(WishboneSignature()),
            "run": Out(1), "clear": Out(1), "load": Out(1), "logits_en": Out(1),
            "clear_pending": In(1), "busy": In(1), "in_waiting": In(1), "out_waiting": In(1),
            "loading": In(1), "loaded": In(1), "load_errors": In(8), "load_cycles": In(32),
            "ev_token": In(1), "ev_beat": In(1), "ev_mac": In(engines), "token_cycles": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        # chunked counters (hw/arith/counter.py): a 32-bit add in one cycle does not fit the clock
        steps = {"CYCLES": 1, "BUSY_CYCLES": 1, "TOKENS": 1, "MACS": self.lanes,
                 "WEIGHT_BYTES": self.port_bytes, **({n: 1 for n in STAGE_COUNTERS} if self.stages else {})}
        counters = {name: ChunkedCounter(DATA_BITS, step, name=name.lower(),
                                         step2=2 * step if name == "MACS" and self.mac_rate == 2 else None)
                    for name, step in steps.items()}
        run, logits = Signal(), Signal()
        m.d.comb += [self.run.eq(run), self.logits_en.eq(logits)]

        zero = Signal()
        # MACS: the engines' beats, at most ``mac_rate`` counts of ``lanes`` per cycle.  Every
        # engine beat is a beat of a memory port (the weight port, or an MLA layer's cache
        # port), so more engines than ports rarely beat in one cycle; when they do, the extra
        # beats wait in ``owed`` and are counted in the following cycles (nothing is lost
        # while the average is <= mac_rate and no more than 63 are owed at once)
        owed = Signal(range(64))
        beats = Signal(range(64 + self.engines))
        m.d.comb += beats.eq(sum(self.ev_mac[n] for n in range(self.engines)) + owed)
        mac_inc = Signal()
        m.d.comb += mac_inc.eq(beats != 0)
        taken = Const(1)
        if self.mac_rate == 2:
            m.d.comb += counters["MACS"].inc2.eq(beats >= 2)
            taken = Mux(beats >= 2, 2, 1)
        with m.If(zero):
            m.d.sync += owed.eq(0)
        with m.Elif(mac_inc):
            m.d.sync += owed.eq(beats - taken)
        events = {"CYCLES": 1, "BUSY_CYCLES": self.busy, "TOKENS": self.ev_token, "MACS": mac_inc,
                  "WEIGHT_BYTES": self.ev_beat}
        if self.stages:
            events.update({"FETCH_CYCLES": self.ev_fetch, "LAYER_CYCLES": self.ev_layer, "HEAD_CYCLES": self.ev_head})
        for name, counter in counters.items():
            m.d.comb += counter.inc.eq(events[name])
            counter.load(zero, 0)
            counter.elaborate(m)
        counters = {name: c.value for name, c in counters.items()}

        readable = {REGISTERS[name]: sig for name, sig in counters.items()}
        readable[REGISTERS["TOKEN_CYCLES"]] = self.token_cycles
        readable[REGISTERS["LOAD_CYCLES"]] = self.load_cycles
        readable[REGISTERS["LOAD_ERRORS"]] = self.load_errors
        readable[REGISTERS["CTRL"]] = run | (self.clear_pending << 1) | (self.loading << 3) | (logits << 4)
        status = {"BUSY": self.busy, "CLEAR_PENDING": self.clear_pending, "IN_WAITING": self.in_waiting,
                  "OUT_WAITING": self.out_waiting, "LOADING": self.loading, "LOADED": self.loaded,
                  "LOAD_ERROR": self.load_errors.any()}
        readable[REGISTERS["STATUS"]] = Cat(*(status[name] for name in STATUS_BITS))
        for name, value in self.constants.items():
            readable[REGISTERS[name]] = value

        # classic cycle, registered ack: one access every other cycle at most
        access = bus.cyc & bus.stb & ~bus.ack
        m.d.sync += bus.ack.eq(access)
        with m.If(access):
            m.d.sync += bus.dat_r.eq(0)
            with m.Switch(bus.adr):
                for addr, value in readable.items():
                    with m.Case(addr):
                        m.d.sync += bus.dat_r.eq(value)
            with m.If(bus.we & bus.sel[0] & (bus.adr == REGISTERS["CTRL"])):
                m.d.sync += [run.eq(bus.dat_w[0]), logits.eq(bus.dat_w[4])]
                m.d.comb += [self.clear.eq(bus.dat_w[1]), zero.eq(bus.dat_w[2]), self.load.eq(bus.dat_w[3])]
        return m
