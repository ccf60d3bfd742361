"""LOAD: the chip reads its memory image once, checks it, and fills the parameter bank.

Started by a CSR write (CTRL.LOAD) while no token is inside.  The loader
reads the whole image (hw/image/format.py) through the weight port, in the
port's own request order, one beat per cycle when the memory keeps up:

* the header's first four words are compared with the chip's constants:
  MAGIC, VERSION, CONFIG_HASH (this config's) and LENGTH (this config's
  image length); a difference sets its bit in ``errors``;
* every 32-bit word of the image is summed (carry-save, resolved at the
  end): a good image sums to 0 modulo 2**32, anything else sets ERR_CHECKSUM
  (a truncated image reads as whatever the memory holds past its end, which
  fails here too);
* the parameter region's beats are shifted into the bank register: after
  the region's last beat its first byte is the bank's bit 0, as
  hw/image/param_map.py packs it, so every block reads its fields from a fixed
  slice (no address decoder, one flip-flop with enable per bit);
* with the short convolutions' taps in SRAM (param_map ``conv_taps_in_sram``) the
  region's first ``tap_words`` beats are the tap memory's words: each goes out on
  ``tap_w`` (registered) in order, and the bank's shift starts after them.

On a model (hw/chip/model.py) the bank holds ONE layer's parameter block (every
layer's block has one size, hw/image/param_map.py layer_block_bytes), in two halves
that change on their own: the token mixer's (bits [0, split), hw/image/param_map.py
mixer_split_bit: what the datapath's stage A reads) and the channel mixer's (the rest:
stage B's), so one half can change for the next layer while the other stage still
works on this one.  LOAD leaves layer 0's block in both halves and the head's block in
its own bank (``head_params``); FETCH (``fetch`` strobe with ``fetch_layer`` and
``fetch_half``, while idle) reads one half of a layer's block, one request of the beats
that hold it, into that half the same way, with no checks (the image was checked by
LOAD).  A half is whole beats of the image: the beat the split falls in belongs to both
and is read by both FETCHes; each half register keeps only its own bits (the other
half's bits of that beat have no reader and are no flip-flops).  ``busy`` covers both;
``fetching`` is high from the cycle after the strobe until the half is in place.

``loaded`` is high after a LOAD with no error and stays high until the next
LOAD starts (or reset); the layer takes tokens only while it is high.
Cycles: the image's beats, the memory's latency and the checksum's few
pipeline stages (``cycles`` counts them; CSR LOAD_CYCLES).
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.data import View
from amaranth.lib.wiring import In, Out

from hw.arith.carry_save import compress_3_2, pipelined_add, reduce_to_two
from hw.arith.counter import ChunkedCounter
from hw.image.format import MAGIC, VERSION, config_hash_word, image_layout, param_blocks
from hw.image.memory_map import layer_bits
from hw.image.param_map import (fetch_halves, layer_bank_bits, layer_block_bytes, mixer_split_bit, param_layout,
                                param_map, tap_words)
from hw.kda.short_conv import tap_write_signature
from hw.arith.pipeline import Pipe, plan_pipeline
from hw.stream.weight_port import WeightPortSignature, split_request

# bits of ``errors`` (CSR LOAD_ERRORS), in header-word order, then the checksum
LOAD_ERRORS = ("MAGIC", "VERSION", "CONFIG_HASH", "LENGTH", "CHECKSUM")
ERR = {name: 1 << n for n, name in enumerate(LOAD_ERRORS)}


class ImageLoader(wiring.Component):
    def __init__(self, cfg):
        self.cfg = cfg
        self.W = W = cfg.hw.weight_port_bytes
        self.layout = image_layout(cfg)
        self.pmap = param_map(cfg)
        self.reqs = split_request(0, self.layout.beats, W)
        self.model = not cfg.model.is_layer_chip
        ports = {
            "start": In(1),
            "wport": Out(WeightPortSignature(W)),
            "busy": Out(1),
            "loaded": Out(1),
            "errors": Out(len(LOAD_ERRORS)),
            "cycles": Out(32),
        }
        if self.model:
            # a model: the bank holds ONE layer's block (bit 0 = its first byte), LOAD leaves
            # layer 0's there and FETCH puts another's; the head's block has its own bank
            blocks = param_blocks(cfg)
            self.layer_blocks = [(addr, pm.nbytes) for prefix, pm, addr in blocks
                                 if prefix.startswith("layers.") and pm.memory == "bank"]
            self.head_block = [(addr, pm) for prefix, pm, addr in blocks if not prefix.startswith("layers.")]
            self.block_bytes = layer_block_bytes(cfg)
            assert all(nb == self.block_bytes for _, nb in self.layer_blocks)
            self.split = mixer_split_bit(cfg)
            self.halves = fetch_halves(cfg)
            ports.update({"bank": Out(layer_bank_bits(cfg)),
                          "fetch": In(1), "fetch_layer": In(layer_bits(cfg)), "fetch_half": In(1),
                          "fetching": Out(1)})
            if self.head_block and cfg.model.vocab:
                ports["head_params"] = Out(param_layout(cfg, "head", mixer="head"))
            if self.head_block and cfg.model.attn_res != "none":
                # the depth unit's fields, after the head's in the same block
                ports["attn_res_params"] = Out(param_layout(cfg, "attn_res", mixer="head"))
        else:
            ports["bank"] = Out(param_layout(cfg))
        # the short convolutions' taps in SRAM (param_map conv_taps_in_sram): the region's first
        # ``tap_words`` beats, written into the tap memory in order, one word a beat
        self.tap_words = tap_words(cfg)
        if self.tap_words:
            ports["tap_w"] = Out(tap_write_signature(self.tap_words, W))
        super().__init__(ports)

    def header_checks(self) -> list[tuple[int, int]]:
        """(header word index, expected value) of the words the chip compares."""
        return [(0, MAGIC), (1, VERSION), (2, config_hash_word(self.cfg)), (3, self.layout.length)]

    def elaborate(self, platform):
        m = Module()
        W, lay, reqs = self.W, self.layout, self.reqs
        plan = plan_pipeline(self.cfg.hw.clock_period_ns)
        beats = lay.beats

        running = Signal()
        loaded = Signal()
        errors = Signal(len(LOAD_ERRORS))
        fetching = Signal()                  # FETCH of one layer's block (a model's)
        m.d.comb += [self.busy.eq(running | fetching), self.loaded.eq(loaded), self.errors.eq(errors)]

        # ---- requests: the whole image, cut to what one request carries
        req_idx = Signal(range(len(reqs) + 1), init=len(reqs))
        with m.Switch(req_idx):
            for n, (addr, nb) in enumerate(reqs):
                with m.Case(n):
                    m.d.comb += [self.wport.req.valid.eq(1), self.wport.req.payload.addr.eq(addr),
                                 self.wport.req.payload.beats.eq(nb)]
        with m.If(self.wport.req.valid & self.wport.req.ready & ~fetching):
            m.d.sync += req_idx.eq(req_idx + 1)
        half, half_beats = self._fetch_request(m, running, fetching) if self.model else (None, None)

        # ---- response beats
        m.d.comb += self.wport.resp.ready.eq(running | fetching)
        beat_go = Signal()
        m.d.comb += beat_go.eq(self.wport.resp.valid & self.wport.resp.ready)
        data = self.wport.resp.payload.data
        beat = ChunkedCounter(max(1, beats.bit_length()), name="load_beat")
        m.d.comb += beat.inc.eq(beat_go)
        beat.load(self.start | (self.fetch if self.model else 0), 0)
        beat.elaborate(m)
        last_beat = Signal()
        m.d.comb += last_beat.eq(beat_go & running & (beat.value == beats - 1))

        # 32-bit words: W/4 per beat, or one per 4/W beats on a narrow port
        if W >= 4:
            words = [data[32 * j:32 * j + 32] for j in range(W // 4)]
            words_valid = beat_go & running

            def header_word(h):
                return data[8 * (4 * h % W):8 * (4 * h % W) + 32]
        else:
            asm = Signal(32, name="load_word")
            asm_next = Signal(32, name="load_word_next")
            m.d.comb += asm_next.eq(Cat(asm[8 * W:], data))
            with m.If(beat_go):
                m.d.sync += asm.eq(asm_next)
            group = 4 // W
            words = [asm_next]
            words_valid = beat_go & running & (beat.value[:group.bit_length() - 1] == group - 1)

            def header_word(h):
                return asm_next

        # ---- header: compare each checked word in the beat that completes it
        for h, want in self.header_checks():
            done_beat = -(-(4 * h + 4) // W) - 1
            with m.If(beat_go & running & (beat.value == done_beat) & (header_word(h) != want)):
                m.d.sync += errors.eq(errors | ERR[LOAD_ERRORS[h]])

        # ---- parameter region: the taps' beats into their memory, the others into the bank
        if self.tap_words:
            self._tap_writes(m, beat_go & running, beat, data)
        self._param_bank(m, beat_go, beat, data, running, fetching, half)

        # ---- checksum
        sum_zero, drain = self._checksum(m, plan, words_valid, words)
        wait = Signal(range(drain + 1))

        # ---- control
        cycles = ChunkedCounter(32, name="load_cycles")
        m.d.comb += [cycles.inc.eq(running), self.cycles.eq(cycles.value)]
        cycles.load(self.start, 1)
        cycles.elaborate(m)
        with m.FSM(name="loader"):
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [running.eq(1), loaded.eq(0), errors.eq(0), req_idx.eq(0)]
                    m.next = "READ"
                if self.model:
                    with m.Elif(self.fetch):
                        m.next = "FETCH"
            if self.model:
                with m.State("FETCH"):
                    m.d.comb += [fetching.eq(1), self.fetching.eq(1)]
                    with m.If(beat_go & (beat.value == half_beats - 1)):
                        m.next = "IDLE"
            with m.State("READ"):
                with m.If(last_beat):
                    m.d.sync += wait.eq(drain)
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.sync += wait.eq(wait - 1)
                with m.If(wait == 0):
                    m.d.sync += running.eq(0)
                    with m.If(sum_zero & (errors == 0)):
                        m.d.sync += loaded.eq(1)
                    with m.If(~sum_zero):
                        m.d.sync += errors.eq(errors | ERR["CHECKSUM"])
                    m.next = "IDLE"
        return m

    def _fetch_request(self, m, running, fetching):
        """FETCH (a model's): one request, the beats of one half of the layer's block (block
        sizes are equal: one beat count per half).  Returns the half being fetched (0 token
        mixer, 1 channel mixer) and its beat count."""
        W = self.W
        fetch_req = Signal()
        fetch_addr = Signal(32)
        half = Signal()                     # the half being fetched: 0 token mixer, 1 channel mixer
        f_layer = Signal(layer_bits(self.cfg))
        half_beats = Signal(range(self.block_bytes // W + 1))
        m.d.comb += half_beats.eq(Mux(half, self.halves[1][1], self.halves[0][1]))
        # the strobe's layer and half are registered and the address is looked up from the
        # registers: the strobe itself comes from the top's comparisons of the datapath's
        # state, and the table lookup behind them was model-small-sram's worst path
        addrs = [Array(Const(a + b0 * W, 32) for a, _ in self.layer_blocks) for b0, _ in self.halves]
        m.d.comb += fetch_addr.eq(Mux(half, addrs[1][f_layer], addrs[0][f_layer]))
        with m.If(self.fetch & ~self.start & ~running & ~fetching):
            m.d.sync += [fetch_req.eq(1), half.eq(self.fetch_half), f_layer.eq(self.fetch_layer)]
        with m.If(fetch_req):
            m.d.comb += [self.wport.req.valid.eq(1), self.wport.req.payload.addr.eq(fetch_addr),
                         self.wport.req.payload.beats.eq(half_beats)]
            with m.If(self.wport.req.ready):
                m.d.sync += fetch_req.eq(0)
        return half, half_beats

    def _param_bank(self, m, beat_go, beat, data, running, fetching, half) -> None:
        """The parameter region's beats shifted into the bank: the layer chip's one bank, or
        a model's two halves of one layer's block and the head's block."""
        W, lay = self.W, self.layout
        # reset-less: no reset gate per bit; after a reset ``loaded`` is low and nothing reads it
        if not self.model:
            # the taps' beats (if in SRAM) come first and are not the bank's
            p0, p1 = lay.params_addr // W + self.tap_words, (lay.params_addr + lay.params_bytes) // W
            bank = Signal(8 * W * (p1 - p0), name="param_bank", reset_less=True)
            self._shift_in(m, bank, beat_go & (beat.value >= p0) & (beat.value < p1), data, W)
            m.d.comb += self.bank.as_value().eq(bank[:self.pmap.bits])
        else:
            # LOAD shifts layer 0's block into both halves (the first token needs no FETCH),
            # FETCH one half of any layer's
            a0 = self.layer_blocks[0][0] // W
            regs = []
            for h, (b0, nb) in enumerate(self.halves):
                reg = Signal(8 * W * nb, name=f"param_bank_{('token', 'channel')[h]}", reset_less=True)
                mine = fetching & (half == h)
                self._shift_in(m, reg, beat_go & (mine | (running & (beat.value >= a0 + b0) &
                                                          (beat.value < a0 + b0 + nb))), data, W)
                regs.append(reg)
            (_, _), (b1, _) = self.halves
            bank = Cat(regs[0][:self.split], regs[1][self.split - 8 * W * b1:])
            m.d.comb += self.bank.eq(bank[:len(self.bank)])
            if self.head_block:
                (h_addr, h_pm), = self.head_block
                head = Signal(8 * h_pm.nbytes, name="head_bank", reset_less=True)
                self._shift_in(m, head, beat_go & ~fetching & (beat.value >= h_addr // W) &
                               (beat.value < (h_addr + h_pm.nbytes) // W), data, W)
                block = View(param_layout(self.cfg, mixer="head"), head[:h_pm.bits])
                if self.cfg.model.vocab:
                    m.d.comb += self.head_params.eq(block.head)
                if self.cfg.model.attn_res != "none":
                    m.d.comb += self.attn_res_params.eq(block.attn_res)

    def _tap_writes(self, m, beat_ok, beat, data) -> None:
        """LOAD's tap beats (the parameter region's first ``tap_words``) to the tap memory:
        word n <- the n-th, through registers (the macro is in the KDA unit, far from here)."""
        p0 = self.layout.params_addr // self.W
        w = self.tap_w
        addr = Signal.like(w.addr, name="tap_addr")
        with m.If(self.start):
            m.d.sync += addr.eq(0)
        m.d.sync += w.valid.eq(0)
        with m.If(beat_ok & (beat.value >= p0) & (beat.value < p0 + self.tap_words)):
            m.d.sync += [w.valid.eq(1), w.addr.eq(addr), w.data.eq(data), addr.eq(addr + 1)]

    def _checksum(self, m, plan, words_valid, words):
        """The image's checksum: the beat's words to two (clock-derived stages), then a 4:2
        into the carry-save accumulator; resolved by a pipelined add after the last beat.
        Returns the registered "sum is zero" and the cycles from the last beat to it."""
        pipe = Pipe(m, plan, "load_sum")
        live = reduce_to_two(pipe, {"valid": words_valid, "words": words}, "words", 32)
        live = pipe.register(live)
        acc_s, acc_c = Signal(32, name="load_acc_s"), Signal(32, name="load_acc_c")
        with m.If(self.start):
            m.d.sync += [acc_s.eq(0), acc_c.eq(0)]
        with m.Elif(live["valid"]):
            ws, wc = live["words"]
            s1, c1 = compress_3_2(acc_s, acc_c, ws, 32)
            s2, c2 = compress_3_2(s1, c1, wc, 32)
            m.d.sync += [acc_s.eq(s2), acc_c.eq(c2)]
        fin = Pipe(m, plan, "load_fin")
        total = pipelined_add(fin, {"a": acc_s, "b": acc_c}, "a", "b", "total", 32)["total"]
        sum_zero = Signal()
        m.d.sync += sum_zero.eq(total == 0)
        # from the last beat: the tree's stages, the accumulate, the add's stages, the compare
        drain = pipe.stages + fin.stages + 3
        return sum_zero, drain

    @staticmethod
    def _shift_in(m, bank, enable, data, W) -> None:
        """A block's beats shifted in from the top: after the block's last beat its first
        byte is at bit 0 (no address decoder, one flip-flop with enable per bit)."""
        with m.If(enable):
            m.d.sync += bank.eq(Cat(bank[8 * W:], data))
