"""Vector normalisation by a per-vector multiplier: L2 norm of q and k, RMSNorm of o.

Implements ``model.int_ops.int_normalize`` for one row ``x`` of ``n``
elements, bit for bit:

    ss      = max(sum x_i^2 + eps_int, 1)
    (y, E)  = rsqrt(ss)                               hw/arith/rsqrt.py
    m_r     = rs(y * m, rsqrt_frac + 1);  s_r = E + s - rsqrt_frac - 1
    out_i   = sat_out(rs(x_i * m_r, s_r))             one element per cycle

(eps_int, m, s) are run-time inputs, one set per mode on ``norms`` (the
owner ties them to its parameter bank, hw/image/param_map.py: ``kda.q_norm`` ...,
``attn_norm``); ``mode`` picks one per run, so the q, k and o norms share this
unit and its rsqrt.  The widths follow from the parameter fields, not from the
values: the sum starts at eps (a field as wide as the sum of squares), and
the shift s (5 bits) sets how far s_r can reach.  The parameters must be
stable while the unit runs (the mode's m and s are registered at ``start``).

The unit reads its input by index (``rd_idx`` -> ``rd_x``, combinational, from
the owner's register file) and writes by index (``wr_en``, ``wr_idx``,
``wr_y``), because the owner keeps the vectors in registers anyway.
Elements go through a three-stage pipeline (read, multiply, accumulate or
shift); cycles per row: 2 n + rsqrt latency + the sum's resolve stages + 10.
"""
from __future__ import annotations

from amaranth import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import barrel_shift_saturate, booth_multiply
from hw.arith.carry_save import compress_3_2, pipelined_add
from hw.arith.pipeline import Pipe, plan_pipeline
from hw.arith.rsqrt import Rsqrt, rsqrt_client_signature, rsqrt_norm_table
from moekda.formats import Formats


def norm_layout(eps_bits: int, mult_bits: int, s_bits: int = 5) -> data.StructLayout:
    """One mode's parameters, laid out as hw/image/param_map.py's ``<norm>.eps_int|m|s`` fields."""
    return data.StructLayout({"eps_int": unsigned(eps_bits), "m": unsigned(mult_bits), "s": unsigned(s_bits)})


def norm_rsqrt_bits(ss_bits: int, params) -> int:
    """Input width of a Normalizer's rsqrt: a sum of squares (< 2**ss_bits) plus eps (the
    ``eps_int`` field of ``params``)."""
    return max(ss_bits, params["eps_int"].shape.width) + 1


