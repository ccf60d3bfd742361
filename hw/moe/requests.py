"""A MoE token's weight requests: one a phase (hw/moe/phases.py), each issued as soon as
the port takes the previous one; a routed expert's wait for the top-k's indices (they come
while the shared experts stream, so the memory latency is hidden when n_shared >= 1).

Every weight address is a per-layer constant of the memory map (``layer_prefix``): the
router's and each bank's address are a lookup of constants by (layer, bank, matrix).  On a
model the lookup goes into a request address register (a request goes a cycle after the
previous one is taken, hidden behind its beats; the token's first address is loaded at
acceptance); on the layer chip the address is combinational.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.moe.phases import DOWN, GATE, LDOWN, LUP, ROUTER, UP, PhaseOrder, bank_of


class MoERequests(wiring.Component):
    """``start``: a token is accepted (``layer`` its layer, ``dense_now`` its kind, both the
    ports' values now; ``dense`` the kind's register after).  ``idx`` / ``idx_valid``: the
    top-k's indices.  ``valid`` / ``ready`` / ``addr`` / ``beats``: the weight request.
    ``unit``: the MoEUnit whose config-derived sizes and addresses this reads."""

    def __init__(self, unit, idx_shape):
        self.u = u = unit
        self.addr_shape = range(max(self._addr(l, b, mat) for l in range(u.L) for b in range(u.nbanks)
                                    for mat in range(u.nmat)) + 1)
        ports = {"start": In(1), "layer": In(len(u.layer)), "dense_now": In(1), **u.kind.port(),
                 "idx": In(idx_shape).array(u.k), "idx_valid": In(1),
                 "valid": Out(1), "ready": In(1), "addr": Out(self.addr_shape), "beats": Out(16)}
        super().__init__(ports)

    def _addr(self, l, b, mat):
        """The address of matrix ``mat`` of bank b of layer l (the router's for ROUTER, the
        layer's LatentMoE projection for LDOWN / LUP, whatever the bank)."""
        u = self.u
        if mat == ROUTER:
            return u.router_addr[l]
        if mat in (LDOWN, LUP):
            return u.lat_addr[l].get(mat, 0)
        return u.bank_addr[l][b].get(mat, 0) if b < u.nbanks else 0

    def elaborate(self, platform):
        m = Module()
        u, kind = self.u, self.u.kind
        E, S, L, f, d, lat, nb_d, nb_f, nb_l = u.E, u.S, u.L, u.f, u.d, u.lat, u.nb_d, u.nb_f, u.nb_l
        dense = kind.bit(self)
        rq_seg = Signal(range(u.nseg + 1))
        rq_mat = Signal(u.mat_bits)
        rq_busy = Signal()
        rq_bank = Signal(range(u.nbanks), name="rq_bank")
        m.d.comb += rq_bank.eq(bank_of(kind, dense, self.idx, rq_seg, E, S))
        nb, nmat_idx = 1 << len(rq_bank), 1 << u.mat_bits
        # one constant per (layer, bank, matrix): a lookup of a few address bits, no adder (a
        # dense layer's layout is not a MoE layer's)
        if L == 1:
            phase_addrs = Array(Const(self._addr(0, b, mat), self.addr_shape)
                                for b in range(nb) for mat in range(nmat_idx))
            rq_addr = phase_addrs[Cat(rq_mat, rq_bank)]
        else:
            layer_r = Signal(len(self.layer), name="layer_r")
            with m.If(self.start):
                m.d.sync += layer_r.eq(self.layer)
            phase_addrs = Array(Const(self._addr(min(l, L - 1), b, mat), self.addr_shape)
                                for l in range(1 << len(layer_r)) for b in range(nb) for mat in range(nmat_idx))
            rq_addr = phase_addrs[Cat(rq_mat, rq_bank, layer_r)]
        # rq_seg <= S as a register (the compare in front of the arbiter's grant and the
        # chip's request register was on small's worst path with run-time parameters);
        # a dense layer's segments never wait for the router
        rq_fixed = Signal()
        if L == 1:
            m.d.comb += [self.valid.eq(rq_busy & (rq_fixed | self.idx_valid)), self.addr.eq(rq_addr)]
        else:
            # the (layer, bank) lookup after bank_of made the address path to the port
            # model-small's worst (-0.08 ns at 1 ns, before the arbiter): the address is a
            # register, a cycle behind rq_seg and idx, so a request waits a cycle after the
            # previous one is taken (hidden: each streams >= E row beats) and a routed one a
            # cycle after idx is valid; the token's first address is loaded at acceptance
            # (the router's, or a dense layer's first chunk), so the first request is not late
            rq_addr_r = Signal(self.addr_shape, name="rq_addr")
            rq_moved = Signal(name="rq_moved")
            idx_valid_r = Signal(name="idx_valid_r")
            first_addr = Array(Const(u.router_addr[l] if u.mixers[l] == "moe" else
                                     u.bank_addr[l][E + S][GATE], self.addr_shape) for l in range(L))[self.layer]
            m.d.sync += [rq_addr_r.eq(Mux(self.start, first_addr, rq_addr)),
                         rq_moved.eq(self.valid & self.ready), idx_valid_r.eq(self.idx_valid)]
            m.d.comb += [self.valid.eq(rq_busy & ~rq_moved & (rq_fixed | idx_valid_r)), self.addr.eq(rq_addr_r)]
        if lat:
            # a routed expert's matrices are at the latent width: (matrix, routed) -> beats; a
            # MoE token's requests past the shared experts are routed ones (rq_fixed low)
            beats_of = {ROUTER: u.router_beats, LDOWN: lat * nb_d, LUP: d * nb_l}
            for mat, (shared, routed) in {GATE: (f * nb_d, f * nb_l), UP: (f * nb_d, f * nb_l),
                                          DOWN: (d * nb_f, lat * nb_f)}.items():
                beats_of[mat], beats_of[mat + 8] = shared, routed
            phase_beats = Array(beats_of.get(i, 0) for i in range(16))
            m.d.comb += self.beats.eq(phase_beats[Cat(rq_mat, ~rq_fixed)])
        else:
            phase_beats = Array([u.router_beats, f * nb_d, f * nb_d, d * nb_f])
            m.d.comb += self.beats.eq(phase_beats[rq_mat])
        m.submodules.order = order = PhaseOrder(kind, u.nseg, u.mat_bits)
        m.d.comb += [order.seg.eq(rq_seg), order.mat.eq(rq_mat)]
        if kind.mixed:
            m.d.comb += order.dense.eq(dense)
        with m.If(self.start):
            # MoE: the router (segment 0, <= S); dense: segment 1's gate, the first chunk
            m.d.sync += [rq_seg.eq(kind.pick(self.dense_now, 1, 0)), rq_mat.eq(kind.pick(self.dense_now, GATE, ROUTER)),
                         rq_busy.eq(1), rq_fixed.eq(1)]
        with m.If(self.valid & self.ready):
            # a routed expert's matrices wait for its index (segments > S)
            m.d.sync += [rq_seg.eq(order.next_seg), rq_mat.eq(order.next_mat),
                         rq_fixed.eq(kind.pick(dense, 1, order.next_seg <= S))]
            with m.If(order.last):
                m.d.sync += rq_busy.eq(0)
        return m
