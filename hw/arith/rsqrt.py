"""Reciprocal square root: even-shift normalisation, seed table, Newton steps.

Implements ``moekda.numerics.rsqrt_fixed`` bit for bit: for an unsigned
integer ``a >= 1`` it returns ``(y, E)`` with ``1/sqrt(a) ~= y * 2**-E``:

1. ``bl`` = bit length of ``a`` (a leading-one detector); ``e`` and the
   normalising shift are constants per ``bl`` (a small case table), which
   brings ``a`` into ``a_norm`` in [2**(N-2), 2**N) by an even shift;
2. seed ``y`` from the top ``seed_bits`` bits of ``a_norm`` (a tiny ROM, next cycle);
3. each Newton step ``y <- y (3 - u y^2) / 2`` is three products
   ``y*y``, ``a_norm*y2``, ``y*(3<<frac - uy2)``, each round-half-up shifted.

One multiplier does all products in turn: the unit is used a few times per
token (L2 norms of q and k, the output RMSNorm of each head), so latency is
cheap and area is not.  The multiplier is a Booth tree whose stage count P
follows from the clock (hw/arith/pipeline.py); the rounding constant of the shift
after each product is one more word of its tree.
Latency: 2 (normalise, seed) + 3 (P + 3) * newton_steps cycles.

Streams: ``i`` payload ``a`` (unsigned ``in_bits``); ``o`` payload
``{y, E}``.  One operation at a time (``i.ready`` is low while busy).
``a == 0`` (not allowed by the model) is treated as ``a == 1``.
"""
from __future__ import annotations

from amaranth import Array, Cat, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import booth_multiply
from hw.arith.pipeline import Pipe, plan_pipeline
from moekda.formats import Formats


def rsqrt_out_layout(fm: Formats) -> data.StructLayout:
    return data.StructLayout({"y": unsigned(fm.rsqrt_frac + 2), "E": signed(8)})


