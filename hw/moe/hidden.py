"""An expert's hidden vector: the products SiLU * up of its up rows, scaled by one exponent.

The products go into ``pbuf`` (one per hidden unit) as they come, and the OR of their
magnitudes has the bit length of max|prod|; a cycle after the last up row the hidden
exponent sh = max(0, bitlen(max|prod|) - 7) (int_expert's ``sh``), then the conversion
hid = sat8(round_shift(prod, sh)), port_bytes values per cycle, into ``h``: slice read,
rounding add, shift, saturate, staged by the clock.  The down projection's shift is
down_s - sh.  ``pbuf`` is apart from the SiLU buffer (hw/moe/activations.py), since the next
expert's gate rows land while this expert's products are converted.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.carry_save import prefix_add, sign_extend
from hw.arith.matvec import saturate
from hw.arith.pipeline import Pipe
from hw.moe.phases import PROD_BITS


class HiddenVector(wiring.Component):
    """``valid`` / ``row`` / ``seg`` / ``prod``: an up row's product, rows in order.
    ``h`` / ``h_ok`` / ``h_seg``: the complete hidden vector of segment ``h_seg`` (padded to
    whole port beats), until ``start`` (a new token) or ``taken`` (its down rows began).
    ``hid_sh``: its exponent."""

    def __init__(self, unit):
        self.u = u = unit
        super().__init__({
            "start": In(1), "taken": In(1),
            "valid": In(1), "row": In(range(max(u.E, u.d, u.f))), "seg": In(range(u.nseg)),
            "prod": In(signed(PROD_BITS + 1)),
            "h": Out(data.ArrayLayout(signed(8), u.nb_f * u.pb)),
            "h_ok": Out(1), "h_seg": Out(range(u.nseg)),
            "hid_sh": Out(range(PROD_BITS - 6)),     # 0..8
        })

    def elaborate(self, platform):
        m = Module()
        u = self.u
        f, pb, nb_f, fm, plan = u.f, u.pb, u.nb_f, u.fm, u.plan
        delays = plan.delays
        pbuf = [Signal(signed(PROD_BITS + 1), name=f"pbuf{j}") for j in range(f)]
        pbuf_padded = pbuf + [Const(0, signed(PROD_BITS + 1))] * (nb_f * pb - f)
        orb = Signal(PROD_BITS)                 # OR of |prod| so far in this expert
        hid_sh = self.hid_sh
        half_sh = Signal(PROD_BITS - 7)         # the rounding constant 2**(sh-1) (0 for sh = 0)
        exp_go = Signal()                       # orb is final: find the exponent next
        exp_seg = Signal(range(u.nseg))
        conv_busy = Signal()
        conv_j = Signal(range(nb_f))
        conv_seg = Signal(range(u.nseg))
        prod16 = self.prod
        magnitude = Mux(prod16 < 0, -prod16, prod16)[:PROD_BITS]
        with m.If(self.valid):
            for j in range(f):
                with m.If(self.row == j):
                    m.d.sync += pbuf[j].eq(prod16)
            m.d.sync += orb.eq(Mux(self.row == 0, 0, orb) | magnitude)
            with m.If(self.row == f - 1):
                m.d.sync += [exp_go.eq(1), exp_seg.eq(self.seg)]
        # a cycle later, orb final: the leading one gives sh = max(0, bitlen - 7)
        with m.If(exp_go):
            bl = Signal(range(PROD_BITS + 1))
            for i in range(PROD_BITS):
                with m.If(orb[i]):
                    m.d.comb += bl.eq(i + 1)
            sh_new = Mux(bl > fm.act_bits - 1, bl - (fm.act_bits - 1), 0).as_unsigned()[:4]
            m.d.sync += [exp_go.eq(0), hid_sh.eq(sh_new), half_sh.eq((Const(1, PROD_BITS - 6) << sh_new) >> 1),
                         conv_busy.eq(1), conv_j.eq(0), conv_seg.eq(exp_seg)]

        # the hidden vector, pb values per cycle
        with m.If(conv_busy):
            m.d.sync += conv_j.eq(conv_j + 1)
            with m.If(conv_j == nb_f - 1):
                m.d.sync += conv_busy.eq(0)
        cv = Pipe(m, plan, "cv")
        live = {"valid": conv_busy, "j": conv_j, "last": conv_j == nb_f - 1}
        live = cv.spend(delays.mux_level * max(1, (nb_f - 1).bit_length()), live)
        lanes_in = [Array(pbuf_padded[j * pb + i] for j in range(nb_f))[live["j"]] for i in range(pb)]
        live = cv.spend(delays.adder(PROD_BITS + 2), {**live, "v": lanes_in})
        rounded = [prefix_add(m, sign_extend(v, PROD_BITS + 2), half_sh, name=f"cv_round{i}",
                              width=PROD_BITS + 2)
                   for i, v in enumerate(live.pop("v"))]
        live = cv.spend(delays.mux_level * len(hid_sh), {**live, "v": rounded})
        shifted = [(v.as_signed() >> hid_sh) for v in live.pop("v")]
        # hid_sh fans out to pb x 17 shift muxes (a buffer tree of ~0.7 ns on small): the
        # saturation goes to the next stage, whatever the plan says
        live = cv.register({**live, "v": shifted})
        live = cv.spend(delays.saturate, live)
        live = cv.register({**live, "v": [saturate(v, fm.hid_bits) for v in live.pop("v")]})
        with m.If(self.start | self.taken):
            m.d.sync += self.h_ok.eq(0)
        with m.If(live["valid"]):
            for j in range(nb_f):
                with m.If(live["j"] == j):
                    m.d.sync += [self.h[j * pb + i].eq(v) for i, v in enumerate(live["v"])]
            with m.If(live["last"]):
                m.d.sync += [self.h_ok.eq(1), self.h_seg.eq(conv_seg)]
        return m
