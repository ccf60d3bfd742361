"""The MoE channel mixer: one int8 token in, one int8 token out, weights streamed.

Implements ``sim.models.int_moe.int_moe_step`` bit for bit.  The RTL is
generated from a config and the quantised parameters ``QMoE``: the weight
matrices live in the external weight memory (hw/memory_map.py) and are read
through ``wport``; the small constants (requantisation (m, s) per matrix, the
selection bias, the sigmoid and SiLU tables, routed_scaling, the combine
multiplier) are baked in at elaboration.

Ports
-----
``tokens``  stream, one beat per token: d_model int8 (the normalised hn).
``out``     stream, one beat per token: d_model x resid_bits signed (the MoE
            output, at the scale the residual add takes).
``wport``   weight port (hw/weight_port.py).
``cycles``  free-running cycle counter; ``tokens_done`` tokens delivered;
``weight_bytes`` bytes received on the weight port; ``hits[e]`` how often
routed expert e was chosen.  For tests and reports.

Schedule of one token
---------------------
Segments in this order: the router (E rows), the shared experts, then the k
chosen experts in rank order.  The router and shared-expert weights are
requested as soon as the token arrives; each chosen expert is one more
request (its gate, up and down matrices are contiguous), issued as soon as
the top-k selector has its indices - while the shared experts still stream,
so the memory latency is hidden when n_shared >= 1.

Every response beat is one MAC beat (lanes = weight_port_bytes): the port is
the roofline and the MAC keeps up with it.  A beat waits only (a) before the
first down-projection beat of an expert, until that expert's hidden vector
is complete (MAC and product pipelines drain, exponent, conversion: ~30 +
d_ff/port_bytes cycles per expert), and (b) for a routed expert, until its weight is known.

Results leave the MAC with a tag (matrix, row, segment) and go through a
fixed pipeline that never stalls: router code -> sigmoid table -> (+ bias)
-> top-k; gate code -> SiLU table -> buffer; up -> SiLU * up (15 bits) ->
buffer, OR of magnitudes; after the last up row the hidden exponent
sh = max(0, bitlen(max|prod|) - 7) and the conversion hid = sat8(prod >> sh,
rounded), port_bytes values per cycle; the down projection's shift is
down_s - sh.  Down results: weighted add into the d_model accumulators, and
for the last expert requantised into the output.  Routing weights
(divisions) are computed by hw/moe_route.py while the shared experts run.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.lut import LookupTable
from hw.memory_map import memory_map
from hw.moe_arith import Staged, const_products, csa_levels, partial_products, prefix_add
from hw.moe_mac import LaneMacRequant, saturate
from hw.moe_route import RouteWeights
from hw.topk import TopK
from hw.weight_port import MAX_BEATS, WeightPortSignature, beats_per_row
from moekda.config import ConfigError
from moekda.formats import derived_widths, formats_for

ROUTER, GATE, UP, DOWN = range(4)
PROD_BITS = 15   # |SiLU(gate) * up| of two int8 values < 2**15


def _bits_for(values) -> int:
    return max(1, max(int(v) for v in values).bit_length())


class MoEUnit(wiring.Component):
    def __init__(self, cfg, qmoe, counter_bits: int = 32):
        self.cfg, self.q = cfg, qmoe
        m = cfg.model
        self.fm = fm = formats_for(cfg)
        self.widths = derived_widths(cfg)
        self.E, self.k, self.S, self.d, self.f = m.n_experts, m.top_k, m.n_shared, m.d_model, m.d_ff
        self.pb = cfg.hw.weight_port_bytes
        if fm.act_bits != 8 or fm.weight_bits != 8:
            raise ConfigError("formats.act_bits/weight_bits: the MoE unit is built for 8-bit activations and weights")
        for lin in (qmoe.router,):
            if lin.bias is not None:
                raise ValueError("MoE router with an accumulator bias is not supported by the unit")
        self.mmap = memory_map(cfg)
        self.nb_d = beats_per_row(self.d, self.pb)
        self.nb_f = beats_per_row(self.f, self.pb)
        self.router_beats = self.mmap["moe.router"].beats
        self.expert_beats = 2 * self.f * self.nb_d + self.d * self.nb_f
        names = [f"moe.expert{e}" for e in range(self.E)] + [f"moe.shared{s}" for s in range(self.S)]
        self.bank_addr = []
        for p in names:
            addr, nbytes = self.mmap.span([f"{p}.gate", f"{p}.up", f"{p}.down"])
            assert nbytes == self.expert_beats * self.pb
            self.bank_addr.append(addr)
        if max(self.router_beats, self.expert_beats) > MAX_BEATS:
            raise ConfigError(f"model.d_ff = {self.f}: an expert needs {self.expert_beats} beats, more than one "
                              f"weight request carries ({MAX_BEATS}); use a smaller d_ff/d_model")
        self.nseg = 1 + self.S + self.k
        # 3:2 compressor levels per pipeline stage, from the clock period
        self.levels = csa_levels(cfg.hw.clock_period_ns)
        # the output goes straight into the residual add: resid_bits wide
        self.out_bits = fm.resid_bits
        super().__init__({
            "tokens": In(stream.Signature(data.ArrayLayout(signed(fm.act_bits), self.d))),
            "out": Out(stream.Signature(data.ArrayLayout(signed(self.out_bits), self.d))),
            "wport": Out(WeightPortSignature(self.pb)),
            "cycles": Out(unsigned(counter_bits)),
            "tokens_done": Out(unsigned(counter_bits)),
            "weight_bytes": Out(unsigned(counter_bits + 8)),
            "hits": Out(unsigned(counter_bits)).array(self.E),
        })
        self.counter_bits = counter_bits

    # ---- analytic counts (the tests compare the port's counters against these) ----
    def bytes_per_token(self) -> int:
        return (self.router_beats + (self.S + self.k) * self.expert_beats) * self.pb

    def dense_bytes_per_token(self) -> int:
        """What a dense layer running all E routed experts (+ shared) would fetch."""
        return (self.router_beats + (self.S + self.E) * self.expert_beats) * self.pb

    def elaborate(self, platform):
        m = Module()
        cfg, q, fm = self.cfg, self.q, self.fm
        E, k, S, d, f, pb = self.E, self.k, self.S, self.d, self.f, self.pb
        nseg, nb_d, nb_f = self.nseg, self.nb_d, self.nb_f
        routed, shared = q.routed, q.shared

        # per-bank constants: banks 0..E-1 routed experts, E..E+S-1 shared experts
        def bank_consts(name):
            vals = [int(v) for v in getattr(routed, name)] + [int(v) for v in getattr(shared, name)]
            return vals

        consts = {n: bank_consts(n) for n in ("gate_m", "gate_s", "up_m", "up_s", "down_m", "down_s")}
        max_shift = max(max(consts["gate_s"]), max(consts["up_s"]), max(consts["down_s"]), q.router.s)

        def const_array(vals):
            w = _bits_for(vals)
            return Array(Const(v, unsigned(w)) for v in vals)

        # ---- submodules ----
        score_bits = _bits_for(q.score.table)        # U0.score_frac, 0..2**score_frac
        key_bits = self.widths["router_choice"]
        m.submodules.topk = topk = TopK(E, k, key_bits, tag_bits=score_bits)
        m.submodules.route = route = RouteWeights(
            E, k, key_bits, score_bits, wn_frac=fm.wn_frac, rs=q.rs, rs_frac=fm.rs_frac,
            div_num_bits=self.widths["div_num"], div_den_bits=self.widths["div_den"],
            weight_bits=self.widths["route_weight"], counter_bits=self.counter_bits)
        wiring.connect(m, topk.out, route.sel)
        m.submodules.score_lut = score_lut = LookupTable([int(v) for v in q.score.table], q.score.in_bits)
        m.submodules.silu_lut = silu_lut = LookupTable([int(v) for v in q.silu.table], q.silu.in_bits)

        tag_layout = data.StructLayout({"kind": unsigned(2), "row": range(max(E, d, f)), "seg": range(nseg)})
        # MAC output widths: table codes (router, gate), int8 (up), expert outputs (down)
        out_widths = (fm.lut_in_bits, fm.act_bits, fm.expert_out_bits)
        m.submodules.mac = mac = LaneMacRequant(pb, fm.acc_bits, fm.mult_bits, max_shift, tag_layout,
                                                out_widths=out_widths, levels=self.levels)
        for i in range(E):
            m.d.comb += self.hits[i].eq(route.hits[i])

        # ---- token state ----
        x = Signal(data.ArrayLayout(signed(8), nb_d * pb))          # zero-padded to whole beats
        h = Array(Signal(signed(8), name=f"h{j}") for j in range(nb_f * pb))   # hidden vector, padded
        # per hidden unit: the SiLU value from the gate row, then the product SiLU * up
        buf_sigs = [Signal(signed(PROD_BITS + 1), name=f"buf{j}") for j in range(f)]
        buf = Array(buf_sigs)
        buf_padded = Array(buf_sigs + [Const(0, signed(PROD_BITS + 1))] * (nb_f * pb - f))
        orb = Signal(PROD_BITS)        # OR of |prod| so far in this expert
        hid_sh = Signal(range(PROD_BITS - 6))   # the hidden vector's exponent (int_expert's ``sh``), 0..8
        half_sh = Signal(PROD_BITS - 7)         # its rounding constant 2**(sh-1) (0 for sh = 0)
        conv_busy = Signal()
        conv_j = Signal(range(nb_f))
        conv_seg = Signal(range(nseg))
        acc = Array(Signal(signed(self.widths["moe_combine_acc"]), name=f"acc{i}") for i in range(d))
        y_out = Signal(data.ArrayLayout(signed(self.out_bits), d))
        busy = Signal()
        out_valid = Signal()
        h_ok = Signal()                # h holds the complete hidden vector of segment h_seg
        h_seg = Signal(range(nseg))

        idx = Array(route.idx)
        wt = Array(route.wt)

        def bank_of(seg):
            rank = (seg - 1 - S)[:len(route.idx[0]) + 8]
            return Mux(seg <= S, E + seg - 1, idx[rank])

        # ---- counters ----
        # (prefix adders: Yosys's counters are ripple chains; the byte count is
        # bumped one cycle after the beat, off the ready path)
        m.d.sync += self.cycles.eq(prefix_add(m, self.cycles, 1, self.counter_bits, "cycles_inc"))
        beat_seen = Signal()
        m.d.sync += beat_seen.eq(self.wport.resp.valid & self.wport.resp.ready)
        with m.If(beat_seen):
            m.d.sync += self.weight_bytes.eq(prefix_add(m, self.weight_bytes, pb, len(self.weight_bytes),
                                                        "bytes_inc"))

        # ---- token in / out ----
        m.d.comb += [self.tokens.ready.eq(~busy & ~out_valid),
                     self.out.valid.eq(out_valid), self.out.payload.eq(y_out)]
        start = Signal()
        m.d.comb += start.eq(self.tokens.valid & self.tokens.ready)
        with m.If(start):
            m.d.sync += [busy.eq(1), h_ok.eq(0), x.as_value().eq(self.tokens.payload.as_value())]
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += [out_valid.eq(0), self.tokens_done.eq(self.tokens_done + 1)]

        # ---- requests: router, shared experts, then the chosen experts ----
        rq_seg = Signal(range(nseg + 1))
        rq_busy = Signal()
        bank_addr = const_array(self.bank_addr)
        req = self.wport.req
        m.d.comb += [
            req.valid.eq(rq_busy & ((rq_seg <= S) | route.idx_valid)),
            req.payload.addr.eq(Mux(rq_seg == 0, self.mmap["moe.router"].addr, bank_addr[bank_of(rq_seg)])),
            req.payload.beats.eq(Mux(rq_seg == 0, self.router_beats, self.expert_beats)),
        ]
        with m.If(start):
            m.d.sync += [rq_seg.eq(0), rq_busy.eq(1)]
        with m.If(req.valid & req.ready):
            m.d.sync += rq_seg.eq(rq_seg + 1)
            with m.If(rq_seg == nseg - 1):
                m.d.sync += rq_busy.eq(0)

        # ---- beat sequencer: response beats -> MAC beats ----
        c_seg = Signal(range(nseg))
        c_mat = Signal(2)              # GATE, UP, DOWN within an expert; ROUTER in segment 0
        c_row = Signal(range(max(E, d, f)))
        c_beat = Signal(range(max(nb_d, nb_f)))
        c_busy = Signal()
        with m.If(start):
            m.d.sync += [c_seg.eq(0), c_mat.eq(ROUTER), c_row.eq(0), c_beat.eq(0), c_busy.eq(1)]
        is_down = Signal()
        m.d.comb += is_down.eq(c_mat == DOWN)
        row_beats = Mux(is_down, nb_f, nb_d)
        rows = Mux(c_mat == ROUTER, E, Mux(is_down, d, f))
        bank = Signal(range(E + S))
        m.d.comb += bank.eq(bank_of(c_seg))
        # (a) a down projection needs this expert's complete hidden vector,
        # (b) a routed expert's down results need its routing weight.
        hold = Signal()
        m.d.comb += hold.eq(is_down & ((c_row == 0) & (c_beat == 0)) &
                            ~(h_ok & (h_seg == c_seg) & ((c_seg <= S) | route.wt_valid)))
        resp = self.wport.resp
        beat = Signal()
        m.d.comb += [resp.ready.eq(c_busy & ~hold), beat.eq(resp.valid & resp.ready)]
        with m.If(beat & is_down & (c_row == 0) & (c_beat == 0)):
            m.d.sync += h_ok.eq(0)     # h now belongs to this segment's down rows only

        x_slices = Array(x.as_value()[8 * pb * j: 8 * pb * (j + 1)] for j in range(nb_d))
        h_slices = Array(Cat(*h[pb * j: pb * (j + 1)]) for j in range(nb_f))
        kind_m = {ROUTER: Const(q.router.m), GATE: const_array(consts["gate_m"])[bank],
                  UP: const_array(consts["up_m"])[bank], DOWN: const_array(consts["down_m"])[bank]}
        # the down projection's shift absorbs the hidden exponent of this expert
        kind_s = {ROUTER: Const(q.router.s), GATE: const_array(consts["gate_s"])[bank],
                  UP: const_array(consts["up_s"])[bank], DOWN: const_array(consts["down_s"])[bank] - hid_sh}
        mult = Signal(fm.mult_bits)
        shift = Signal(range(max_shift + 1))
        with m.Switch(c_mat):
            for kind in (ROUTER, GATE, UP, DOWN):
                with m.Case(kind):
                    m.d.comb += [mult.eq(kind_m[kind]), shift.eq(kind_s[kind])]
        m.d.comb += [
            mac.valid.eq(beat),
            mac.w.as_value().eq(resp.payload.data),
            mac.x.as_value().eq(Mux(is_down, h_slices[c_beat], x_slices[c_beat])),
            mac.first.eq(c_beat == 0),
            mac.last.eq(c_beat == row_beats - 1),
            mac.mult.eq(mult), mac.shift.eq(shift),
            mac.out_sel.eq(Mux(is_down, 2, Mux(c_mat == UP, 1, 0))),
            mac.tag.kind.eq(c_mat), mac.tag.row.eq(c_row), mac.tag.seg.eq(c_seg),
        ]
        with m.If(beat):
            m.d.sync += c_beat.eq(c_beat + 1)
            with m.If(c_beat == row_beats - 1):
                m.d.sync += [c_beat.eq(0), c_row.eq(c_row + 1)]
                with m.If(c_row == rows - 1):
                    m.d.sync += c_row.eq(0)
                    with m.If((c_mat == ROUTER) | is_down):
                        m.d.sync += [c_seg.eq(c_seg + 1), c_mat.eq(GATE)]
                        with m.If(c_seg == nseg - 1):
                            m.d.sync += c_busy.eq(0)
                    with m.Else():
                        m.d.sync += c_mat.eq(c_mat + 1)

        # ---- result pipeline (never stalls) ----
        # stage C: MAC result; tables addressed by the requantised code
        c_valid, c_kind, c_row_r, c_seg_r = mac.y_valid, mac.y_tag.kind, mac.y_tag.row, mac.y_tag.seg
        m.d.comb += [score_lut.addr.eq(mac.y), score_lut.en.eq(c_valid & (c_kind == ROUTER)),
                     silu_lut.addr.eq(mac.y), silu_lut.en.eq(c_valid & (c_kind == GATE))]

        def reg(name, shape, value, reset_less=True):
            r = Signal(shape, name=name, reset_less=reset_less)
            m.d.sync += r.eq(value)
            return r

        t_valid = reg("t_valid", 1, c_valid, reset_less=False)
        t_kind = reg("t_kind", 2, c_kind)
        t_row = reg("t_row", c_row_r.shape(), c_row_r)
        t_seg = reg("t_seg", c_seg_r.shape(), c_seg_r)
        t_y = reg("t_y", signed(mac.out_bits), mac.y)
        bias = Array(Const(int(b), signed(key_bits)) for b in q.bias)

        # stage T: table outputs valid.  Router: the choice key is registered
        # before the top-k compare; gate: the SiLU value goes into the buffer;
        # up/down: the multiplier operands are registered (buffer / weight read)
        k_valid = reg("k_valid", 1, t_valid & (t_kind == ROUTER), reset_less=False)
        k_key = reg("k_key", signed(key_bits), score_lut.data + bias[t_row])
        k_tag = reg("k_tag", unsigned(score_bits), score_lut.data)
        m.d.comb += [topk.inp.valid.eq(k_valid), topk.inp.payload.key.eq(k_key),
                     topk.inp.payload.tag.eq(k_tag)]
        with m.If(t_valid & (t_kind == GATE)):
            m.d.sync += buf[t_row].eq(silu_lut.data)
        rank = (t_seg - 1 - S)[:max(1, (k - 1).bit_length())]
        # down: routed experts weigh by wt, shared ones by 1.0 = 1 << wn_frac
        weight = Mux(t_seg <= S, 1 << fm.wn_frac, wt[rank])
        o_valid = reg("o_valid", 1, t_valid & ((t_kind == UP) | (t_kind == DOWN)), reset_less=False)
        o_kind = reg("o_kind", 2, t_kind)
        o_row = reg("o_row", t_row.shape(), t_row)
        o_seg = reg("o_seg", t_seg.shape(), t_seg)
        o_a = reg("o_a", signed(max(PROD_BITS + 1, self.widths["route_weight"] + 1)),
                  Mux(t_kind == UP, buf[t_row], weight))
        o_b = reg("o_b", t_y.shape(), t_y)

        # stage O: the product (SiLU * up, or weight * expert output) in carry-save,
        # then one add; the down path reads its accumulator one stage early
        prod_bits = self.widths["moe_combine_acc"] + 1
        mul = Staged(m, "mul", {"valid": o_valid, "kind": o_kind, "row": o_row, "seg": o_seg})
        s_w, c_w = mul.reduce(partial_products(o_a, o_b, prod_bits), prod_bits, self.levels)
        mul.ctl["prev"] = Mux(mul.ctl["seg"] == 1, 0, acc[mul.ctl["row"]])   # first expert assigns
        u_val = mul.add(s_w, c_w, signed(prod_bits))
        u_valid, u_kind, u_row, u_seg, u_prev = (mul.ctl[n] for n in ("valid", "kind", "row", "seg", "prev"))

        # stage U, up: the product replaces the SiLU value in the buffer; the OR of
        # the magnitudes has the bit length of max|prod| (the hidden exponent)
        prod16 = u_val[:PROD_BITS + 1].as_signed()
        magnitude = Mux(prod16 < 0, -prod16, prod16)[:PROD_BITS]
        orb_new = Signal(PROD_BITS)
        m.d.comb += orb_new.eq(Mux(u_row == 0, 0, orb) | magnitude)
        with m.If(u_valid & (u_kind == UP)):
            m.d.sync += [buf[u_row].eq(prod16), orb.eq(orb_new)]
            with m.If(u_row == f - 1):
                bl = Signal(range(PROD_BITS + 1))
                for i in range(PROD_BITS):
                    with m.If(orb_new[i]):
                        m.d.comb += bl.eq(i + 1)
                sh_new = Mux(bl > fm.act_bits - 1, bl - (fm.act_bits - 1), 0).as_unsigned()[:4]
                m.d.sync += [hid_sh.eq(sh_new), half_sh.eq((Const(1, PROD_BITS - 6) << sh_new) >> 1),
                             conv_busy.eq(1), conv_j.eq(0), conv_seg.eq(u_seg)]
        # the hidden vector, pb values per cycle: sat8(round_shift(prod, sh)),
        # in three stages (slice read, rounding add, shift and saturate)
        cv_valid = reg("cv_valid", 1, conv_busy, reset_less=False)
        cv_j = reg("cv_j", conv_j.shape(), conv_j)
        cv_last = reg("cv_last", 1, conv_j == nb_f - 1)
        cv_vals = [reg(f"cv_val{i}", signed(PROD_BITS + 1), buf_padded[conv_j * pb + i]) for i in range(pb)]
        with m.If(conv_busy):
            m.d.sync += conv_j.eq(conv_j + 1)
            with m.If(conv_j == nb_f - 1):
                m.d.sync += conv_busy.eq(0)
        # then the rounding add, then shift and saturate
        cr_valid = reg("cr_valid", 1, cv_valid, reset_less=False)
        cr_j = reg("cr_j", cv_j.shape(), cv_j)
        cr_last = reg("cr_last", 1, cv_last)
        cr_vals = [reg(f"cr_val{i}", signed(PROD_BITS + 2),
                       prefix_add(m, cv_vals[i], half_sh, PROD_BITS + 2, f"cr_add{i}").as_signed())
                   for i in range(pb)]
        with m.If(cr_valid):
            for i in range(pb):
                hv = Signal(signed(8), name=f"hid_conv{i}")
                saturate(m, cr_vals[i] >> hid_sh, 8, hv)
                m.d.sync += h[cr_j * pb + i].eq(hv)
            with m.If(cr_last):
                m.d.sync += [h_ok.eq(1), h_seg.eq(conv_seg)]

        # stage U, down: weighted add into the accumulators
        # (the sum is registered before it fans out to the d_model accumulators;
        # the early read above is safe: the same row comes back >= d_model results later)
        acc_new = Signal(signed(self.widths["moe_combine_acc"]))
        m.d.comb += acc_new.eq(prefix_add(m, u_prev, u_val, len(acc_new), "acc_new"))
        last_seg = u_seg == nseg - 1
        v_down = reg("v_down", 1, u_valid & (u_kind == DOWN), reset_less=False)
        v_valid = reg("v_valid", 1, u_valid & (u_kind == DOWN) & last_seg, reset_less=False)
        v_row = reg("v_row", u_row.shape(), u_row)
        v_acc = reg("v_acc", acc_new.shape(), acc_new)
        with m.If(v_down):
            m.d.sync += acc[v_row].eq(v_acc)

        # stage V: acc * comb_m + rounding constant in carry-save, one add; then the
        # constant shift (wiring) and saturation into the output token
        rq_bits = self.widths["moe_combine_acc"] + fm.mult_bits + 2
        comb = Staged(m, "comb", {"valid": v_valid, "row": v_row})
        s_w, c_w = comb.reduce(const_products(v_acc, q.comb_m, rq_bits) + [(1 << q.comb_s) >> 1],
                               rq_bits, self.levels)
        x_sum = comb.add(s_w, c_w, signed(rq_bits))
        x_valid, x_row = comb.ctl["valid"], comb.ctl["row"]
        x_sat = Signal(signed(self.out_bits))
        saturate(m, x_sum >> q.comb_s, self.out_bits, x_sat)
        with m.If(x_valid):
            m.d.sync += y_out[x_row].eq(x_sat)
            with m.If(x_row == d - 1):
                m.d.sync += [out_valid.eq(1), busy.eq(0)]
        m.d.comb += route.release.eq(x_valid & (x_row == d - 1))
        return m


def moe_for_config(cfg, seed: int = 0) -> MoEUnit:
    """The unit with the constants of seeded random parameters quantised for ``cfg``
    (what synthesis builds: the baked constants are representative, not special)."""
    from sim.models.params import random_params
    from sim.models.quantize import quantize_layer
    return MoEUnit(cfg, quantize_layer(random_params(cfg, seed), cfg).moe)