def rsqrt_norm_table(fm: Formats, in_bits: int) -> dict[int, tuple[int, int, int]]:
    """Per bit length of ``a`` (1 .. in_bits): (left shift, right shift, E), a_norm = a << l >> r.
    An entry depends on the bit length only, so a wider unit gives a narrower input's result."""
    N, frac = fm.rsqrt_norm_bits, fm.rsqrt_frac
    table = {}
    for bl in range(1, in_bits + 1):
        e = -((N - bl) // 2)
        table[bl] = (max(-e, 0) * 2, max(e, 0) * 2, frac + N // 2 + e)
    return table


def rsqrt_client_signature(fm: Formats, in_bits: int) -> wiring.Signature:
    """A user's side of an rsqrt it does not own (SharedRsqrt): ``i`` out, ``o`` back in."""
    return wiring.Signature({"i": Out(stream.Signature(unsigned(in_bits))),
                             "o": In(stream.Signature(rsqrt_out_layout(fm)))})


class Rsqrt(wiring.Component):
    def __init__(self, fm: Formats, in_bits: int, clock_period_ns: float):
        """``clock_period_ns`` (hw.clock_period_ns, required) sets the depth of the product pipeline."""
        self.fm = fm
        self.clock_period_ns = clock_period_ns
        self.in_bits = in_bits
        N, frac = fm.rsqrt_norm_bits, fm.rsqrt_frac
        if N % 2:
            raise ValueError(f"rsqrt_norm_bits = {N}: must be even")
        # per bit length: (left shift, right shift, E); a_norm = a << l >> r
        self.norm_table = rsqrt_norm_table(fm, in_bits)
        if any(not -128 <= E < 128 for _, _, E in self.norm_table.values()):
            raise ValueError("rsqrt: exponent does not fit 8 signed bits")
        super().__init__({
            "i": In(stream.Signature(unsigned(in_bits))),
            "o": Out(stream.Signature(rsqrt_out_layout(fm))),
        })

    def elaborate(self, platform):
        m = Module()
        fm = self.fm
        N, frac, sb = fm.rsqrt_norm_bits, fm.rsqrt_frac, fm.rsqrt_seed_bits
        W = frac + 4                   # signed operand width: y <= 2**(frac+1), y2 and uy2 < 2**(frac+3)

        a = Signal(self.in_bits)
        a_norm = Signal(N)
        y = Signal(signed(W))
        y2 = Signal(signed(W + 2))
        uy2 = Signal(signed(W + 2))
        E = Signal(signed(8))
        step = Signal(range(max(2, fm.rsqrt_newton_steps + 1)))

        # leading-one detector: bit length of a (a == 0 counts as 1)
        bl = Signal(range(self.in_bits + 1))
        m.d.comb += bl.eq(1)
        for b in range(1, self.in_bits):
            with m.If(a[b]):
                m.d.comb += bl.eq(b + 1)

        # the bit length is registered (state LOD) before the shift it selects: the
        # detector and the wide shift in one cycle were the small config's longest path
        bl_r = Signal.like(bl)
        norm = Signal(N)
        exp = Signal(signed(8))
        with m.Switch(bl_r):
            for k, (left, right, e_out) in self.norm_table.items():
                with m.Case(k):
                    m.d.comb += [norm.eq((a << left) >> right), exp.eq(e_out)]

        seed = Array(int(v) for v in fm.rsqrt_seed)
        seed_idx = (a_norm >> (N - sb)) - (1 << (sb - 2))

        # the one multiplier: operands and the rounding constant 2**(s-1) of the shift
        # that follows are registered by the issuing state, the product + rounding
        # is a Booth tree over clock-derived stages (hw/arith/booth_multiply.py), and the
        # matching _R state waits for it and takes the shifted bits
        op_a = Signal(signed(W + 2))
        op_b = Signal(signed(W + N // 2 + 2))
        rnd = Signal(max(frac, N) + 1)
        go = Signal()
        m.d.sync += go.eq(0)
        pipe = Pipe(m, plan_pipeline(self.clock_period_ns), "rsqrt_mul")
        live = booth_multiply(pipe, {"valid": go}, op_b, op_a, 2 * W + N + 5, "p", extra_words=[rnd])
        live = pipe.register(live)
        prod_valid, prod = live["valid"], live["p"]
        self.mul_stages = pipe.stages

        def issue(a, b, s):
            return [op_a.eq(a), op_b.eq(b), rnd.eq(1 << (s - 1)), go.eq(1)]

        m.d.comb += [self.o.payload.y.eq(y), self.o.payload.E.eq(E)]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [a.eq(self.i.payload), step.eq(0)]
                    m.next = "LOD"
            with m.State("LOD"):
                m.d.sync += bl_r.eq(bl)
                m.next = "NORM"
            with m.State("NORM"):
                m.d.sync += [a_norm.eq(norm), E.eq(exp)]
                m.next = "SEED"
            with m.State("SEED"):
                # the seed ROM reads the registered a_norm: the leading-one detector,
                # the shift and the ROM in one cycle were the unit's longest path
                m.d.sync += y.eq(seed[seed_idx])
                m.next = "YY" if fm.rsqrt_newton_steps else "DONE"
            with m.State("YY"):
                m.d.sync += issue(y, y, frac)
                m.next = "YY_R"
            with m.State("YY_R"):
                with m.If(prod_valid):
                    m.d.sync += y2.eq(prod[frac:])
                    m.next = "UY2"
            with m.State("UY2"):
                m.d.sync += issue(y2, a_norm, N)
                m.next = "UY2_R"
            with m.State("UY2_R"):
                with m.If(prod_valid):
                    m.d.sync += uy2.eq(prod[N:])
                    m.next = "STEP"
            with m.State("STEP"):
                m.d.sync += issue((3 << frac) - uy2, y, frac + 1)
                m.next = "STEP_R"
            with m.State("STEP_R"):
                with m.If(prod_valid):
                    m.d.sync += [y.eq(prod[frac + 1:]), step.eq(step + 1)]
                    with m.If(step == fm.rsqrt_newton_steps - 1):
                        m.next = "DONE"
                    with m.Else():
                        m.next = "YY"
            with m.State("DONE"):
                m.d.comb += self.o.valid.eq(1)
                with m.If(self.o.ready):
                    m.next = "IDLE"
        return m


class SharedRsqrt(wiring.Component):
    """One Rsqrt for several users that each need it a few times a token (the layer's
    RMSNorm, the KDA's q, k and o norms: issue 45 item 4, units shared in time).

    Client n's ``c<n>`` (rsqrt_client_signature, its ``in_bits[n]``) is the stream pair of
    an own Rsqrt.  When the unit is free the lowest-numbered client asking is taken (its
    ``i.ready``); the unit remembers whose operation it runs and hands the result to that
    client only.  A client that asks while another's operation runs waits for it (the
    unit's latency, hw/arith/rsqrt.py); docs/chip.md gives what that costs a token.  The
    unit is as wide as the widest client: its result for an input depends on the input
    alone (rsqrt_norm_table), so every client gets what its own unit would give."""

    def __init__(self, fm: Formats, in_bits: list[int], clock_period_ns: float):
        if not in_bits:
            raise ValueError("shared rsqrt: at least one client")
        self.fm, self.in_bits, self.clock_period_ns = fm, list(in_bits), clock_period_ns
        super().__init__({f"c{n}": In(rsqrt_client_signature(fm, b)) for n, b in enumerate(in_bits)})

    def elaborate(self, platform):
        m = Module()
        n = len(self.in_bits)
        m.submodules.rsqrt = rsq = Rsqrt(self.fm, max(self.in_bits), self.clock_period_ns)
        clients = [getattr(self, f"c{k}") for k in range(n)]
        owner = Signal(range(max(2, n)), name="rsqrt_owner")
        grant = Signal(range(max(2, n)), name="rsqrt_grant")
        # fixed priority: the first client asking (the last assignment wins)
        for k in reversed(range(n)):
            with m.If(clients[k].i.valid):
                m.d.comb += grant.eq(k)
        m.d.comb += [rsq.i.valid.eq(Cat(*(c.i.valid for c in clients)).any()),
                     rsq.i.payload.eq(Array(c.i.payload for c in clients)[grant])]
        for k, c in enumerate(clients):
            m.d.comb += [c.i.ready.eq(rsq.i.ready & (grant == k)),
                         c.o.valid.eq(rsq.o.valid & (owner == k)), c.o.payload.eq(rsq.o.payload)]
        m.d.comb += rsq.o.ready.eq(Array(c.o.ready for c in clients)[owner])
        with m.If(rsq.i.valid & rsq.i.ready):
            m.d.sync += owner.eq(grant)
        return m
