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

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.carry_save import (booth_partial_products, compress_3_2, pipelined_add, pipelined_add_all,
                           reduce_all_to_two, reduce_to_two, sign_extend)
from hw.kda_state import StateMemory
from hw.matvec import saturate as saturate_bits
from hw.pipeline import Pipe, plan_pipeline
from moekda.formats import Formats


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


def clamp(x, bits: int):
    """``saturate`` as a test of the top bits (no comparator): the sign-extended
    value fits exactly when its bits from ``bits - 1`` up are all equal."""
    x = Value.cast(x)
    return saturate_bits(sign_extend(x, max(len(x), bits + 1)).as_signed(), bits)


class DeltaRule(wiring.Component):
    def __init__(self, fm: Formats, heads: int, d_k: int, d_v: int, lanes: int, shifts: DeltaShifts,
                 clock_period_ns: float):
        if shifts.f_s < shifts.f_v:
            raise ValueError(f"delta rule: f_s = {shifts.f_s} < f_v = {shifts.f_v} (v << (f_s - f_v) needs f_s >= f_v)")
        if min(shifts.f_k, shifts.o_shift) < 0:
            raise ValueError("delta rule: shifts must be non-negative")
        self.fm, self.heads, self.d_k, self.d_v, self.lanes, self.shifts = fm, heads, d_k, d_v, lanes, shifts
        self.clock_period_ns = clock_period_ns
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
        sb, af, uf, qk = fm.state_bits, fm.alpha_frac, fm.unit_frac, fm.qk_bits
        plan = plan_pipeline(self.clock_period_ns)
        dl = plan.delays
        m.submodules.mem = mem = StateMemory(H, dk, dv, P, sb)
        acc_width = sb + qk + (dk - 1).bit_length() + 1

        # ---- control: head h, column j (hj = h*d_v + j), row block b, pass ----------
        h = Signal(range(H))
        j = Signal(range(dv))
        hj = Signal(range(H * dv))
        b = Signal(range(nb))
        g = Signal(range(H * nb))               # row block h*nb + b being issued
        g_head = Signal(range(H * nb))          # h*nb
        addr = Signal(range(mem.words))         # word being issued
        col_word = Signal(range(mem.words))     # first word of column (h, j)
        pass2 = Signal()
        issuing = Signal()
        u = Signal(signed(sb))

        # ---- issue: the memory read and the lane operands, both one cycle ------------
        # The lane-select muxes (H*nb row blocks) sit alone in the issue cycle: their
        # outputs are registered next to the memory's read register, so no product
        # starts behind a mux.  k and q only travel as far as their product.
        def lanes_of(vec):
            return [Array(vec[gg * P + l] for gg in range(H * nb))[g] for l in range(P)]
        m.d.comb += [mem.rd_en.eq(issuing), mem.rd_addr.eq(addr)]
        rd = {"valid": Signal(name="rd_valid"), "pass2": Signal(name="rd_pass2"),
              "addr": Signal.like(addr, name="rd_addr"),
              "alpha": [Signal(unsigned(af), name=f"rd_alpha{l}") for l in range(P)],
              "k": [Signal(signed(qk), name=f"rd_k{l}") for l in range(P)],
              "kq": [Signal(signed(qk), name=f"rd_kq{l}") for l in range(P)]}
        m.d.sync += [rd["valid"].eq(issuing), rd["pass2"].eq(pass2), rd["addr"].eq(addr)]
        for l, (al, kl, ql) in enumerate(zip(lanes_of(self.alpha), lanes_of(self.k), lanes_of(self.q))):
            m.d.sync += [rd["alpha"][l].eq(al), rd["k"][l].eq(kl), rd["kq"][l].eq(Mux(pass2, ql, kl))]
        rd["s"] = [mem.rd_data[l] for l in range(P)]

        # ---- the word pipeline, registers placed by the clock (hw/pipeline.py) ---------
        dp = Pipe(m, plan, "dl")
        live = dp.spend(dl.mux_level, rd)       # the memory's cleared-state mux
        # decay S*alpha and the rank-1 term k*u as Booth trees, rounding constants as
        # words; u is stable while pass-2 words are in flight (it changes only after
        # the next column's pass 1, issued behind them, has drained)
        w_dec, w_ku = sb + af + 2, sb + qk + 1
        live = dp.spend(dl.booth_select, live)
        rnd_af = Const(1 << (af - 1) if af else 0, w_dec)
        rnd_fk = Const(1 << (sh.f_k - 1) if sh.f_k else 0, w_ku)
        for l in range(P):
            live[f"dec{l}"] = booth_partial_products(m, Cat(live["alpha"][l], Const(0, 1)), live["s"][l], w_dec,
                                                     name=f"dl_dec{l}") + [rnd_af]
            live[f"ku{l}"] = booth_partial_products(m, u, live["k"][l], w_ku, name=f"dl_ku{l}") + [rnd_fk]
        for key in ("alpha", "k", "s"):
            live.pop(key)
        keys = [f"{n}{l}" for n in ("dec", "ku") for l in range(P)]
        live = reduce_all_to_two(dp, live, keys, [w_dec] * P + [w_ku] * P)
        jobs = []
        for key, w in zip(keys, [w_dec] * P + [w_ku] * P):
            live[f"{key}_a"], live[f"{key}_b"] = live.pop(key)
            jobs.append((f"{key}_a", f"{key}_b", key, w))
        live = pipelined_add_all(dp, live, jobs)
        # S1 = rs(S alpha), S2 = sat(S1 + rs(k u)) in pass 2, S1 passed on in pass 1
        tw = max(sb, w_ku - sh.f_k) + 1
        live = dp.spend(dl.adder(tw), live)
        s1s, ts = [], []
        for l in range(P):
            s1 = Value.cast(live.pop(f"dec{l}"))[af:af + sb].as_signed()   # |S1| <= |S|: no overflow
            ku = Value.cast(live.pop(f"ku{l}"))[sh.f_k:].as_signed()
            t = Signal(signed(tw), name=f"dl_s1ku{l}")
            m.d.comb += t.eq(s1 + ku)
            s1s.append(s1)
            ts.append(t)
        live = dp.spend(dl.saturate + dl.mux_level, {**live, "s1": s1s, "t": ts})
        new_s = [Signal(signed(sb), name=f"dl_snew{l}") for l in range(P)]
        for l in range(P):
            m.d.comb += new_s[l].eq(Mux(live["pass2"], clamp(live["t"][l], sb), live["s1"][l]))
        live.pop("s1"), live.pop("t")
        live["snew"] = new_s
        # the write-back leaves from its own stage: the memory's write decode after it
        live = dp.spend(dl.mux_level * 2, live)
        m.d.comb += [mem.wr_en.eq(live["valid"] & live["pass2"]), mem.wr_addr.eq(live["addr"]),
                     mem.wr_data.eq(Cat(*live["snew"]))]
        # the lane products k_i S1_i (pass 1) / q_i S2_i (pass 2), all lanes in one tree
        live = dp.spend(dl.booth_select, live)
        words = []
        for l in range(P):
            words += booth_partial_products(m, live["snew"][l], live["kq"][l], acc_width, name=f"dl_p{l}")
        live = {kk: vv for kk, vv in live.items() if kk not in ("snew", "kq", "addr")}
        live = reduce_to_two(dp, {**live, "prod": words}, "prod", acc_width)
        # D: one carry-save accumulator per pass (a 4:2 step closes the loop in a
        # cycle), so pass 2 of column j drains while pass 1 of column j+1 runs
        live = dp.spend(2 * dl.csa_level, live)
        c_valid, c_pass2 = live["valid"], live["pass2"]
        ps, pc = live["prod"]

        def acc_pair(name):
            return [Signal(acc_width, name=f"{name}_s"), Signal(acc_width, name=f"{name}_c")]
        acc_k, acc_o = acc_pair("acc_k"), acc_pair("acc_o")

        def accumulate(acc, clear, add):
            s1, c1 = compress_3_2(acc[0], acc[1], ps, acc_width)
            s2, c2 = compress_3_2(s1, c1, pc, acc_width)
            with m.If(clear):
                m.d.sync += [acc[0].eq(0), acc[1].eq(0)]
            with m.Elif(add):
                m.d.sync += [acc[0].eq(s2), acc[1].eq(c2)]
        acc_k_clear, acc_o_clear = Signal(), Signal()
        accumulate(acc_k, acc_k_clear, c_valid & ~c_pass2)
        accumulate(acc_o, acc_o_clear, c_valid & c_pass2)

        # reads of each pass whose product is not yet accumulated
        depth = dp.stages + 3
        inflight1, inflight2 = Signal(range(depth + nb + 1)), Signal(range(depth + nb + 1))
        m.d.sync += [
            inflight1.eq(inflight1 + (issuing & ~pass2).as_unsigned() - (c_valid & ~c_pass2).as_unsigned()),
            inflight2.eq(inflight2 + (issuing & pass2).as_unsigned() - (c_valid & c_pass2).as_unsigned()),
        ]

        # ---- per column: u_j = sat(rs(beta_h ((v_j << (f_s - f_v)) - kS), unit_frac)) ----------
        # kS = sat(rs(acc_k, f_k)); the accumulator pair is copied out (and cleared) when
        # pass 1 has drained, then resolved over clock-derived stages
        u_go = Signal()
        dw = max(sb, fm.qkv_bits + sh.f_s - sh.f_v) + 2
        cu = {"valid": Signal(name="cu_valid"), "s": Signal(acc_width, name="cu_s"),
              "c": Signal(acc_width, name="cu_c"), "rnd": Const(1 << (sh.f_k - 1) if sh.f_k else 0, acc_width),
              "vsh": Signal(signed(dw), name="cu_vsh"), "beta": Signal(unsigned(uf + 1), name="cu_beta")}
        v_j = Array(self.v[i] for i in range(H * dv))[hj]
        m.d.sync += [cu["valid"].eq(u_go), cu["s"].eq(acc_k[0]), cu["c"].eq(acc_k[1]),
                     cu["vsh"].eq(v_j << (sh.f_s - sh.f_v)), cu["beta"].eq(Array(self.beta[i] for i in range(H))[h])]
        up = Pipe(m, plan, "du")
        live = up.spend(dl.csa_level, cu)
        live["a"], live["b"] = compress_3_2(live.pop("s"), live.pop("c"), live.pop("rnd"), acc_width)
        live = pipelined_add(up, live, "a", "b", "acc", acc_width)
        live = up.spend(dl.saturate, live)
        ks = Signal(signed(sb), name="du_ks")
        m.d.comb += ks.eq(clamp(Value.cast(live.pop("acc"))[sh.f_k:].as_signed(), sb))
        live = up.spend(dl.adder(dw), {**live, "ks": ks})
        diff = Signal(signed(dw), name="du_diff")
        m.d.comb += diff.eq(live.pop("vsh") - live.pop("ks"))
        w_u = dw + uf + 3
        live = up.spend(dl.booth_select, {**live, "diff": diff})
        live["words"] = booth_partial_products(m, live.pop("diff"), live.pop("beta"), w_u, multiplier_signed=False,
                                               name="du_bu") + [Const(1 << (uf - 1) if uf else 0, w_u)]
        live = reduce_to_two(up, live, "words", w_u)
        live["ba"], live["bb"] = live.pop("words")
        live = pipelined_add(up, live, "ba", "bb", "bu", w_u)
        live = up.spend(dl.saturate, live)
        u_new = Signal(signed(sb), name="du_u")
        m.d.comb += u_new.eq(clamp(Value.cast(live["bu"])[uf:].as_signed(), sb))
        u_valid = live["valid"]
        u_ready = Signal()                      # u_new arrived, pass 2 not started yet

        # ---- per column: o_j = sat(rs(acc_o, o_shift)) once pass 2 has drained ------------
        p2_open = Signal()                      # pass 2 issued, its sum not yet copied out
        o_go = Signal()
        m.d.comb += o_go.eq(p2_open & (inflight2 == 0))
        co = {"valid": Signal(name="co_valid"), "s": Signal(acc_width, name="co_s"),
              "c": Signal(acc_width, name="co_c"),
              "rnd": Const(1 << (sh.o_shift - 1) if sh.o_shift else 0, acc_width)}
        m.d.sync += [co["valid"].eq(o_go), co["s"].eq(acc_o[0]), co["c"].eq(acc_o[1])]
        with m.If(o_go):
            m.d.sync += p2_open.eq(0)
            m.d.comb += acc_o_clear.eq(1)
        op = Pipe(m, plan, "do")
        live = op.spend(dl.csa_level, co)
        live["a"], live["b"] = compress_3_2(live.pop("s"), live.pop("c"), live.pop("rnd"), acc_width)
        live = pipelined_add(op, live, "a", "b", "acc", acc_width)
        live = op.spend(dl.saturate, live)
        o_val = Signal(signed(fm.o_bits))
        o_valid = Signal()
        o_busy = Signal()                       # an o_j launched and not yet taken on ``o``
        m.d.comb += [self.o.payload.eq(o_val), self.o.valid.eq(o_valid)]
        with m.If(o_valid & self.o.ready):
            m.d.sync += [o_valid.eq(0), o_busy.eq(0)]
        with m.If(live["valid"]):
            m.d.sync += [o_val.eq(clamp(Value.cast(live["acc"])[sh.o_shift:].as_signed(), fm.o_bits)),
                         o_valid.eq(1)]
        with m.If(o_go):
            m.d.sync += o_busy.eq(1)

        def next_issue():
            m.d.sync += [b.eq(b + 1), g.eq(g + 1), addr.eq(addr + 1)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [h.eq(0), j.eq(0), hj.eq(0), b.eq(0), g.eq(0), g_head.eq(0),
                                 addr.eq(0), col_word.eq(0), pass2.eq(0)]
                    m.d.comb += [acc_k_clear.eq(1), acc_o_clear.eq(1)]
                    m.next = "ISSUE1"
            with m.State("ISSUE1"):
                m.d.comb += [self.busy.eq(1), issuing.eq(1)]
                next_issue()
                with m.If(b == nb - 1):   # pass 2 reads the same words again
                    m.d.sync += [b.eq(0), g.eq(g_head), addr.eq(col_word)]
                    m.next = "WAIT1"
            with m.State("WAIT1"):
                # u_j needs the whole pass-1 sum, and acc_o must be free (the
                # previous column's pass 2 copied out) before this column's pass 2
                m.d.comb += self.busy.eq(1)
                with m.If((inflight1 == 0) & ~p2_open):
                    m.d.comb += [u_go.eq(1), acc_k_clear.eq(1)]
                    m.next = "U"
            with m.State("U"):
                # wait for u_j; the o register must be free for this column's o_j
                m.d.comb += self.busy.eq(1)
                with m.If(u_valid):
                    m.d.sync += [u.eq(u_new), u_ready.eq(1)]
                with m.If((u_valid | u_ready) & ~o_busy):
                    m.d.sync += [pass2.eq(1), u_ready.eq(0)]
                    m.next = "ISSUE2"
            with m.State("ISSUE2"):
                m.d.comb += [self.busy.eq(1), issuing.eq(1)]
                next_issue()
                with m.If(b == nb - 1):
                    m.d.sync += [b.eq(0), pass2.eq(0), p2_open.eq(1), col_word.eq(addr + 1),
                                 hj.eq(hj + 1)]
                    m.next = "ISSUE1"
                    with m.If(j == dv - 1):
                        m.d.sync += [j.eq(0), g_head.eq(g_head + nb)]
                        with m.If(h == H - 1):
                            m.next = "FINISH"
                        with m.Else():
                            m.d.sync += h.eq(h + 1)
                    with m.Else():
                        m.d.sync += [j.eq(j + 1), g.eq(g_head)]
            with m.State("FINISH"):
                m.d.comb += self.busy.eq(1)
                with m.If(~p2_open & ~o_busy):
                    # every word was rewritten by this token: the state is valid
                    m.d.comb += mem.commit.eq(1)
                    m.next = "IDLE"
        m.d.comb += mem.clear.eq(self.clear)
        return m