class Normalizer(wiring.Component):
    def __init__(self, fm: Formats, n: int, in_bits: int, ss_bits: int, out_bits, params,
                 clock_period_ns: float, shared_rsqrt: bool = False):
        """``out_bits``: one output width per mode (the number of modes); ``params``: the
        layout of one mode's (eps_int, m, s), e.g. ``param_layout(cfg, "kda.q_norm")``
        (or ``norm_layout``), from which the widths are taken; ``clock_period_ns``
        (hw.clock_period_ns) sets the depth of the product pipelines; ``shared_rsqrt``:
        no rsqrt of its own, the ``rsqrt`` port to one the owner shares
        (hw/arith/rsqrt.py SharedRsqrt)."""
        self.shared_rsqrt = shared_rsqrt
        self.clock_period_ns = clock_period_ns
        out_bits = [int(b) for b in out_bits]
        if not out_bits:
            raise ValueError("normalizer: at least one mode")
        self.fm, self.n, self.in_bits, self.ss_bits = fm, n, in_bits, ss_bits
        self.mode_bits = out_bits
        self.modes = len(out_bits)
        self.out_bits = max(out_bits)
        layout = data.StructLayout({"eps_int": params["eps_int"].shape, "m": params["m"].shape,
                                    "s": params["s"].shape})
        if any(layout[k].shape.signed for k in ("eps_int", "m", "s")):
            raise ValueError("normalizer: eps_int, m and s are unsigned fields")
        self.eps_bits = layout["eps_int"].shape.width
        self.m_bits = layout["m"].shape.width
        self.s_bits = layout["s"].shape.width
        self.rs_bits = norm_rsqrt_bits(ss_bits, params)
        super().__init__({
            "start": In(1),
            "mode": In(range(max(2, self.modes))),
            "norms": In(data.ArrayLayout(layout, self.modes)),
            "busy": Out(1),
            "rd_idx": Out(range(n)),
            "rd_x": In(signed(in_bits)),
            "wr_en": Out(1),
            "wr_idx": Out(range(n)),
            "wr_y": Out(signed(self.out_bits)),
            **({"rsqrt": Out(rsqrt_client_signature(fm, self.rs_bits))} if shared_rsqrt else {}),
        })

    def elaborate(self, platform):
        m = Module()
        fm = self.fm
        frac = fm.rsqrt_frac
        plan = plan_pipeline(self.clock_period_ns)
        if self.shared_rsqrt:
            rsq = self.rsqrt
        else:
            m.submodules.rsqrt = rsq = Rsqrt(fm, self.rs_bits, self.clock_period_ns)

        mode = Signal.like(self.mode)
        idx = Signal(range(self.n))
        # the sum of squares starts at eps (rather than eps being added at the end) and
        # accumulates in carry-save form (one 3:2 level per square); the pair is
        # resolved once per row over clock-derived stages before rsqrt
        ss = [Signal(self.rs_bits, name="ss_s"), Signal(self.rs_bits, name="ss_c")]
        m_r = Signal(fm.mult_bits + 1)
        # s_r = E + s - frac - 1 is at most this (E is largest for the widest ss, s for
        # the largest value its field holds)
        e_max = max(E for _, _, E in rsqrt_norm_table(fm, self.rs_bits).values())
        s_max = e_max + (1 << self.s_bits) - 1 - frac - 1
        s_r = Signal(range(max(2, s_max + 1)))
        half = Signal(max(1, s_max))   # 2**(s_r-1) in the scale pass, 0 in the squares pass
        eps = self.norms[self.mode].eps_int
        # the run's m and s, registered at start (no path from the inputs into the product)
        mul = Signal(self.m_bits, name="norm_m")
        sft = Signal(self.s_bits, name="norm_s")

        # ---- m_r = rs(y * m, frac + 1): a pipelined product, started once per row
        ym_go = Signal()
        ym = Pipe(m, plan, "norm_ym")
        ym_live = booth_multiply(ym, {"valid": ym_go}, rsq.o.payload.y, mul,
                                 fm.rsqrt_frac + fm.mult_bits + 4, "p", extra_words=[Const(1 << frac)])
        ym_live = ym.register(ym_live)

        # ---- the element pipeline shared by both passes:
        #   x = the owner's register read (registered with the other operand), then
        #   x*x or x*m_r + half (Booth, clock-derived stages); squares: accumulate;
        #   scale: shift by s_r (one barrel level per bit), saturate, write
        issue = Signal()
        scaling = Signal()                      # pass 2 (scale) rather than pass 1 (squares)
        m.d.comb += self.rd_idx.eq(idx)
        b_bits = max(self.in_bits, fm.mult_bits + 2)
        v1, i1, w1 = Signal(), Signal(range(self.n)), Signal()
        x1, b1 = Signal(signed(self.in_bits)), Signal(signed(b_bits))
        m.d.sync += [v1.eq(issue), i1.eq(idx), w1.eq(scaling), x1.eq(self.rd_x),
                     b1.eq(Mux(scaling, m_r, self.rd_x))]
        pw = 2 * self.in_bits + fm.mult_bits + 3
        el = Pipe(m, plan, "norm_el")
        # b1 fans out to every Booth digit select of the row, and ``half`` (as wide as the
        # s field's whole range allows) is one more word up to the product's high bits:
        # charged as a mux level more (small at 1 ns was 0.031 ns short on b1 -> the tree)
        live = el.spend(plan.delays.mux_level, {"valid": v1, "idx": i1, "w": w1})
        live = booth_multiply(el, live, x1, b1, pw, "p", extra_words=[half])
        # squares: one register, then the running sum (its own carry chain)
        sq_valid, sq_p = Signal(), Signal(self.ss_bits)
        m.d.sync += [sq_valid.eq(live["valid"] & ~live["w"]), sq_p.eq(live["p"])]
        with m.If(sq_valid):
            s_next, c_next = compress_3_2(ss[0], ss[1], sq_p, self.rs_bits)
            m.d.sync += [ss[0].eq(s_next), ss[1].eq(c_next)]
        rs_go = Signal()
        rp = Pipe(m, plan, "norm_ss")
        rs_live = pipelined_add(rp, {"valid": rs_go, "a": ss[0], "b": ss[1]}, "a", "b", "total", self.rs_bits)
        rs_live = rp.register(rs_live)
        # the shift by s_r and the saturation (hw/arith/booth_multiply.py's shared barrel): s_r is
        # stable over the scale pass, so it steers the barrel from its register.  Each bit of
        # s_r steers a whole barrel level (pw muxes): charge its buffer tree as one more mux
        # level (measured: tiny layer -0.022 ns on s_r -> wr_y without it)
        live = barrel_shift_saturate(el, {**live, "sr": s_r}, "p", "sr", pw, len(s_r), "y", self.mode_bits,
                                     sel=mode, fanout_levels=1)
        live.pop("sr")
        y = live.pop("y")
        if len(y) < self.out_bits:
            y_w = Signal(signed(self.out_bits), name="norm_y")
            m.d.comb += y_w.eq(y)
            y = y_w
        live = el.register({**live, "y": y})
        m.d.comb += [self.wr_en.eq(live["valid"] & live["w"]), self.wr_idx.eq(live["idx"]),
                     self.wr_y.eq(live["y"])]
        # elements issued and not yet out of the pipeline (the depth follows from the clock)
        pending = Signal(range(self.n + el.stages + 3))
        m.d.sync += pending.eq(pending + issue - live["valid"])
        in_flight = (pending != 0) | sq_valid

        total = Signal(self.rs_bits)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [mode.eq(self.mode), idx.eq(0), ss[0].eq(eps), ss[1].eq(0), scaling.eq(0),
                                 half.eq(0), mul.eq(self.norms[self.mode].m), sft.eq(self.norms[self.mode].s)]
                    m.next = "SQUARES"
            with m.State("SQUARES"):
                m.d.comb += [self.busy.eq(1), issue.eq(1)]
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == self.n - 1):
                    m.d.sync += idx.eq(0)
                    m.next = "SQ_DRAIN"
            with m.State("SQ_DRAIN"):
                m.d.comb += self.busy.eq(1)
                with m.If(~in_flight):
                    m.d.comb += rs_go.eq(1)
                    m.next = "RESOLVE"
            with m.State("RESOLVE"):
                m.d.comb += self.busy.eq(1)
                with m.If(rs_live["valid"]):
                    m.d.sync += total.eq(rs_live["total"])
                    m.next = "RSQRT"
            with m.State("RSQRT"):
                m.d.comb += [self.busy.eq(1), rsq.i.valid.eq(1), rsq.i.payload.eq(Mux(total == 0, 1, total))]
                with m.If(rsq.i.ready):
                    m.next = "WAIT"
            with m.State("WAIT"):
                # rsqrt's y stays in its register after the hand-over: the product reads it
                m.d.comb += [self.busy.eq(1), rsq.o.ready.eq(1), ym_go.eq(rsq.o.valid)]
                with m.If(rsq.o.valid):
                    m.d.sync += s_r.eq(rsq.o.payload.E + sft - frac - 1)
                    m.next = "MULT"
            with m.State("MULT"):
                m.d.comb += self.busy.eq(1)
                with m.If(ym_live["valid"]):
                    m.d.sync += [m_r.eq(ym_live["p"][frac + 1:]), scaling.eq(1),
                                 half.eq(Mux(s_r == 0, 0, 1 << (s_r - 1)[:len(s_r)]))]
                    m.next = "SCALE"
            with m.State("SCALE"):
                m.d.comb += [self.busy.eq(1), issue.eq(1)]
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == self.n - 1):
                    m.d.sync += idx.eq(0)
                    m.next = "SC_DRAIN"
            with m.State("SC_DRAIN"):
                m.d.comb += self.busy.eq(1)
                with m.If(~in_flight):
                    m.next = "IDLE"
        return m
