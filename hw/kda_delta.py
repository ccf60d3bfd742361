"""The KDA state update and read (the delta rule), ``state_lanes`` entries per cycle.

Implements ``sim.models.int_kda.int_delta_rule`` bit for bit, per head h and
value column j (the state memory is column-major, see hw/kda_state.py):

    pass 1, for each block of ``lanes`` rows i:
        S1_i  = rs(S_ij * alpha_i, alpha_frac)                  decay
        acc  += sum_i k_i * S1_i
    then
        kS    = sat(rs(acc, f_k));  u = sat(rs(beta_h * ((v_j << (f_s - f_v)) - kS), unit_frac))
    pass 2, for each block:
        S1_i  = rs(S_ij * alpha_i, alpha_frac)                  decay again (recomputed, not stored)
        S2_i  = sat(S1_i + rs(k_i * u, f_k))                    written back
        acc  += sum_i q_i * S2_i
    then
        o_hj  = sat_{o_bits}(rs(acc, o_shift))                  one beat on ``o``

rs = round half up shift, sat = saturate to state_bits.  Each column needs
only its own u_j, so the two passes run column by column and nothing wider
than one column is buffered.

Pipeline of a pass (one word read per cycle, tag = row block and pass):
    read -> [A1] S*alpha -> [A2] S1 = rs(.), k*u -> [B] S2 (pass 2) / S1, written back
         -> [C1] lane products -> [C2] their sum -> [D] acc
Pass 2 of column j writes S2 back from [B] and drains into its own
accumulator while pass 1 of column j+1 already reads, so a column costs
2 d_k/lanes read cycles plus the pass-1 drain and u_j (PIPE + 3 cycles):
about heads * d_v * (2 d_k / lanes + PIPE + 3) cycles per token, independent
of how many tokens came before.

Ports: ``start`` (strobe, when not ``busy``) runs one token over the vectors
``k``, ``q``, ``alpha``, ``v``, ``beta`` that must stay stable while ``busy``;
``o`` streams the H*d_v outputs in (h, j) order; ``clear`` makes the state
read as zero (a new sequence), taking effect for the next ``start``.
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth import Array, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.kda_state import StateMemory
from moekda.formats import Formats

PIPE = 6  # stages A1, A2, B, C1, C2, D after the read


@dataclass(frozen=True)
class DeltaShifts:
    """The calibrated fractional-bit positions (QKDA.f_k, f_v, f_s, o_shift)."""
    f_k: int
    f_v: int
    f_s: int
    o_shift: int

    @classmethod
    def of(cls, qkda) -> "DeltaShifts":
        return cls(int(qkda.f_k), int(qkda.f_v), int(qkda.f_s), int(qkda.o_shift))


def round_shift(x, s: int):
    """Round half up arithmetic right shift, as moekda.numerics.round_shift."""
    return x if s == 0 else (x + (1 << (s - 1))) >> s


def saturate(x, bits: int):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return Mux(x > hi, hi, Mux(x < lo, lo, x))


class DeltaRule(wiring.Component):
    def __init__(self, fm: Formats, heads: int, d_k: int, d_v: int, lanes: int, shifts: DeltaShifts):
        if shifts.f_s < shifts.f_v:
            raise ValueError(f"delta rule: f_s = {shifts.f_s} < f_v = {shifts.f_v} (v << (f_s - f_v) needs f_s >= f_v)")
        if min(shifts.f_k, shifts.o_shift) < 0:
            raise ValueError("delta rule: shifts must be non-negative")
        self.fm, self.heads, self.d_k, self.d_v, self.lanes, self.shifts = fm, heads, d_k, d_v, lanes, shifts
        self.blocks = d_k // lanes
        a = fm.qk_bits               # the normalised q and k
        super().__init__({
            "start": In(1),
            "busy": Out(1),
            "clear": In(1),
            "k": In(data.ArrayLayout(signed(a), heads * d_k)),
            "q": In(data.ArrayLayout(signed(a), heads * d_k)),
            "alpha": In(data.ArrayLayout(unsigned(fm.alpha_frac), heads * d_k)),
            "v": In(data.ArrayLayout(signed(fm.qkv_bits), heads * d_v)),
            "beta": In(data.ArrayLayout(unsigned(fm.unit_frac + 1), heads)),
            "o": Out(stream.Signature(signed(fm.o_bits))),
        })

    def elaborate(self, platform):
        m = Module()
        fm, sh = self.fm, self.shifts
        H, dk, dv, P, nb = self.heads, self.d_k, self.d_v, self.lanes, self.blocks
        sb = fm.state_bits
        m.submodules.mem = mem = StateMemory(H, dk, dv, P, sb)

        # lane l of row block g = h*nb + b is row i = b*P + l of head h: flat index g*P + l
        def lane_select(vec, g):
            return [Array(vec[gg * P + l] for gg in range(H * nb))[g] for l in range(P)]

        # ---- control: head h, column j, row block b, pass --------------------------
        h = Signal(range(H))
        j = Signal(range(dv))
        b = Signal(range(nb))
        pass2 = Signal()
        issuing = Signal()
        col_word = Signal(range(mem.words))     # first word of column (h, j)
        u = Signal(signed(sb))
        acc_width = sb + fm.qk_bits + (dk - 1).bit_length() + 1
        acc_k = Signal(signed(acc_width))       # pass 1: sum_i k_i S1_ij
        acc_o = Signal(signed(acc_width))       # pass 2: sum_i q_i S2_ij

        # ---- datapath ----------------------------------------------------------------
        # every stage carries a tag: valid, row block g, pass, word address
        def tag(name, prev=None):
            t = dict(valid=Signal(name=f"{name}_valid"), g=Signal(range(H * nb), name=f"{name}_g"),
                     pass2=Signal(name=f"{name}_pass2"), addr=Signal(range(mem.words), name=f"{name}_addr"))
            if prev is not None:
                m.d.sync += [t[k].eq(prev[k]) for k in t]
            return t

        # read: the word arrives one cycle after the issue
        issue = dict(valid=issuing, g=h * nb + b, pass2=pass2, addr=col_word + b)
        m.d.comb += [mem.rd_en.eq(issuing), mem.rd_addr.eq(issue["addr"])]
        rd = tag("rd", issue)

        # A1: S * alpha
        a1 = tag("a1", rd)
        alpha_l = lane_select(self.alpha, rd["g"])
        a1_p = [Signal(signed(sb + fm.alpha_frac + 1), name=f"a1_p{l}") for l in range(P)]
        m.d.sync += [a1_p[l].eq(mem.rd_data[l] * alpha_l[l]) for l in range(P)]

        # A2: S1 = rs(S * alpha) (decay); k * u for the write, alongside
        a2 = tag("a2", a1)
        k_a1 = lane_select(self.k, a1["g"])
        a_s = [Signal(signed(sb), name=f"a_s{l}") for l in range(P)]
        a_ku = [Signal(signed(sb + fm.qk_bits), name=f"a_ku{l}") for l in range(P)]
        m.d.sync += [a_s[l].eq(round_shift(a1_p[l], fm.alpha_frac)) for l in range(P)]
        m.d.sync += [a_ku[l].eq(k_a1[l] * u) for l in range(P)]

        # B: the rank-1 write S2 = sat(S1 + rs(k u)) in pass 2, S1 passed on in pass 1
        bt = tag("b", a2)
        b_s = [Signal(signed(sb), name=f"b_s{l}") for l in range(P)]
        for l in range(P):
            written = saturate(a_s[l] + round_shift(a_ku[l], sh.f_k), sb)
            m.d.sync += b_s[l].eq(Mux(a2["pass2"], written, a_s[l]))
        m.d.comb += [
            mem.wr_en.eq(bt["valid"] & bt["pass2"]),
            mem.wr_addr.eq(bt["addr"]),
            mem.wr_data.eq(Cat(*b_s)),
        ]

        # C1: lane products k_i * S1_i (pass 1) or q_i * S2_i (pass 2); C2: their sum
        c1 = tag("c1", bt)
        k_b, q_b = lane_select(self.k, bt["g"]), lane_select(self.q, bt["g"])
        c1_p = [Signal(signed(sb + fm.qk_bits), name=f"c1_p{l}") for l in range(P)]
        m.d.sync += [c1_p[l].eq(Mux(bt["pass2"], q_b[l], k_b[l]) * b_s[l]) for l in range(P)]
        c2 = tag("c2", c1)
        c_sum = Signal(signed(sb + fm.qk_bits + (P - 1).bit_length()))
        m.d.sync += c_sum.eq(sum(c1_p))
        c_valid, c_pass2 = c2["valid"], c2["pass2"]

        # D: one accumulator per pass, so pass 2 of column j can drain while
        # pass 1 of column j+1 runs
        acc_k_clear, acc_o_clear = Signal(), Signal()
        with m.If(acc_k_clear):
            m.d.sync += acc_k.eq(0)
        with m.Elif(c_valid & ~c_pass2):
            m.d.sync += acc_k.eq(acc_k + c_sum)
        with m.If(acc_o_clear):
            m.d.sync += acc_o.eq(0)
        with m.Elif(c_valid & c_pass2):
            m.d.sync += acc_o.eq(acc_o + c_sum)

        # reads of each pass whose product is not yet accumulated
        inflight1, inflight2 = Signal(range(PIPE + 2)), Signal(range(PIPE + 2))
        m.d.sync += [
            inflight1.eq(inflight1 + (issuing & ~pass2).as_unsigned() - (c_valid & ~c_pass2).as_unsigned()),
            inflight2.eq(inflight2 + (issuing & pass2).as_unsigned() - (c_valid & c_pass2).as_unsigned()),
        ]

        # per-column steps
        # per-column step in two cycles: diff = (v_j << (f_s - f_v)) - kS, then u
        kS = saturate(round_shift(acc_k, sh.f_k), sb)
        v_j = Array(self.v[i] for i in range(H * dv))[h * dv + j]
        beta_h = Array(self.beta[i] for i in range(H))[h]
        diff = Signal(signed(max(sb, fm.qkv_bits + sh.f_s - sh.f_v) + 2))
        u_next = saturate(round_shift(beta_h * diff, fm.unit_frac), sb)

        # the read o_j leaves through a register once pass 2 of its column has drained
        p2_open = Signal()                      # pass 2 issued, its sum not yet in o
        o_val = Signal(signed(fm.o_bits))
        o_valid = Signal()
        m.d.comb += [self.o.payload.eq(o_val), self.o.valid.eq(o_valid)]
        with m.If(self.o.ready):
            m.d.sync += o_valid.eq(0)
        with m.If(p2_open & (inflight2 == 0)):
            m.d.sync += [o_val.eq(saturate(round_shift(acc_o, sh.o_shift), fm.o_bits)),
                         o_valid.eq(1), p2_open.eq(0)]
            m.d.comb += acc_o_clear.eq(1)
        pass2_free = ~p2_open & ~o_valid        # acc_o and the o register are free

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [h.eq(0), j.eq(0), b.eq(0), col_word.eq(0), pass2.eq(0)]
                    m.d.comb += [acc_k_clear.eq(1), acc_o_clear.eq(1)]
                    m.next = "ISSUE1"
            with m.State("ISSUE1"):
                m.d.comb += [self.busy.eq(1), issuing.eq(1)]
                m.d.sync += b.eq(b + 1)
                with m.If(b == nb - 1):
                    m.d.sync += b.eq(0)
                    m.next = "WAIT1"
            with m.State("WAIT1"):
                # u_j needs the whole pass-1 sum; u may change only once the
                # previous column's pass 2 has left stage B (it has when drained)
                m.d.comb += self.busy.eq(1)
                with m.If((inflight1 == 0) & pass2_free):
                    m.d.sync += diff.eq((v_j << (sh.f_s - sh.f_v)) - kS)
                    m.d.comb += acc_k_clear.eq(1)
                    m.next = "U"
            with m.State("U"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [u.eq(u_next), pass2.eq(1)]
                m.next = "ISSUE2"
            with m.State("ISSUE2"):
                m.d.comb += [self.busy.eq(1), issuing.eq(1)]
                m.d.sync += b.eq(b + 1)
                with m.If(b == nb - 1):
                    m.d.sync += [b.eq(0), pass2.eq(0), p2_open.eq(1), col_word.eq(col_word + nb)]
                    m.next = "ISSUE1"
                    with m.If(j == dv - 1):
                        m.d.sync += j.eq(0)
                        with m.If(h == H - 1):
                            m.next = "FINISH"
                        with m.Else():
                            m.d.sync += h.eq(h + 1)
                    with m.Else():
                        m.d.sync += j.eq(j + 1)
            with m.State("FINISH"):
                m.d.comb += self.busy.eq(1)
                with m.If(pass2_free):
                    # every word was rewritten by this token: the state is valid
                    m.d.comb += mem.commit.eq(1)
                    m.next = "IDLE"
        m.d.comb += mem.clear.eq(self.clear)
        return m
