"""The MoE unit's beat sequencer: weight-port response beats -> engine beats.

The beats walk the token's phases (hw/moe/phases.py) behind the requests, row by row and
beat by beat (hw/proj/sequencer.py ``RowBeatCounter``).  A beat waits only (a) before the
first down-projection beat of an expert, until that expert's hidden vector is complete
(hw/moe/hidden.py: ~35 + d_ff/port_bytes cycles after its up rows, behind the next expert's
gate rows, so only the last expert's down rows of a token see it), (b) for a routed
expert's down rows, until its weight is known, and on a LatentMoE (c) a routed expert's
gate rows for z and (d) lat_up's rows for zr.
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.moe.phases import DOWN, GATE, LDOWN, LUP, ROUTER, UP, PhaseOrder, bank_of
from hw.proj.sequencer import RowBeatCounter


class MoEBeats(wiring.Component):
    """``start``: a token is accepted (``dense_now`` its kind now, ``dense`` the register
    after).  ``resp_valid`` / ``resp_ready``: the port's beat; ``go``: it goes to the
    engine, at (``seg``, ``mat``, ``row``, ``beat``) of bank ``bank``, ``first`` / ``last``
    of its row.  ``h_ok`` / ``h_seg``: the hidden vector of a segment is complete;
    ``h_taken``: its down rows' first beat goes (h now belongs to them only).  ``dn_seg``:
    the segment whose down rows come next (the one whose up rows ended last)."""

    def __init__(self, unit, idx_shape):
        self.u = u = unit
        ports = {"start": In(1), "dense_now": In(1), **u.kind.port(),
                 "idx": In(idx_shape).array(u.k), "wt_valid": In(1),
                 "h_ok": In(1), "h_seg": In(range(u.nseg)),
                 "resp_valid": In(1), "resp_ready": Out(1), "go": Out(1),
                 "seg": Out(range(u.nseg)), "mat": Out(u.mat_bits), "row": Out(range(max(u.E, u.d, u.f))),
                 "beat": Out(range(max(u.nb_d, u.nb_f))), "first": Out(1), "last": Out(1),
                 "bank": Out(range(u.nbanks)), "h_taken": Out(1), "dn_seg": Out(range(u.nseg))}
        if u.lat:
            ports.update({"z_ok": In(1), "zr_ok": In(1), "routed": Out(1)})
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        u, kind = self.u, self.u.kind
        E, S, d, f, lat, nb_d, nb_f, nb_l = u.E, u.S, u.d, u.f, u.lat, u.nb_d, u.nb_f, u.nb_l
        dense = kind.bit(self)
        c_seg, c_mat, bank = self.seg, self.mat, self.bank     # mat: GATE, UP, DOWN; ROUTER (LDOWN, LUP) in seg 0
        c_busy = Signal()
        m.submodules.rows = rb = RowBeatCounter(max(E, d, f), max(nb_d, nb_f))
        m.d.comb += [self.row.eq(rb.row), self.beat.eq(rb.beat), rb.restart.eq(self.start), rb.step.eq(self.go),
                     self.first.eq(rb.beat == 0), self.last.eq(rb.row_end)]
        with m.If(self.start):
            m.d.sync += [c_seg.eq(kind.pick(self.dense_now, 1, 0)), c_mat.eq(kind.pick(self.dense_now, GATE, ROUTER)),
                         c_busy.eq(1)]
        is_down = c_mat == DOWN
        if lat:
            # a LatentMoE token's routed experts (segments > S) work at the latent width: a
            # register, set as their phases begin (the next segment is known a phase ahead)
            c_routed = self.routed
            with m.Switch(c_mat):
                for mat, (n_rows, n_beats) in {ROUTER: (E, nb_d), LDOWN: (lat, nb_d), LUP: (d, nb_l)}.items():
                    with m.Case(mat):
                        m.d.comb += [rb.last_row.eq(n_rows - 1), rb.last_beat.eq(n_beats - 1)]
                with m.Case(GATE, UP):
                    m.d.comb += [rb.last_row.eq(f - 1), rb.last_beat.eq(Mux(c_routed, nb_l - 1, nb_d - 1))]
                with m.Case(DOWN):
                    m.d.comb += [rb.last_row.eq(Mux(c_routed, lat - 1, d - 1)), rb.last_beat.eq(nb_f - 1)]
        else:
            m.d.comb += [rb.last_beat.eq(Mux(is_down, nb_f - 1, nb_d - 1)),
                         rb.last_row.eq(Mux(c_mat == ROUTER, E - 1, Mux(is_down, d - 1, f - 1)))]
        m.submodules.order = order = PhaseOrder(kind, u.nseg, u.mat_bits)
        m.d.comb += [order.seg.eq(c_seg), order.mat.eq(c_mat)]
        if kind.mixed:
            m.d.comb += order.dense.eq(dense)
        if not u.C:
            m.d.comb += bank.eq(bank_of(kind, dense, self.idx, c_seg, E, S))   # (with dense chunks: a register)
        # (a) a down projection needs this expert's complete hidden vector, (b) a routed
        # expert's down results need its routing weight; LatentMoE: (c) a routed expert's gate
        # rows need z, (d) lat_up's rows need zr
        hold = Signal()
        m.d.comb += hold.eq(is_down & rb.at_start &
                            ~(self.h_ok & (self.h_seg == c_seg) & kind.pick(dense, 1, (c_seg <= S) | self.wt_valid)))
        if lat:
            with m.If(rb.at_start & (((c_mat == GATE) & c_routed & ~self.z_ok) | ((c_mat == LUP) & ~self.zr_ok))):
                m.d.comb += hold.eq(1)
        # the engine is always ready (its results go into a pipeline that never stalls)
        phase_end = Signal()
        m.d.comb += [self.resp_ready.eq(c_busy & ~hold), self.go.eq(self.resp_valid & self.resp_ready),
                     phase_end.eq(self.go & rb.phase_end)]
        if u.C:
            # with the dense chunks' banks the bank selects among E + S + C values of every
            # (m, s): from c_seg through bank_of and that mux into the engine's input register
            # and down_shift was model-small's worst path (-0.04 ns at 1 ns).  So the bank is a
            # register: the next phase's segment's, computed a cycle ahead, taken when a phase
            # ends, and otherwise the current one's (a routed segment's idx may come after its
            # start; its first beat comes later still: requested once idx is valid, one latency
            # on).  A beat's bank is then right as long as no phase is one beat long (>= 2).
            bank_next = Signal.like(bank, name="bank_next")
            m.d.sync += [bank_next.eq(bank_of(kind, dense, self.idx, order.next_seg, E, S)),
                         bank.eq(Mux(phase_end, bank_next, bank_of(kind, dense, self.idx, c_seg, E, S)))]
        m.d.comb += self.h_taken.eq(self.go & is_down & rb.at_start)
        if lat:
            with m.If(self.start):
                m.d.sync += c_routed.eq(0)
            with m.If(phase_end):
                m.d.sync += c_routed.eq(kind.lat_tok(dense) & (order.next_seg > S))   # (lat_up: segment 0)
        with m.If(phase_end & (c_mat == UP)):
            m.d.sync += self.dn_seg.eq(c_seg)
        with m.If(phase_end):
            m.d.sync += [c_seg.eq(order.next_seg), c_mat.eq(order.next_mat)]
            with m.If(order.last):
                m.d.sync += c_busy.eq(0)
        return m
