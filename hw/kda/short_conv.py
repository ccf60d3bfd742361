"""Causal depthwise short convolution over tokens, one channel per cycle.

For channel c of token t (kernel K, taps ``w[c, 0..K-1]``, tap j weighting
the input of token t-(K-1)+j, as model/params.py stores ``conv_*``):

    acc[c] = sum_j w[c, j] * x_{t-(K-1)+j}[c]

Inputs before the start of the sequence count as zero.  The unit keeps, per
channel, the last K-1 inputs (``channels`` registers of (K-1) int8, read through a rotating one-hot select);
after a ``restart`` the stale history is *masked* by a count of the tokens
seen since, instead of being overwritten, so a new sequence costs no cycles.

The taps are run-time values (hw/image/param_map.py ``kda.conv_*.w``), so one netlist
serves every model, held in one of two places:

* ``taps``, an input of channels x K signed words (the parameter bank): a channel's taps
  are read through the same rotating one-hot select as its history (an AND-OR tree, no
  C:1 mux on ``chan``) and registered beside it; they must be stable while tokens are in
  flight;
* ``tap_memory=(layers, word_bytes)`` (with the history in SRAM, param_map
  ``conv_taps_in_sram``): an SRAM macro of ``layers`` x C K / word_bytes words, each a port
  beat of whole channels' taps, written by LOAD through ``tap_w`` (word ``addr``, the
  parameter region's tap beats in order) while no token is inside.  A token's channel
  reads its word (``tap_layer`` x words per layer + chan K / word_bytes) in the cycle it is
  accepted, beside the history: the macro's read register is stage 1's taps register,
  and a registered byte select picks the channel's K taps.  On tiny this replaced 1,536
  bank flip-flops and their 48:1 read by one 64x32 macro (docs/chip.md).

Layers (``layers`` = L > 1, the layers of a model on one datapath): one history
and one token count per layer; a token's channels read and update only its
layer's (``layer``, stable while the token's channels are sent; each channel's
layer travels with it to the history write).  The rotating select and the
channel counter are shared: every token sends all channels, so they are back at
channel 0 when the next token, of any layer, begins.  The read keeps the one-layer
path: each layer's words go through the same channel-select AND-OR tree into a
stage-1 register of their own (L words registered instead of one), and the layer is
chosen after that register, by a registered one-hot of the channel's layer, in
stage 1's budget (the pipeline's plan places the extra mux levels).  A single
AND-OR over L x channels words behind an AND of channel and layer bits cost
model-tiny's read 0.19-0.31 ns of its slack at 1.25 ns.

History in SRAM (``memory="sram"``, with hw.state_memory: the KDA's long-lived storage
in the platform's 1RW macros, hw/mem/fakeram.py): word ``layer * channels + chan`` holds
that channel's K-1 inputs, one byte slot each, and a token touches each word exactly once,
in the cycle its channel is accepted: a masked write of x into slot ``phase`` (the token's
count mod K-1, per layer), which overwrites x_{t-(K-1)}, while the macro reads the old word
(read-before-write).  That old word is the window: slot m (x_{t-(K-1)+m}) is byte
``(phase + m) mod (K-1)``.  So one access per channel (any rate, one channel a cycle
included) replaces the shift of the flip-flop history, the macro's read register is stage
1's history register, and only the byte rotation is new logic; the values are the same.
The stale words of a restarted layer (or an SRAM's power-up contents) are masked by its
token count as before.

``always_ready=True``: for a consumer that takes every result the cycle it appears (the
KDA unit): no result FIFO and no credit counter, ``i`` is always ready and a result leaves
the pipeline's last register straight onto ``o``.

Streams: ``i`` carries the channels of a token in order 0..channels-1, then
the next token; ``o`` carries ``acc`` in the same order.  ``restart`` (L strobe
bits, bit l: layer l's sequence starts again, its history masked) is allowed
only between tokens (before channel 0 is sent).  Throughput
one channel per cycle.  The K products and their sum are Booth partial
products in one carry-save tree over stages that follow from the clock
(hw/arith/pipeline.py); the pipeline itself never stalls: results land in a FIFO as
deep as the pipeline, and ``i`` is ready only while every channel in flight
has a place there, so back-pressure on ``o`` stalls ``i`` without loss; with ``o``
always ready, ``i`` is always ready (the KDA unit relies on it).
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.arith.carry_save import booth_partial_products, pipelined_add, reduce_to_two
from hw.arith.pipeline import Pipe, plan_pipeline
from hw.arith.reduce import or_tree
from hw.mem.fakeram import choose_macros, macro_row


def tap_write_signature(words: int, word_bytes: int) -> wiring.Signature:
    """LOAD's writes of the tap memory (ShortConv ``tap_memory``): word ``addr`` <- ``data``
    in each cycle ``valid`` is high (the loader's view: outputs)."""
    return wiring.Signature({"valid": Out(1), "addr": Out(range(max(2, words))), "data": Out(8 * word_bytes)})


def conv_acc_bits(in_bits: int, weight_bits: int, kernel: int) -> int:
    """Exact width of a K-tap sum of ``in_bits`` x ``weight_bits`` products."""
    return in_bits + weight_bits - 1 + max(1, (kernel - 1).bit_length()) + 1


class ShortConv(wiring.Component):
    def __init__(self, channels: int, kernel: int, in_bits: int = 8, weight_bits: int = 8,
                 *, clock_period_ns: float, layers: int = 1, memory: str = "flops", always_ready: bool = False,
                 tap_memory: tuple[int, int] | None = None):
        """``memory``: where the history lives, "flops" or "sram" (module doc);
        ``always_ready``: no output FIFO, for a consumer that never stalls (module doc);
        ``tap_memory``: (layers, word bytes) of the taps' SRAM, or None: the ``taps`` input."""
        if channels < 2 or kernel < 1 or layers < 1:
            raise ValueError(f"short conv: needs channels >= 2, kernel >= 1 and layers >= 1, "
                             f"got ({channels}, {kernel}, {layers})")
        if memory not in ("flops", "sram"):
            raise ValueError(f"short conv: memory is \"flops\" or \"sram\", got {memory!r}")
        self.channels, self.kernel, self.layers = channels, kernel, layers
        self.always_ready = always_ready
        # with K = 1 there is no history to keep
        self.memory = memory if kernel > 1 else "flops"
        self.macros = (choose_macros(layers * channels, (kernel - 1) * in_bits)
                       if self.memory == "sram" else None)
        self.in_bits, self.weight_bits = in_bits, weight_bits
        self.clock_period_ns = clock_period_ns
        self.acc_bits = conv_acc_bits(in_bits, weight_bits, self.kernel)
        self.tap_memory = tap_memory
        if tap_memory is not None:
            tap_layers, wb = tap_memory
            per = wb * 8 // (kernel * weight_bits) if wb * 8 % (kernel * weight_bits) == 0 else 0
            if kernel < 2 or per < 1 or per & (per - 1) or channels % per:
                raise ValueError(f"short conv: taps in SRAM need words of a power of two of channels' "
                                 f"taps ({kernel} x {weight_bits} bits) and whole words of channels, "
                                 f"got {wb}-byte words, {channels} channels")
            self.tap_per_word = per                      # channels' taps in a word
            self.tap_layer_words = channels // per       # words of one layer
            self.tap_macros = choose_macros(tap_layers * self.tap_layer_words, 8 * wb)
            taps_port = {"tap_w": In(tap_write_signature(tap_layers * self.tap_layer_words, wb)),
                         **({"tap_layer": In(range(tap_layers))} if tap_layers > 1 else {})}
        else:
            taps_port = {"taps": In(data.ArrayLayout(data.ArrayLayout(signed(weight_bits), kernel), channels))}
        super().__init__({
            "i": In(stream.Signature(signed(in_bits), always_ready=always_ready)),
            "o": Out(stream.Signature(signed(self.acc_bits), always_ready=always_ready)),
            "restart": In(layers),
            **({"layer": In(range(layers))} if layers > 1 else {}),
            **taps_port,
        })

    def elaborate(self, platform):
        # the read of a channel's history and taps, the counts and the flip-flop history here;
        # the SRAM history and the sum with its output FIFO are methods of their own, building
        # into this Module (one component: they share stage 1 and the clock plan)
        m = Module()
        C, K, L = self.channels, self.kernel, self.layers
        sram = self.memory == "sram"
        hist_layout = data.ArrayLayout(signed(self.in_bits), max(1, K - 1))
        taps_layout = data.ArrayLayout(signed(self.weight_bits), K)
        s1_taps = Signal(taps_layout)     # the accepted channel's taps, beside stage 1

        chan = Signal(range(C))
        # the history is read and written in channel order, so the word to read is a
        # rotating one-hot register beside ``chan``: each select bit drives only its
        # own word's AND gates, where a C:1 read mux on ``chan`` fanned every address
        # bit out to all words (small at 1 ns was 0.003 ns short on it).  The taps are
        # read through the same select, in both memories
        if sram:
            hists = []
        elif L == 1:
            hists = [[Signal(hist_layout, name=f"hist{c}") for c in range(C)]]
        else:
            hists = [[Signal(hist_layout, name=f"l{l}_hist{c}") for c in range(C)] for l in range(L)]
        sel = Signal(C, init=1)
        hist_rd_data = Signal(hist_layout)
        # with several layers: each layer's word of the channel, registered, then the layer's pick
        hist_rd_layer = [Signal(hist_layout, name=f"hist_rd_l{l}") for l in range(L)] if L > 1 and not sram else []
        # per layer: tokens since its restart, saturating at K-1
        seens = [Signal(range(K), name="seen" if L == 1 else f"seen{l}") for l in range(L)]
        # SRAM: per layer, the byte slot this token writes (its count mod K-1)
        phases = [Signal(range(max(2, K - 1)), name="phase" if L == 1 else f"phase{l}") for l in range(L)] if sram else []
        if L == 1:
            seen = seens[0]
            phase = phases[0] if sram else None
        else:
            # the token's layer, one bit per layer (``layer`` is a register of the unit):
            # which count steps, and, registered with the channel, which word is read
            layer_is = [Signal(name=f"layer_is{l}") for l in range(L)]
            m.d.comb += [layer_is[l].eq(self.layer == l) for l in range(L)]
            seen = Array(seens)[self.layer]
            phase = Array(phases)[self.layer] if sram else None

        # stage 1: the accepted input, while its history and taps are read
        s1_valid = Signal()
        s1_x = Signal(signed(self.in_bits))
        s1_seen = Signal(range(K))
        if L > 1 and not sram:
            s1_layer_is = Signal(L)       # the accepted channel's layer, one-hot: its read, its write

        # the sum pipeline (built below) ends in a FIFO with room for every channel
        # that can be in flight; ``credit`` counts the channels accepted and not yet
        # taken from ``o``
        plan = plan_pipeline(self.clock_period_ns)
        pipe = Pipe(m, plan, "conv")
        accept = self.i.valid if self.always_ready else self.i.valid & self.i.ready
        m.d.sync += s1_valid.eq(accept)

        def one_hot_read(words):
            return or_tree(Mux(sel[c], Value.cast(words[c]), 0) for c in range(C))

        if sram:
            hist_reads = []
        elif L == 1:
            hist_reads = [hist_rd_data.eq(one_hot_read(hists[0]))]
        else:
            hist_reads = [reg.eq(one_hot_read(hist)) for reg, hist in zip(hist_rd_layer, hists)]
        with m.If(accept):
            # with the taps in SRAM, the macro's read register is s1_taps (_sram_taps)
            tap_read = [s1_taps.eq(one_hot_read(self.taps))] if self.tap_memory is None else []
            m.d.sync += [s1_x.eq(self.i.payload), s1_seen.eq(seen), *hist_reads, *tap_read,
                         sel.eq(sel.rotate_left(1))]
            if L > 1 and not sram:
                m.d.sync += s1_layer_is.eq(Cat(*layer_is))
            with m.If(chan == C - 1):
                m.d.sync += chan.eq(0)
                for l, seen_l in enumerate(seens):
                    counting = (seen_l != K - 1) if L == 1 else layer_is[l] & (seen_l != K - 1)
                    with m.If(counting):
                        m.d.sync += seen_l.eq(seen_l + 1)
                for l, ph in enumerate(phases):
                    with m.If(Const(1) if L == 1 else layer_is[l]):
                        m.d.sync += ph.eq(Mux(ph == K - 2, 0, ph + 1))
            with m.Else():
                m.d.sync += chan.eq(chan + 1)
        if L == 1:
            with m.If(self.restart):
                m.d.sync += [chan.eq(0), seen.eq(0), sel.eq(1)]
        else:
            # a layer's restart masks its own history; the channel select restarts with any
            with m.If(self.restart.any()):
                m.d.sync += [chan.eq(0), sel.eq(1)]
            for l, seen_l in enumerate(seens):
                with m.If(self.restart[l]):
                    m.d.sync += seen_l.eq(0)

        d = plan.delays
        if sram:
            pick = self._sram_history(m, d, accept, chan, phase, phases, hist_rd_data)
        elif L > 1:
            m.d.comb += hist_rd_data.eq(or_tree(Mux(s1_layer_is[l], Value.cast(hist_rd_layer[l]), 0)
                                                for l in range(L)))
        # the window x_{t-K+1} .. x_t; slot m of the history is x_{t-(K-1)+m},
        # present only if at least K-1-m tokens came before in this sequence
        window = [Signal(signed(self.in_bits), name=f"win{slot}") for slot in range(K - 1)]
        for slot, v in enumerate(window):
            m.d.comb += v.eq(0)
            with m.If(s1_seen >= (K - 1 - slot)):
                m.d.comb += v.eq(hist_rd_data[slot])
        window.append(s1_x)

        # flip-flops: shift the new input into the channel's history (the next read of
        # this channel is a whole token later).  The channel's select is ``sel`` of the
        # accept, one rotation back (a restart, only between tokens, moves ``sel`` no
        # earlier than this write's cycle, so no register of its own is needed)
        if K > 1 and not sram:
            s1_sel = sel.rotate_right(1)
            for l, hist in enumerate(hists):
                here = s1_valid if L == 1 else s1_valid & s1_layer_is[l]
                for c in range(C):
                    with m.If(here & s1_sel[c]):
                        m.d.sync += hist[c].eq(Cat(*window[1:]))

        # the window's masks, after the layer's pick with several layers (an AND, an OR tree)
        if not sram:
            pick = (1 + (L - 1).bit_length()) * d.mux_level if L > 1 else 0
        if self.tap_memory is not None:
            pick = max(pick, self._sram_taps(m, d, accept, chan, s1_taps))
        self._sum(m, pipe, d, pick, s1_valid, window, s1_taps, accept)
        return m

    def _sram_history(self, m, d, accept, chan, phase, phases, hist_rd_data):
        """The history in SRAM macros: one access per accepted channel, the masked write of
        x into its byte slot and the old word read out (read-before-write) into the macro's
        own register.  A macro row of the array per ``spec.words`` words; the row read is
        picked after the macros by a registered one-hot, like the state memory's banks.
        Drives ``hist_rd_data`` (the window's history, oldest first); returns the delay of
        the read's pick, for the sum's first stage."""
        C, K, L = self.channels, self.kernel, self.layers
        arr, ib = self.macros, self.in_bits
        spec = arr.spec
        wb = (K - 1) * ib
        word = Signal(range(L * C))
        m.d.comb += word.eq(chan if L == 1 else self.layer * C + chan)
        ab = spec.addr_bits
        row = word >> ab
        s1_ph = Signal.like(phases[0], name="s1_phase")
        m.d.sync += s1_ph.eq(phase)
        wd = Cat(*([self.i.payload] * (K - 1)))
        mask = Cat(*(Mux(phase == j, Const((1 << ib) - 1, ib), Const(0, ib)) for j in range(K - 1)))
        picks = []
        for r in range(arr.rows):
            here, picked = Signal(name=f"hist_r{r}"), Signal(name=f"hist_r{r}_picked")
            m.d.comb += here.eq(accept & (row == r))
            m.d.sync += picked.eq(here)
            out = macro_row(m, arr, f"hist_r{r}", ce=here, we=here, addr=word[:ab], wd=wd, mask=mask)
            picks.append(Mux(picked, out[:wb], 0) if arr.rows > 1 else out[:wb])
        old = Value.cast(or_tree(picks))
        slots = [old[j * ib:(j + 1) * ib] for j in range(K - 1)]
        # slot m of the window is byte (phase + m) mod (K-1)
        m.d.comb += [hist_rd_data[mm].eq(Array(slots[(j + mm) % (K - 1)] for j in range(K - 1))[s1_ph])
                     for mm in range(K - 1)]
        # the macro's clock-to-output over a flip-flop's (0.2 ns on the small fakeram45s,
        # hw/mem/fakeram.py) as two mux levels, the row pick, the byte rotation
        pick = (2 + (arr.rows - 1).bit_length() + (K - 2).bit_length()) * d.mux_level
        return pick

    def _sram_taps(self, m, d, accept, chan, s1_taps):
        """The taps in SRAM (``tap_memory``): LOAD's writes through ``tap_w``; a read of the
        accepted channel's word, its K taps picked by a registered byte select.  Drives
        ``s1_taps``; returns the delay of the read's pick, for the sum's first stage."""
        arr, per, lw = self.tap_macros, self.tap_per_word, self.tap_layer_words
        spec, ab = arr.spec, arr.spec.addr_bits
        tw = self.kernel * self.weight_bits
        shift = (per - 1).bit_length()
        rd_word = Signal(range(max(2, arr.rows * spec.words)), name="tap_rd_word")
        base = self.tap_layer * lw if "tap_layer" in self.signature.members else 0
        m.d.comb += rd_word.eq(base + (chan >> shift))
        w = self.tap_w
        word = Signal.like(rd_word, name="tap_word")
        m.d.comb += word.eq(Mux(w.valid, w.addr, rd_word))
        sub = Signal(max(1, shift), name="tap_sub")          # the channel's taps in the word
        m.d.sync += sub.eq(chan[:shift] if shift else 0)
        picks = []
        for r in range(arr.rows):
            here, picked = Signal(name=f"taps_r{r}"), Signal(name=f"taps_r{r}_picked")
            m.d.comb += here.eq((accept | w.valid) & ((word >> ab) == r))
            m.d.sync += picked.eq(here)
            out = macro_row(m, arr, f"taps_r{r}", ce=here, we=w.valid, addr=word[:ab], wd=w.data, mask=-1)
            picks.append(Mux(picked, out[:per * tw], 0) if arr.rows > 1 else out[:per * tw])
        row = Value.cast(or_tree(picks))
        groups = [row[j * tw:(j + 1) * tw] for j in range(per)]
        m.d.comb += s1_taps.as_value().eq(Array(groups)[sub] if per > 1 else groups[0])
        # as the history's read: the macro's clock-to-output as two mux levels, the row pick,
        # the byte select
        return (2 + (arr.rows - 1).bit_length() + shift) * d.mux_level

    def _sum(self, m, pipe, d, pick, s1_valid, window, s1_taps, accept):
        """acc = sum_j taps_j * window_j over clock-derived stages, then ``o``: straight out
        when the consumer never stalls, else through a FIFO with a credit per channel."""
        K = self.kernel
        # every tap's Booth partial products in one tree
        width = self.acc_bits
        live = pipe.spend(2 * d.mux_level + pick, {"valid": s1_valid, "win": window,
                                            "taps": [s1_taps[j] for j in range(K)]})
        live = pipe.spend(d.booth_select, live)
        words = []
        for j in range(K):
            words += booth_partial_products(m, live["win"][j], live["taps"][j], width, name=f"conv_t{j}")
        live = reduce_to_two(pipe, {"valid": live["valid"], "words": words}, "words", width)
        live["a"], live["b"] = live.pop("words")
        live = pipelined_add(pipe, live, "a", "b", "acc", width)
        live = pipe.register(live)
        if self.always_ready:
            m.d.comb += [self.o.valid.eq(live["valid"]), self.o.payload.eq(live["acc"])]
            return
        # an accepted channel holds a credit for stage 1, the pipeline's stages, the two
        # cycles SyncFIFOBuffered takes from w_en to r_rdy and the cycle ``credit`` takes to
        # see the read: with fewer places ``i`` fell to not ready at one channel a cycle
        # with ``o`` always ready, and the KDA unit (which sends without looking at ready:
        # its rows cannot stall) lost channels (d_model 4 = lanes: a row a cycle)
        depth = pipe.stages + 4
        m.submodules.out = out = SyncFIFOBuffered(width=width, depth=depth)
        m.d.comb += [out.w_en.eq(live["valid"]), out.w_data.eq(live["acc"]),
                     self.o.valid.eq(out.r_rdy), self.o.payload.eq(Value.cast(out.r_data).as_signed()),
                     out.r_en.eq(self.o.ready)]
        credit = Signal(range(depth + 1))
        taken = self.o.valid & self.o.ready
        m.d.sync += credit.eq(credit + accept - taken)
        m.d.comb += self.i.ready.eq(credit < depth)
