"""The order of a MoE token's matrices (phases), and what a token's mixer kind changes.

A token's phases: the router, then for each segment s its gate rows, the previous
segment's down rows, its up rows, and last the last segment's down rows:

    R, G1, U1, G2, D1, U2, G3, D2, U3, D3

so the engine streams the next expert's gate rows while this expert's products become its
hidden vector (the down rows wait for it), and only the last expert's down rows wait (the
conversion: ~35 + d_ff/port_bytes cycles).  A LatentMoE token has lat_down after the router
(segment 0: z before any routed expert needs it) and lat_up last (its rows wait for zr, the
requantised routed sum):

    R, LD, G1, U1, G2, D1, ..., U3, D3, LU

The requests (hw/moe/requests.py) and the beats (hw/moe/beats.py) each walk this order with
a ``PhaseOrder`` of their own: the requests run ahead of the beats.
"""
from __future__ import annotations

from amaranth.hdl import Array, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

# the matrices of a token (a phase each); LDOWN, LUP: a LatentMoE's projections
ROUTER, GATE, UP, DOWN, LDOWN, LUP = range(6)
PROD_BITS = 15   # |SiLU(gate) * up| of two int8 values < 2**15


class TokenKind:
    """The mixer kinds of the layers on the unit (``mixers``: "moe" / "dense" per layer).
    With one kind the token's kind is a constant and no logic depends on it; with both it
    is a bit (``dense``: a register set at acceptance), and the values a kind picks are
    muxed by it."""

    def __init__(self, mixers, C: int, nseg_moe: int, lat: int):
        self.has_dense = "dense" in mixers
        self.mixed = len(set(mixers)) > 1
        self.C, self.nseg_moe, self.lat = C, nseg_moe, lat

    def pick(self, dense_bit, dense, moe):
        """The dense layer's value or the MoE layer's, by the token's mixer kind."""
        if not self.mixed:
            return dense if self.has_dense else moe
        return Mux(dense_bit, dense, moe)

    def seg_last(self, dense_bit):
        """The token's last segment (S + k, or C for a dense layer's token)."""
        return self.pick(dense_bit, self.C, self.nseg_moe - 1)

    def lat_tok(self, dense_bit):
        """A LatentMoE token: every MoE layer's (model.moe_latent is the model's); a dense
        layer's token has no latent."""
        return Value.cast(self.pick(dense_bit, 0, 1)) if self.lat else Const(0, 1)

    def port(self):
        """The ``dense`` port a component needs: only with both kinds."""
        return {"dense": In(1)} if self.mixed else {}

    def bit(self, component):
        return component.dense if self.mixed else None


def bank_of(kind: TokenKind, dense_bit, idx, seg, E: int, S: int):
    """The bank of segment ``seg``: shared experts E.., the chosen ones by ``idx`` (the
    top-k's indices in rank order), a dense layer's chunks E + S.."""
    rank = (seg - 1 - S)[:len(idx[0]) + 8]
    return kind.pick(dense_bit, E + S + seg - 1, Mux(seg <= S, E + seg - 1, Array(idx)[rank]))


class PhaseOrder(wiring.Component):
    """(segment, matrix) of the phase after (``seg``, ``mat``), and whether (seg, mat) is
    the token's last (comb)."""

    def __init__(self, kind: TokenKind, nseg: int, mat_bits: int):
        self.kind = kind
        super().__init__({"seg": In(range(nseg + 1)), "mat": In(mat_bits), **kind.port(),
                          "next_seg": Out(range(nseg + 1)), "next_mat": Out(mat_bits), "last": Out(1)})

    def elaborate(self, platform):
        m = Module()
        seg, kind = self.seg, self.kind
        dense = kind.bit(self)
        seg_last, lat_tok = kind.seg_last(dense), kind.lat_tok(dense)
        n_seg, n_mat, last = self.next_seg, self.next_mat, self.last
        with m.Switch(self.mat):
            with m.Case(ROUTER):
                m.d.comb += [n_seg.eq(Mux(lat_tok, 0, 1)), n_mat.eq(Mux(lat_tok, LDOWN, GATE))]
            with m.Case(GATE):
                m.d.comb += [n_seg.eq(Mux(seg == 1, seg, seg - 1)), n_mat.eq(Mux(seg == 1, UP, DOWN))]
            with m.Case(UP):
                m.d.comb += [n_seg.eq(Mux(seg == seg_last, seg, seg + 1)),
                             n_mat.eq(Mux(seg == seg_last, DOWN, GATE))]
            with m.Case(DOWN):
                m.d.comb += [n_seg.eq(Mux(lat_tok & (seg == seg_last), 0, seg + 1)),
                             n_mat.eq(Mux(lat_tok & (seg == seg_last), LUP, UP)),
                             last.eq(~lat_tok & (seg == seg_last))]
            if kind.lat:
                with m.Case(LDOWN):
                    m.d.comb += [n_seg.eq(1), n_mat.eq(GATE)]
                with m.Case(LUP):
                    m.d.comb += last.eq(1)
        return m


def register(m: Module, name: str, shape, value, reset_less: bool = True) -> Signal:
    """``value`` a cycle later: a pipeline register of the unit's result stages (data
    reset-less: no valid bit points at it after reset)."""
    r = Signal(shape, name=name, reset_less=reset_less)
    m.d.sync += r.eq(value)
    return r


def per_bank(unit, prm, dprm, name) -> list:
    """The E routed experts' then the S shared experts' (then the C dense chunks') ``name``
    (gate_m, ...) of the parameter views ``prm`` / ``dprm``, one per bank: banks 0..E-1
    routed, E..E+S-1 shared, E+S.. dense (Array(...)[bank] picks the token's)."""
    vals = [prm.routed[name][e] for e in range(unit.E)]
    if unit.S:
        vals += [prm.shared[name][j] for j in range(unit.S)]
    if unit.C:
        vals += [dprm.chunks[name][c] for c in range(unit.C)]
    return [Value.cast(v) for v in vals]


def param_ports(unit) -> dict:
    """The unit's parameter ports, for a part of the unit that reads them (``params`` and,
    with a dense layer, ``dense_params``)."""
    from hw.image.param_map import param_layout
    ports = {"params": In(param_layout(unit.cfg, "moe"))}
    if unit.has_dense:
        ports["dense_params"] = In(param_layout(unit.cfg, "dense", mixer="dense"))
    return ports
