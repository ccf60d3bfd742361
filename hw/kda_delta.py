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

Pipeline of a word (one word read per cycle; the tag carries pass, column,
last-of-column, and for pass 2 the column's u):
    issue (registered) -> memory read (READ_LATENCY cycles, hw/kda_state.py) + lane-select muxes
    of alpha, k, q (registered beside it, in the read's last cycle)
    -> S*alpha and k*u as Booth carry-save trees with their rounding words
    -> resolve (split adders) -> S1 + rs(k u), saturate -> S2 / S1, registered
    -> written back (pass 2); lane products k_i S1_i / q_i S2_i, all lanes in one
       carry-save tree -> a 4:2 step into the pass's carry-save accumulator.
The registers fall where hw/pipeline.py's delay budget for hw.clock_period_ns
says: the depth follows from the clock, no stage count is written here.  A
column's last word hands its sum to the u pipeline (kS, v - kS, beta *, round,
saturate) or the o pipeline (round, saturate, into a 2-entry FIFO on ``o``).

Schedule: the passes interleave, P1(0) P1(1) P2(0) P1(2) P2(1) ... P2(N-1), so
2 d_k/lanes read cycles of other columns cover the time u_c takes; u is kept
per column parity.  A column costs max(2 d_k/lanes, that latency) cycles:
measured per token (the KDA unit's token_cycles, no stalls) tiny 887, small
3341 for the whole unit (875 / 3305 before the state read took two cycles).  Independent of how many tokens came before.

Ports: ``start`` (strobe, when not ``busy``) runs one token over the vectors
``k``, ``q``, ``alpha``, ``v``, ``beta`` that must stay stable while ``busy``;
``o`` streams the H*d_v outputs in (h, j) order; ``clear`` makes the state
read as zero (a new sequence), taking effect for the next ``start``.
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
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

        # ---- control: two issue cursors, one per pass, each walking the words in
        # memory order (column-major: column c = h*d_v + j holds words c*nb .. c*nb+nb-1).
        # The passes interleave column by column - P1(0) P1(1) P2(0) P1(2) P2(1) ... - so
        # while u_c is being computed, P2(c-1) and P1(c+1) keep the read port busy.
        N = H * dv

        class Cursor:
            def __init__(self, name):
                self.addr = Signal(range(mem.words), name=f"{name}_addr")
                self.g = Signal(range(H * nb), name=f"{name}_g")          # row block h*nb + b
                self.g_head = Signal(range(H * nb), name=f"{name}_ghead")  # h*nb
                self.b = Signal(range(nb), name=f"{name}_b")
                self.j = Signal(range(dv), name=f"{name}_j")
                self.col = Signal(range(N + 1), name=f"{name}_col")
                self.last = self.b == nb - 1

            def reset(self):
                return [v.eq(0) for v in (self.addr, self.g, self.g_head, self.b, self.j, self.col)]

            def advance(self):
                m.d.sync += [self.addr.eq(self.addr + 1), self.b.eq(self.b + 1), self.g.eq(self.g + 1)]
                with m.If(self.last):
                    m.d.sync += [self.b.eq(0), self.col.eq(self.col + 1), self.j.eq(self.j + 1),
                                 self.g.eq(self.g_head)]
                    with m.If(self.j == dv - 1):       # next head: g + 1 is its first block
                        m.d.sync += [self.j.eq(0), self.g_head.eq(self.g_head + nb), self.g.eq(self.g + 1)]
        c1, c2 = Cursor("p1"), Cursor("p2")
        pass2 = Signal()
        issuing = Signal()
        u_regs = [Signal(signed(sb), name=f"u{n}") for n in range(2)]   # by column parity
        u_ok = [Signal(name=f"u_ok{n}") for n in range(2)]

        # ---- issue: the memory read and the lane operands, both one cycle ------------
        # The lane-select muxes (H*nb row blocks) sit alone in the issue cycle: their
        # outputs are registered next to the memory's read register, so no product
        # starts behind a mux.  k and q only travel as far as their product.
        # The word to read is chosen (the FSM's pass, the cursor) one cycle ahead, so the
        # state memory's read mux (words deep) starts from a register
        def tag(name):
            return {"valid": Signal(name=f"{name}_valid"), "pass2": Signal(name=f"{name}_pass2"),
                    "last": Signal(name=f"{name}_last"), "col": Signal(range(N + 1), name=f"{name}_col"),
                    "addr": Signal(range(mem.words), name=f"{name}_addr"), "u": Signal(signed(sb), name=f"{name}_u")}
        iss = tag("iss")
        iss["g"] = Signal(range(H * nb), name="iss_g")
        m.d.sync += [iss["valid"].eq(issuing), iss["pass2"].eq(pass2), iss["addr"].eq(Mux(pass2, c2.addr, c1.addr)),
                     iss["g"].eq(Mux(pass2, c2.g, c1.g)),
                     iss["last"].eq(Mux(pass2, c2.last, c1.last)), iss["col"].eq(Mux(pass2, c2.col, c1.col)),
                     iss["u"].eq(Array(u_regs)[c2.col[0]])]

        m.d.comb += [mem.rd_en.eq(iss["valid"]), mem.rd_addr.eq(iss["addr"])]
        # the tag waits out the memory's read latency; the lane selects take the last cycle
        for n in range(mem.READ_LATENCY - 1):
            held = tag(f"iss{n + 1}")
            held["g"] = Signal(range(H * nb), name=f"iss{n + 1}_g")
            m.d.sync += [held[key].eq(iss[key]) for key in held]
            iss = held

        def lanes_of(vec):
            return [Array(vec[gg * P + l] for gg in range(H * nb))[iss["g"]] for l in range(P)]
        rd = tag("rd")
        rd.update({"alpha": [Signal(unsigned(af), name=f"rd_alpha{l}") for l in range(P)],
                   "k": [Signal(signed(qk), name=f"rd_k{l}") for l in range(P)],
                   "kq": [Signal(signed(qk), name=f"rd_kq{l}") for l in range(P)]})
        m.d.sync += [rd[key].eq(iss[key]) for key in ("valid", "pass2", "last", "col", "addr", "u")]
        for l, (al, kl, ql) in enumerate(zip(lanes_of(self.alpha), lanes_of(self.k), lanes_of(self.q))):
            m.d.sync += [rd["alpha"][l].eq(al), rd["k"][l].eq(kl), rd["kq"][l].eq(Mux(iss["pass2"], ql, kl))]
        rd["s"] = [mem.rd_data[l] for l in range(P)]

        # ---- the word pipeline, registers placed by the clock (hw/pipeline.py) ---------
        dp = Pipe(m, plan, "dl")
        live = rd                               # rd_data leaves the memory's read register
        # decay S*alpha and the rank-1 term k*u as Booth trees, rounding constants as
        # words; u_c travels with each pass-2 word from its issue
        w_dec, w_ku = sb + af + 2, sb + qk + 1
        live = dp.spend(dl.booth_select, live)
        rnd_af = Const(1 << (af - 1) if af else 0, w_dec)
        rnd_fk = Const(1 << (sh.f_k - 1) if sh.f_k else 0, w_ku)
        for l in range(P):
            live[f"dec{l}"] = booth_partial_products(m, Cat(live["alpha"][l], Const(0, 1)), live["s"][l], w_dec,
                                                     name=f"dl_dec{l}") + [rnd_af]
            live[f"ku{l}"] = booth_partial_products(m, live["u"], live["k"][l], w_ku, name=f"dl_ku{l}") + [rnd_fk]
        for key in ("alpha", "k", "s", "u"):
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
        # the write-back leaves from a register: the memory's address decode (one
        # enable per word, each fanning out to a word of flip-flops) has the cycle alone
        live = dp.register(live)
        m.d.comb += [mem.wr_en.eq(live["valid"] & live["pass2"]), mem.wr_addr.eq(live["addr"]),
                     mem.wr_data.eq(Cat(*live["snew"]))]
        # the lane products k_i S1_i (pass 1) / q_i S2_i (pass 2), all lanes in one tree;
        # a mux level more than a lone Booth select: each snew bit fans out to every digit's
        # select of its lane (small at 1 ns was 0.055 ns short with the select alone)
        live = dp.spend(dl.booth_select + dl.mux_level, live)
        words = []
        for l in range(P):
            words += booth_partial_products(m, live["snew"][l], live["kq"][l], acc_width, name=f"dl_p{l}")
        live = {kk: vv for kk, vv in live.items() if kk not in ("snew", "kq", "addr")}
        live = reduce_to_two(dp, {**live, "prod": words}, "prod", acc_width)
        # D: one carry-save accumulator per pass (a 4:2 step closes the loop in a
        # cycle); a column's last word hands the sum on (to the u or the o pipeline)
        # and restarts the accumulator from zero
        live = dp.spend(2 * dl.csa_level, live)
        c_valid, c_pass2, c_last, c_col = live["valid"], live["pass2"], live["last"], live["col"]
        ps, pc = live["prod"]

        def accumulate(name, mine):
            acc = [Signal(acc_width, name=f"{name}_s"), Signal(acc_width, name=f"{name}_c")]
            s1, cy1 = compress_3_2(acc[0], acc[1], ps, acc_width)
            s2, cy2 = compress_3_2(s1, cy1, pc, acc_width)
            total = [Signal(acc_width, name=f"{name}_total_s"), Signal(acc_width, name=f"{name}_total_c")]
            m.d.comb += [total[0].eq(s2), total[1].eq(cy2)]
            with m.If(self.start):
                m.d.sync += [acc[0].eq(0), acc[1].eq(0)]
            with m.Elif(c_valid & mine):
                m.d.sync += [acc[0].eq(Mux(c_last, 0, s2)), acc[1].eq(Mux(c_last, 0, cy2))]
            return total
        sum_k = accumulate("acc_k", ~c_pass2)
        sum_o = accumulate("acc_o", c_pass2)

        # ---- per column: u_c = sat(rs(beta_h ((v_c << (f_s - f_v)) - kS), unit_frac)) ----------
        # kS = sat(rs(sum_k, f_k)), resolved over clock-derived stages
        dw = max(sb, fm.qkv_bits + sh.f_s - sh.f_v) + 2
        cu = {"valid": Signal(name="cu_valid"), "par": Signal(name="cu_par"),
              "s": Signal(acc_width, name="cu_s"), "c": Signal(acc_width, name="cu_c"),
              "rnd": Const(1 << (sh.f_k - 1) if sh.f_k else 0, acc_width),
              "vsh": Signal(signed(dw), name="cu_vsh"), "beta": Signal(unsigned(uf + 1), name="cu_beta")}
        v_c = Array(self.v[i] for i in range(N))[c_col]
        beta_c = Array(self.beta[c // dv] for c in range(N))[c_col]
        m.d.sync += [cu["valid"].eq(c_valid & ~c_pass2 & c_last), cu["par"].eq(c_col[0]),
                     cu["s"].eq(sum_k[0]), cu["c"].eq(sum_k[1]),
                     cu["vsh"].eq(v_c << (sh.f_s - sh.f_v)), cu["beta"].eq(beta_c)]
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
        u_valid, u_par = live["valid"], live["par"]

        # ---- per column: o_c = sat(rs(sum_o, o_shift)), into a small FIFO on ``o`` ------------
        co = {"valid": Signal(name="co_valid"), "s": Signal(acc_width, name="co_s"),
              "c": Signal(acc_width, name="co_c"),
              "rnd": Const(1 << (sh.o_shift - 1) if sh.o_shift else 0, acc_width)}
        m.d.sync += [co["valid"].eq(c_valid & c_pass2 & c_last), co["s"].eq(sum_o[0]), co["c"].eq(sum_o[1])]
        op = Pipe(m, plan, "do")
        live = op.spend(dl.csa_level, co)
        live["a"], live["b"] = compress_3_2(live.pop("s"), live.pop("c"), live.pop("rnd"), acc_width)
        live = pipelined_add(op, live, "a", "b", "acc", acc_width)
        live = op.spend(dl.saturate, live)
        o_y = Signal(signed(fm.o_bits), name="do_y")
        m.d.comb += o_y.eq(clamp(Value.cast(live["acc"])[sh.o_shift:].as_signed(), fm.o_bits))
        live = op.register({**live, "y": o_y})
        ODEPTH = 2
        m.submodules.o_fifo = o_fifo = SyncFIFOBuffered(width=fm.o_bits, depth=ODEPTH)
        m.d.comb += [o_fifo.w_en.eq(live["valid"]), o_fifo.w_data.eq(live["y"]),
                     self.o.valid.eq(o_fifo.r_rdy), self.o.payload.eq(o_fifo.r_data.as_signed()),
                     o_fifo.r_en.eq(self.o.ready)]
        # columns whose pass 2 started and whose o_c is not yet taken: a pass 2 starts
        # only with a FIFO place for its o_c, so the never-stalling pipeline cannot overflow it
        o_pend = Signal(range(ODEPTH + 1))
        p2_begin = Signal()
        m.d.sync += o_pend.eq(o_pend + p2_begin - (self.o.valid & self.o.ready))

        for n in range(2):
            with m.If(u_valid & (u_par == n)):
                m.d.sync += [u_regs[n].eq(u_new), u_ok[n].eq(1)]
        u_here = Array(u_ok)[c2.col[0]]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += c1.reset() + c2.reset() + [u.eq(0) for u in u_ok]
                    m.next = "ISSUE1"
            with m.State("ISSUE1"):
                m.d.comb += [self.busy.eq(1), issuing.eq(1)]
                c1.advance()
                with m.If(c1.last):
                    # after column 0 straight on to column 1; then P2 of the column before
                    with m.If((c1.col != 0) | (N == 1)):
                        m.next = "WAITU"
            with m.State("WAITU"):
                m.d.comb += self.busy.eq(1)
                with m.If(u_here & (o_pend < ODEPTH)):
                    m.d.comb += p2_begin.eq(1)
                    m.d.sync += Array(u_ok)[c2.col[0]].eq(0)
                    m.next = "ISSUE2"
            with m.State("ISSUE2"):
                m.d.comb += [self.busy.eq(1), issuing.eq(1), pass2.eq(1)]
                c2.advance()
                with m.If(c2.last):
                    with m.If(c2.col == N - 1):
                        m.next = "FINISH"
                    with m.Elif(c1.col != N):
                        m.next = "ISSUE1"
                    with m.Else():
                        m.next = "WAITU"
            with m.State("FINISH"):
                m.d.comb += self.busy.eq(1)
                with m.If(o_pend == 0):
                    # every word was rewritten by this token: the state is valid
                    m.d.comb += mem.commit.eq(1)
                    m.next = "IDLE"
        m.d.comb += mem.clear.eq(self.clear)
        return m
