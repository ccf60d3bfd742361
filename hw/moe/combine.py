"""The MoE unit's combine (stage V of its result pipeline) and a LatentMoE's zr.

The last segment's sums are requantised by (comb_m, comb_s): a Booth tree with the rounding
word, one split add, the barrel shift by comb_s (clamped to the product's width: a larger
shift gives 0 as well), saturation in its own stage, then into the output (rows arrive in
order: a shift register, no row decode).  A LatentMoE token passes twice: its last (routed)
segment's sums, in racc, become zr by (lat_m, lat_s) (int8: the resid_bits result saturated
once more, as sat8(sat16(v)) == sat8(v)); then lat_up's rows, in acc, the output by
(comb_m, comb_s).  With K3's exit norm (model.latent_exit_norm) the sum by (lat_m, lat_s)
goes at resid_bits into zp, and the unit's own normaliser (hw/kda/norm.py, the layers'
integer RMSNorm) writes zr from it.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import barrel_shift_saturate, booth_multiply, clamp_shift, rounding_word
from hw.arith.matvec import saturate
from hw.arith.pipeline import Pipe
from hw.image.param_map import lat_norm_ss_bits, param_layout
from hw.kda.norm import Normalizer
from hw.moe.phases import DOWN, LUP, param_ports
from moekda.config import ConfigError


class MoECombine(wiring.Component):
    """``u_*``: the sums of the result pipeline (hw/moe/sums.py).  ``y``: the token's output,
    complete when ``done`` (its last row goes in this cycle).  ``zr`` / ``zr_ok`` (LatentMoE):
    lat_up's input, complete (cleared at ``start``)."""

    def __init__(self, unit, row_shape, seg_shape, val_bits: int):
        self.u = u = unit
        ports = {"start": In(1), **u.kind.port(), **param_ports(u),
                 "u_valid": In(1), "u_kind": In(u.mat_bits), "u_row": In(row_shape), "u_seg": In(seg_shape),
                 "u_racc": In(1), "u_val": In(signed(val_bits)),
                 "y": Out(data.ArrayLayout(signed(u.out_bits), u.d)), "done": Out(1)}
        if u.lat:
            ports.update({"zr": Out(data.ArrayLayout(signed(8), u.lat)), "zr_ok": Out(1)})
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        u, fm, plan, kind = self.u, self.u.fm, self.u.plan, self.u.kind
        d, lat, acc_bits = u.d, u.lat, u.acc_bits
        dense = kind.bit(self)
        prm, dprm = self.params, (self.dense_params if u.has_dense else None)
        comb = Pipe(m, plan, "comb")
        last_seg = self.u_seg == kind.seg_last(dense)
        live = {"valid": self.u_valid & (((self.u_kind == DOWN) & last_seg) | ((self.u_kind == LUP) if lat else 0)),
                "row": self.u_row}
        if lat:
            live["zr"] = self.u_racc
        comb_m_bits = u.pmap["moe.comb_m"].bits
        prod_signed = acc_bits + comb_m_bits          # |acc * comb_m| < 2**(prod_signed - 1)
        rq_bits = prod_signed + 1                     # + the rounding of a shift by prod_signed
        # the static (m, s) and the rounding word decoded from s are registered once, a
        # cycle behind the bank: no path runs from the bank through the clamp and the
        # decode into the product tree
        comb_m = Signal(comb_m_bits, name="comb_mult", reset_less=True)
        comb_s = Signal(range(prod_signed + 1), name="comb_shift", reset_less=True)
        comb_rnd = Signal(rq_bits, name="comb_rounding", reset_less=True)
        # (and by the token's kind: a dense layer's token takes dense_params' pair)
        prm_comb_m = kind.pick(dense, dprm.comb_m, prm.comb_m) if dprm is not None else prm.comb_m
        prm_comb_s = kind.pick(dense, dprm.comb_s, prm.comb_s) if dprm is not None else prm.comb_s
        if lat:
            # (and the LatentMoE's pair until zr is complete: set long before lat_up's rows come)
            if u.pmap["moe.lat_m"].bits != comb_m_bits:
                raise ConfigError("parameters moe.lat_m and moe.comb_m: the combine needs one width")
            lat_phase = kind.lat_tok(dense) & ~self.zr_ok
            prm_comb_m = Mux(lat_phase, prm.lat_m, prm_comb_m)
            prm_comb_s = Mux(lat_phase, prm.lat_s, prm_comb_s)
        m.d.sync += [comb_m.eq(prm_comb_m), comb_s.eq(clamp_shift(prm_comb_s, prod_signed)),
                     comb_rnd.eq(rounding_word(clamp_shift(prm_comb_s, prod_signed), rq_bits))]
        live = booth_multiply(comb, live, self.u_val[:acc_bits].as_signed(), comb_m, rq_bits, "p",
                              extra_words=[comb_rnd])
        # the shift travels with the value (a copy per stage) rather than being read from
        # comb_shift at every level: one register steering every level was the small
        # unit's worst path (its fan-out buffers, -0.026 ns at 1 ns)
        live = barrel_shift_saturate(comb, {**live, "comb_s": comb_s}, "p", "comb_s", rq_bits, len(comb_s), "y",
                                     out_widths=[u.out_bits])
        live.pop("comb_s")
        live = comb.register(live)
        # rows arrive in order: the output (and zr) is a shift register, no row decode
        out_row = live["valid"] & ~live["zr"] if lat else live["valid"]
        with m.If(out_row):
            m.d.sync += self.y.as_value().eq(Cat(self.y.as_value()[u.out_bits:], live["y"]))
        m.d.comb += self.done.eq(out_row & (live["row"] == d - 1))
        if lat:
            with m.If(self.start):
                m.d.sync += self.zr_ok.eq(0)
        if lat and not u.exit_norm:
            zr = self.zr.as_value()
            with m.If(live["valid"] & live["zr"]):
                m.d.sync += zr.eq(Cat(zr[8:], saturate(live["y"], fm.act_bits)))
                with m.If(live["row"] == lat - 1):
                    m.d.sync += self.zr_ok.eq(1)
        if u.exit_norm:
            self.exit_norm(m, live)
        return m

    def exit_norm(self, m, live):
        """K3's exit norm: the sum by (lat_m, lat_s) at resid_bits into zp (a shift register,
        rows in order), then its RMSNorm writes zr by index; lat_up's rows wait for zr_ok as
        before.  The unit has its own normaliser: the chip's shared one (hw/chip/datapath.py)
        serves the other stage's token meanwhile, and this one runs once a token for l values
        (2 l + ~30 cycles), on the token's critical chain."""
        u, fm, lat = self.u, self.u.fm, self.u.lat
        zp = [Signal(signed(u.out_bits), name=f"zp{j}") for j in range(lat)]
        m.submodules.exit_norm = nrm = Normalizer(fm, lat, u.out_bits, lat_norm_ss_bits(u.cfg), [fm.act_bits],
                                                  param_layout(u.cfg, "moe.lat_norm"),
                                                  clock_period_ns=u.cfg.hw.clock_period_ns)
        zp_full = Signal()          # the last row is in zp: start the norm next cycle
        nrm_run = Signal()
        m.d.comb += [nrm.norms[0].eq(self.params.lat_norm), nrm.mode.eq(0), nrm.rd_x.eq(Array(zp)[nrm.rd_idx]),
                     nrm.start.eq(zp_full)]
        m.d.sync += zp_full.eq(0)
        with m.If(live["valid"] & live["zr"]):
            m.d.sync += Cat(*zp).eq(Cat(*zp[1:], live["y"]))
            with m.If(live["row"] == lat - 1):
                m.d.sync += zp_full.eq(1)
        with m.If(nrm.wr_en):
            for j in range(lat):
                with m.If(nrm.wr_idx == j):
                    m.d.sync += self.zr[j].eq(nrm.wr_y)
        with m.If(zp_full):
            m.d.sync += nrm_run.eq(1)
        with m.Elif(nrm_run & ~nrm.busy):
            m.d.sync += [nrm_run.eq(0), self.zr_ok.eq(1)]
