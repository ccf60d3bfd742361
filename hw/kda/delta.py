"""The KDA state update and read (the delta rule), ``state_lanes`` entries per cycle.

Implements ``model.int_kda.int_delta_rule`` bit for bit, per head h and
value column j (the state memory is column-major, see hw/kda/state.py):

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

rs = round half up shift, sat = saturate to state_bits.  The shifts f_k, f_v,
f_s and o_shift are run-time inputs (``shifts``: the parameter bank,
hw/image/param_map.py ``kda.f_k`` ...): each variable shift is a barrel (one mux level
per bit of the field's allowed range, hw/arith/booth_multiply.py's shared helper), each
rounding constant 2**(s-1) a one-hot word; those words and f_s - f_v are
registered from the inputs, so the shifts must be stable from a cycle before
``start`` to the end of the token.  Each column needs
only its own u_j, so the two passes run column by column and nothing wider
than one column is buffered.

Pipeline of a word (one word read per cycle; the tag carries pass, column,
last-of-column, and for pass 2 the column's u):
    issue (registered) -> memory read (READ_LATENCY cycles, hw/kda/state.py) + lane-select muxes
    of alpha, k, q (registered beside it, in the read's last cycle)
    -> S*alpha and k*u as Booth carry-save trees with their rounding words
    -> resolve (split adders) -> S1 + rs(k u), saturate -> S2 / S1, registered
    -> written back (pass 2); lane products k_i S1_i / q_i S2_i, all lanes in one
       carry-save tree -> a 4:2 step into the pass's carry-save accumulator.
The registers fall where hw/arith/pipeline.py's delay budget for hw.clock_period_ns
says: the depth follows from the clock, no stage count is written here.  A
column's last word hands its sum to the u pipeline (kS, v - kS, beta *, round,
saturate) or the o pipeline (round, saturate, into a 2-entry FIFO on ``o``).

Schedule: the passes interleave, P1(0) P1(1) P2(0) P1(2) P2(1) ... P2(N-1), so
2 d_k/lanes read cycles of other columns cover the time u_c takes; u is kept
per column parity.  A column costs max(2 d_k/lanes, that latency) cycles:
measured per token (the KDA unit's token_cycles, no stalls) tiny 902, small
3386 for the whole unit (887 / 3341 with constant shifts, 875 / 3305 before the
state read took two cycles).  Independent of how many tokens came before.

With the state in SRAM (``state_memory = "sram"``, hw/kda/state.py) the memory is two
1RW banks by word parity, and a read and a write of one cycle must use different
banks.  Every write is its pass-2 read delayed by a fixed D cycles (the pipeline never
stalls), so the schedule keeps them apart by cycle parity: a word is issued only on a
cycle whose parity (a toggle, set by ``start`` so the first word goes at once) is its bank's, and D is made odd (one more
register before the write-back when the clock's plan gives an even D).  A read at cycle
t is then in bank p(t), the write of a word read at t - D is in bank p(t - D) != p(t).
Within a column the words alternate banks, and with d_k/lanes even a column ends on the
other bank than the next one starts, so the only cost is a bubble of at most one cycle
when issue resumes after waiting for u (KDA unit per token: tiny 902 -> 903, small
3386 -> 3419; docs/chip.md "KDA state in SRAM").  Nothing else
changes: the same words are read and written with the same values, in the same order.

Layers (``layers`` = L > 1: the layers of a model on one datapath): the state memory
holds one state per layer (hw/kda/state.py: the layer is the high part of the word
address) and a token reads and writes only its own layer's.  The word counters and
the schedule are those of one layer; the layer bits join the address at the memory
port, from ``layer`` (a register of the KDA unit, stable for the token).

Ports: ``start`` (strobe, when not ``busy``) runs one token over the vectors
``k``, ``q``, ``alpha``, ``v``, ``beta`` that must stay stable while ``busy``;
``layer`` (only with L > 1) the token's layer, stable likewise from ``start`` while
``busy``; ``o`` streams the H*d_v outputs in (h, j) order; ``clear`` (L strobe bits)
makes layer l's state read as zero (a new sequence of that layer) with bit l, taking
effect for that layer's next ``start`` (so not for the layer of a token in flight);
the other layers keep theirs.
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import barrel_shift_saturate, rounding_word, saturate as saturate_bits
from hw.arith.carry_save import (booth_partial_products, compress_3_2, pipelined_add, pipelined_add_all,
                           reduce_all_to_two, reduce_to_two, sign_extend, zero_extend)
from hw.kda.state import StateMemory, word_bits
from hw.arith.pipeline import Pipe, plan_pipeline
from moekda.formats import Formats


@dataclass(frozen=True)
class DeltaShifts:
    """Values of the calibrated fractional-bit positions (QKDA.f_k, f_v, f_s, o_shift):
    what a test drives on ``DeltaRule.shifts``."""
    f_k: int
    f_v: int
    f_s: int
    o_shift: int

    @classmethod
    def of(cls, qkda) -> "DeltaShifts":
        return cls(int(qkda.f_k), int(qkda.f_v), int(qkda.f_s), int(qkda.o_shift))


# the shift inputs: field width and largest allowed value, as hw/image/param_map.py lists them
# (kda.f_k: 0..qk_bits-1, kda.f_v: 0..qkv_bits-1, kda.f_s: 0..state_bits-1, kda.o_shift:
# 0..qk_bits+state_bits-2); a KdaUnit passes the fields of its parameter map
def default_shift_fields(fm: Formats) -> dict[str, tuple[int, int]]:
    return {"f_k": (4, fm.qk_bits - 1), "f_v": (5, fm.qkv_bits - 1), "f_s": (5, fm.state_bits - 1),
            "o_shift": (5, fm.qk_bits + fm.state_bits - 2)}


def clamp(x, bits: int):
    """``saturate`` as a test of the top bits (no comparator): the sign-extended
    value fits exactly when its bits from ``bits - 1`` up are all equal."""
    x = Value.cast(x)
    return saturate_bits(sign_extend(x, max(len(x), bits + 1)).as_signed(), bits)


class DeltaRule(wiring.Component):
    def __init__(self, fm: Formats, heads: int, d_k: int, d_v: int, lanes: int, clock_period_ns: float,
                 shift_fields: dict | None = None, state_memory: str = "flops", layers: int = 1):
        """``shift_fields``: per shift (f_k, f_v, f_s, o_shift) its (field bits, largest
        allowed value), default ``default_shift_fields(fm)``; a shift outside its range
        (or f_s < f_v) is not computed as the model would (the image tools refuse it).
        ``state_memory``: hw.state_memory, "flops" or "sram" (hw/kda/state.py).
        ``layers``: the states held, one per layer of a model (1: the layer chip)."""
        self.fm, self.heads, self.d_k, self.d_v, self.lanes = fm, heads, d_k, d_v, lanes
        self.state_memory, self.layers = state_memory, layers
        self.shift_fields = dict(shift_fields or default_shift_fields(fm))
        self.clock_period_ns = clock_period_ns
        self.blocks = d_k // lanes
        a = fm.qk_bits               # the normalised q and k
        super().__init__({
            "start": In(1),
            "busy": Out(1),
            "clear": In(layers),
            **({"layer": In(range(layers))} if layers > 1 else {}),
            "k": In(data.ArrayLayout(signed(a), heads * d_k)),
            "q": In(data.ArrayLayout(signed(a), heads * d_k)),
            "alpha": In(data.ArrayLayout(unsigned(fm.alpha_frac), heads * d_k)),
            "v": In(data.ArrayLayout(signed(fm.qkv_bits), heads * d_v)),
            "beta": In(data.ArrayLayout(unsigned(fm.unit_frac + 1), heads)),
            "shifts": In(data.StructLayout({k: unsigned(self.shift_fields[k][0])
                                            for k in ("f_k", "f_v", "f_s", "o_shift")})),
            "o": Out(stream.Signature(signed(fm.o_bits))),
            # the state memory's bank collision (sram only): never high with this schedule
            **({"collision": Out(1)} if state_memory == "sram" else {}),
        })

    def elaborate(self, platform):
        # The delta rule in named pieces: the shifts' registers, the issue of a word
        # (cursors, read, lane operands), the word pipeline (decay, update, write-back, lane
        # products, the two accumulators) and the schedule that interleaves the passes are
        # methods building into this Module (they share the state memory's read and write
        # and the word's tag); the per-column steps between and after the passes, u_c and
        # o_c, are components of their own (ColumnU, ColumnOut: a column's sum in, a
        # fixed latency, no stall).
        m = Module()
        fm = self.fm
        H, dk, dv, nb = self.heads, self.d_k, self.d_v, self.blocks
        sb, qk = fm.state_bits, fm.qk_bits
        plan = plan_pipeline(self.clock_period_ns)
        m.submodules.mem = mem = StateMemory(H, dk, dv, self.lanes, sb, kind=self.state_memory, layers=self.layers)
        if mem.banks == 2:
            m.d.comb += self.collision.eq(mem.collision)
        acc_width = sb + qk + (dk - 1).bit_length() + 1
        sh = self._shift_registers(m, acc_width, sb + fm.alpha_frac + 2, sb + qk + 1)

        # ---- control: two issue cursors, one per pass, each walking the words in
        # memory order (column-major: column c = h*d_v + j holds words c*nb .. c*nb+nb-1).
        # The passes interleave column by column - P1(0) P1(1) P2(0) P1(2) P2(1) ... - so
        # while u_c is being computed, P2(c-1) and P1(c+1) keep the read port busy.
        c1, c2 = _Cursor(m, "p1", mem.words, H, nb, dv), _Cursor(m, "p2", mem.words, H, nb, dv)
        pass2 = Signal()
        issuing = Signal()
        u_regs = [Signal(signed(sb), name=f"u{n}") for n in range(2)]   # by column parity
        u_ok = [Signal(name=f"u_ok{n}") for n in range(2)]

        rd = self._issue(m, mem, c1, c2, pass2, issuing, u_regs)
        col, sum_k, sum_o = self._word_pipeline(m, plan, mem, rd, sh, acc_width)
        u_new, u_valid, u_par = self._u_pipeline(m, sh, col, sum_k, acc_width)
        o_pend, p2_begin, odepth = self._o_pipeline(m, sh, col, sum_o, acc_width)
        for n in range(2):
            with m.If(u_valid & (u_par == n)):
                m.d.sync += [u_regs[n].eq(u_new), u_ok[n].eq(1)]
        self._schedule(m, mem, c1, c2, pass2, issuing, u_ok, o_pend, p2_begin, odepth)
        m.d.comb += mem.clear.eq(self.clear)
        return m

    def _address(self, mem, word):
        """The memory address of the token's layer's ``word`` (the layer: the high bits)."""
        assert len(Value.cast(word)) == word_bits(mem.words)
        return Cat(word, self.layer) if self.layers > 1 else word

    def _shift_registers(self, m, acc_width: int, w_dec: int, w_ku: int) -> dict:
        """The shifts: registered from the inputs with what follows from them (the
        rounding words 2**(s-1), f_s - f_v), so no path runs from the ports into a tree.
        Returns the registers and the words' widths the pipelines need."""
        sf, shifts = self.shift_fields, self.shifts
        lv = {k: max(1, hi.bit_length()) for k, (_, hi) in sf.items()}   # barrel levels
        f_k = Signal(lv["f_k"], name="sh_fk", reset_less=True)
        o_sh = Signal(lv["o_shift"], name="sh_o", reset_less=True)
        sv_hi = sf["f_s"][1]                          # f_s - f_v <= f_s's largest value
        d_sv = Signal(max(1, sv_hi.bit_length()), name="sh_dsv", reset_less=True)
        rnd_ku = Signal(w_ku, name="sh_rnd_ku", reset_less=True)
        rnd_ks = Signal(acc_width, name="sh_rnd_ks", reset_less=True)
        rnd_o = Signal(acc_width, name="sh_rnd_o", reset_less=True)
        m.d.sync += [f_k.eq(shifts.f_k), o_sh.eq(shifts.o_shift), d_sv.eq(shifts.f_s - shifts.f_v),
                     rnd_ku.eq(rounding_word(shifts.f_k, w_ku)), rnd_ks.eq(rounding_word(shifts.f_k, acc_width)),
                     rnd_o.eq(rounding_word(shifts.o_shift, acc_width))]
        return {"lv": lv, "f_k": f_k, "o_sh": o_sh, "sv_hi": sv_hi, "d_sv": d_sv, "rnd_ku": rnd_ku,
                "rnd_ks": rnd_ks, "rnd_o": rnd_o, "w_dec": w_dec, "w_ku": w_ku}

    def _issue(self, m, mem, c1, c2, pass2, issuing, u_regs) -> dict:
        """Issue: the memory read and the lane operands, both one cycle.  The lane-select
        muxes (H*nb row blocks) sit alone in the issue cycle: their outputs are registered
        next to the memory's read register, so no product starts behind a mux.  k and q
        only travel as far as their product.  The word to read is chosen (the FSM's pass,
        the cursor) one cycle ahead, so the state memory's read mux (words deep) starts
        from a register.  Returns the tag and operands of the word leaving the memory."""
        H, nb, P, N = self.heads, self.blocks, self.lanes, self.heads * self.d_v
        sb, af, qk = self.fm.state_bits, self.fm.alpha_frac, self.fm.qk_bits

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

        m.d.comb += [mem.rd_en.eq(iss["valid"]), mem.rd_addr.eq(self._address(mem, iss["addr"]))]
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
        return rd

    def _word_pipeline(self, m, plan, mem, rd, sh, acc_width):
        """The word pipeline, registers placed by the clock (hw/arith/pipeline.py): the
        decay and the update, the write-back, the lane products and the two accumulators.
        Returns the finished word's column tag and the two accumulators' sums."""
        dl, P, af = plan.delays, self.lanes, self.fm.alpha_frac
        w_dec, w_ku = sh["w_dec"], sh["w_ku"]
        dp = Pipe(m, plan, "dl")
        live = rd                               # rd_data leaves the memory's read register
        # decay S*alpha and the rank-1 term k*u as Booth trees, rounding constants as
        # words; u_c travels with each pass-2 word from its issue
        live = dp.spend(dl.booth_select, live)
        rnd_af = Const(1 << (af - 1) if af else 0, w_dec)
        for l in range(P):
            live[f"dec{l}"] = booth_partial_products(m, Cat(live["alpha"][l], Const(0, 1)), live["s"][l], w_dec,
                                                     name=f"dl_dec{l}") + [rnd_af]
            live[f"ku{l}"] = booth_partial_products(m, live["u"], live["k"][l], w_ku,
                                                    name=f"dl_ku{l}") + [sh["rnd_ku"]]
        for key in ("alpha", "k", "s", "u"):
            live.pop(key)
        keys = [f"{n}{l}" for n in ("dec", "ku") for l in range(P)]
        live = reduce_all_to_two(dp, live, keys, [w_dec] * P + [w_ku] * P)
        jobs = []
        for key, w in zip(keys, [w_dec] * P + [w_ku] * P):
            live[f"{key}_a"], live[f"{key}_b"] = live.pop(key)
            jobs.append((f"{key}_a", f"{key}_b", key, w))
        live = pipelined_add_all(dp, live, jobs)
        # rs(k u, f_k): the rounded products shifted by f_k, every lane through one barrel
        live["ku"] = [live.pop(f"ku{l}") for l in range(P)]
        live = barrel_shift_saturate(dp, live, "ku", sh["f_k"], w_ku, sh["lv"]["f_k"], "ku")
        live = self._update(m, dp, dl, live)
        # the write-back leaves from a register: the memory's address decode (one
        # enable per word, each fanning out to a word of flip-flops) has the cycle alone
        live = dp.register(live)
        # rd_en is the issue register's valid, the lane data leave the memory READ_LATENCY
        # cycles later, then dp's stages: with two banks the write must trail its read by an
        # odd number of cycles (see the module doc)
        self.write_delay = mem.READ_LATENCY + dp.stages
        if mem.banks == 2 and self.write_delay % 2 == 0:
            live = dp.register(live)
            self.write_delay += 1
        m.d.comb += [mem.wr_en.eq(live["valid"] & live["pass2"]), mem.wr_addr.eq(self._address(mem, live["addr"])),
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
        return {"valid": c_valid, "pass2": c_pass2, "last": c_last, "col": c_col}, sum_k, sum_o

    def _update(self, m, dp, dl, live) -> dict:
        """S1 = rs(S alpha), S2 = sat(S1 + rs(k u)) in pass 2, S1 passed on in pass 1: the
        word's new state ``snew``.  With f_k a run-time value rs(k u) keeps up to w_ku bits,
        but |S1| < 2**(sb-1): when rs(k u) does not fit sb + 1 bits the sum saturates to its
        sign, so the add is sb + 2 bits wide on its low bits and the fit test runs beside it."""
        P, sb, af = self.lanes, self.fm.state_bits, self.fm.alpha_frac
        tw = sb + 2
        live = dp.spend(dl.adder(tw), live)
        s1s, ts, fits, negs = [], [], [], []
        kus = live.pop("ku")
        for l in range(P):
            s1 = Value.cast(live.pop(f"dec{l}"))[af:af + sb].as_signed()   # |S1| <= |S|: no overflow
            ku = Value.cast(kus[l])
            t = Signal(signed(tw), name=f"dl_s1ku{l}")
            fit, neg = Signal(name=f"dl_kufit{l}"), Signal(name=f"dl_kuneg{l}")
            top = ku[sb:]
            m.d.comb += [t.eq(s1 + ku[:sb + 1].as_signed()), fit.eq((top == 0) | (top == (1 << len(top)) - 1)),
                         neg.eq(ku[-1])]
            s1s.append(s1)
            ts.append(t)
            fits.append(fit)
            negs.append(neg)
        live = dp.spend(dl.saturate + dl.mux_level, {**live, "s1": s1s, "t": ts, "fit": fits, "neg": negs})
        new_s = [Signal(signed(sb), name=f"dl_snew{l}") for l in range(P)]
        lo, hi = -(1 << (sb - 1)), (1 << (sb - 1)) - 1
        for l in range(P):
            s2 = Mux(live["fit"][l], clamp(live["t"][l], sb), Mux(live["neg"][l], lo, hi))
            m.d.comb += new_s[l].eq(Mux(live["pass2"], s2, live["s1"][l]))
        live.pop("fit"), live.pop("neg")
        live.pop("s1"), live.pop("t")
        live["snew"] = new_s
        return live

    def _u_pipeline(self, m, sh, col, sum_k, acc_width):
        """Per column: u_c on its own component (ColumnU) from the column's pass-1 sum, v_c
        and beta_h.  Returns u_c, its valid strobe and its column's parity."""
        N, dv = self.heads * self.d_v, self.d_v
        m.submodules.column_u = cu = ColumnU(self.fm, acc_width, sh["lv"]["f_k"], sh["sv_hi"], self.clock_period_ns)
        m.d.comb += [cu.i.valid.eq(col["valid"] & ~col["pass2"] & col["last"]), cu.i.par.eq(col["col"][0]),
                     cu.i.s.eq(sum_k[0]), cu.i.c.eq(sum_k[1]),
                     cu.i.v.eq(Array(self.v[i] for i in range(N))[col["col"]]),
                     cu.i.beta.eq(Array(self.beta[c // dv] for c in range(N))[col["col"]]),
                     cu.f_k.eq(sh["f_k"]), cu.d_sv.eq(sh["d_sv"]), cu.rnd_ks.eq(sh["rnd_ks"])]
        return cu.u, cu.valid, cu.par

    def _o_pipeline(self, m, sh, col, sum_o, acc_width):
        """Per column: o_c on its own component (ColumnOut, with the FIFO on ``o``) from the
        column's pass-2 sum.  Returns the count of columns in flight to it, the strobe that
        adds one, and the FIFO's depth."""
        m.submodules.column_out = co = ColumnOut(self.fm, acc_width, sh["lv"]["o_shift"], self.clock_period_ns)
        m.d.comb += [co.i.valid.eq(col["valid"] & col["pass2"] & col["last"]), co.i.s.eq(sum_o[0]),
                     co.i.c.eq(sum_o[1]), co.o_shift.eq(sh["o_sh"]), co.rnd_o.eq(sh["rnd_o"])]
        wiring.connect(m, co.o, wiring.flipped(self.o))
        # columns whose pass 2 started and whose o_c is not yet taken: a pass 2 starts
        # only with a FIFO place for its o_c, so the never-stalling pipeline cannot overflow it
        o_pend = Signal(range(co.depth + 1))
        p2_begin = Signal()
        m.d.sync += o_pend.eq(o_pend + p2_begin - (self.o.valid & self.o.ready))
        return o_pend, p2_begin, co.depth

    def _schedule(self, m, mem, c1, c2, pass2, issuing, u_ok, o_pend, p2_begin, ODEPTH) -> None:
        """The schedule: the FSM that interleaves the passes P1(0) P1(1) P2(0) P1(2) P2(1) ...,
        a pass-2 column waiting for its u_c and a place in the o FIFO, and with two banks
        the issue parity (module doc)."""
        N = self.heads * self.d_v
        u_here = Array(u_ok)[c2.col[0]]

        # with two banks a word is issued only on a cycle of its bank's parity: ``phase``
        # toggles every cycle (reset, so a gate-level run starts defined), and the word
        # issued now is read next cycle, so its bank must be this cycle's phase
        go1, go2 = Signal(init=1), Signal(init=1)
        if mem.banks == 2:
            phase = Signal()
            m.d.sync += phase.eq(~phase)
            # ``start`` sets it so the first word (bank 0) issues at once: a token's schedule
            # is then the same whatever the parity of the cycle it starts in (free-running,
            # a token of even length kept its parity and one of odd length alternated, so
            # the first token after reset could take a cycle less or more than the rest).
            # No write of the previous token is in flight then: its last o_c (which trails
            # every write) was taken before FINISH let the rule go idle
            with m.If(self.start):
                m.d.sync += phase.eq(0)
            m.d.comb += [go1.eq(c1.addr[0] == phase), go2.eq(c2.addr[0] == phase)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += c1.reset() + c2.reset() + [u.eq(0) for u in u_ok]
                    m.next = "ISSUE1"
            with m.State("ISSUE1"):
                m.d.comb += self.busy.eq(1)
                with m.If(go1):
                    m.d.comb += issuing.eq(1)
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
                m.d.comb += [self.busy.eq(1), pass2.eq(1)]
                with m.If(go2):
                    m.d.comb += issuing.eq(1)
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
                    # every word of the token's layer was rewritten by this token: that
                    # layer's state is valid
                    if self.layers == 1:
                        m.d.comb += mem.commit.eq(1)
                    else:
                        m.d.comb += mem.commit.eq(Cat(self.layer == l for l in range(self.layers)))
                    m.next = "IDLE"


class ColumnU(wiring.Component):
    """The delta rule's step between a column's two passes (module doc):

        u_c = sat(rs(beta_h ((v_c << (f_s - f_v)) - kS), unit_frac)),  kS = sat(rs(sum_k, f_k))

    ``i`` carries the column's pass-1 sum (carry-save ``s``, ``c``), its v_c and beta_h and
    its parity; registered here on entry, then over clock-derived stages to ``u`` with
    ``valid`` and ``par`` a fixed number of cycles later, never stalling.  ``f_k``, ``d_sv``
    (f_s - f_v) and ``rnd_ks`` (2**(f_k-1) as a word) come from the owner's shift registers,
    stable while a token runs."""

    def __init__(self, fm: Formats, acc_width: int, f_k_levels: int, sv_hi: int, clock_period_ns: float):
        self.fm, self.acc_width, self.f_k_levels = fm, acc_width, f_k_levels
        self.dw = max(fm.state_bits, fm.qkv_bits + sv_hi) + 2     # v << (f_s - f_v), sign included
        self.clock_period_ns = clock_period_ns
        super().__init__({
            "i": In(data.StructLayout({"valid": 1, "par": 1, "s": acc_width, "c": acc_width,
                                       "v": signed(fm.qkv_bits), "beta": unsigned(fm.unit_frac + 1)})),
            "f_k": In(f_k_levels),
            "d_sv": In(max(1, sv_hi.bit_length())),
            "rnd_ks": In(acc_width),
            "u": Out(signed(fm.state_bits)),
            "valid": Out(1),
            "par": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        fm, acc_width, dw, d_sv = self.fm, self.acc_width, self.dw, self.d_sv
        sb, uf = fm.state_bits, fm.unit_frac
        plan = plan_pipeline(self.clock_period_ns)
        dl = plan.delays
        cu = {"valid": Signal(name="cu_valid"), "par": Signal(name="cu_par"),
              "s": Signal(acc_width, name="cu_s"), "c": Signal(acc_width, name="cu_c"),
              "v": Signal(signed(fm.qkv_bits), name="cu_v"), "beta": Signal(unsigned(uf + 1), name="cu_beta")}
        m.d.sync += [cu[key].eq(self.i[key]) for key in cu]
        up = Pipe(m, plan, "du")
        # v << (f_s - f_v): a left barrel, one level per bit of the difference's range
        vsh = sign_extend(cu.pop("v"), dw)
        live = cu
        for bit in range(len(d_sv)):
            live = up.spend(dl.mux_level, {**live, "vsh": vsh})
            v = Value.cast(live.pop("vsh"))
            vsh = Signal(dw, name=f"du_vsh{bit}")
            m.d.comb += vsh.eq(Mux(d_sv[bit], Cat(Const(0, 1 << bit), v)[:dw], v))
        live["vsh"] = vsh
        live = up.spend(dl.csa_level, live)
        live["a"], live["b"] = compress_3_2(live.pop("s"), live.pop("c"), self.rnd_ks, acc_width)
        live = pipelined_add(up, live, "a", "b", "acc", acc_width)
        live = barrel_shift_saturate(up, live, "acc", self.f_k, acc_width, self.f_k_levels, "ks", [sb])
        # beta (vsh - ks) = beta vsh + beta ~ks + beta (~ks = -ks - 1): no carry chain for the
        # difference (as wide as the largest f_s - f_v allows), both products and beta
        # itself are words of one Booth tree with the rounding constant.  A mux level more
        # than a lone Booth select: the products' sign extensions (28 bits of ~ks) merge
        # into nets that fan out across the tree's top (small at 1 ns was 0.110 ns short
        # with 4 compressor levels behind the select)
        w_u = dw + uf + 3
        live = up.spend(dl.booth_select + dl.mux_level, live)
        beta = live.pop("beta")
        live["words"] = (booth_partial_products(m, live.pop("vsh"), beta, w_u, multiplier_signed=False, name="du_bv")
                         + booth_partial_products(m, ~Value.cast(live.pop("ks")), beta, w_u, multiplier_signed=False,
                                                  name="du_bk")
                         + [zero_extend(beta, w_u), Const(1 << (uf - 1) if uf else 0, w_u)])
        live = reduce_to_two(up, live, "words", w_u)
        live["ba"], live["bb"] = live.pop("words")
        live = pipelined_add(up, live, "ba", "bb", "bu", w_u)
        live = up.spend(dl.saturate, live)
        m.d.comb += [self.u.eq(clamp(Value.cast(live["bu"])[uf:].as_signed(), sb)),
                     self.valid.eq(live["valid"]), self.par.eq(live["par"])]
        return m


class ColumnOut(wiring.Component):
    """The delta rule's output of a column: o_c = sat_{o_bits}(rs(sum_o, o_shift)) from the
    column's pass-2 sum (carry-save, ``i``, registered here on entry), over clock-derived
    stages into a ``depth``-entry FIFO on ``o``.  The pipeline never stalls: the owner starts
    a column's pass 2 only with a place in the FIFO for its o_c.  ``o_shift`` and ``rnd_o``
    (2**(o_shift-1) as a word) come from the owner's shift registers."""

    def __init__(self, fm: Formats, acc_width: int, o_shift_levels: int, clock_period_ns: float, depth: int = 2):
        self.fm, self.acc_width, self.o_shift_levels, self.depth = fm, acc_width, o_shift_levels, depth
        self.clock_period_ns = clock_period_ns
        super().__init__({
            "i": In(data.StructLayout({"valid": 1, "s": acc_width, "c": acc_width})),
            "o_shift": In(o_shift_levels),
            "rnd_o": In(acc_width),
            "o": Out(stream.Signature(signed(fm.o_bits))),
        })

    def elaborate(self, platform):
        m = Module()
        acc_width, o_bits = self.acc_width, self.fm.o_bits
        plan = plan_pipeline(self.clock_period_ns)
        dl = plan.delays
        co = {"valid": Signal(name="co_valid"), "s": Signal(acc_width, name="co_s"),
              "c": Signal(acc_width, name="co_c")}
        m.d.sync += [co[key].eq(self.i[key]) for key in co]
        op = Pipe(m, plan, "do")
        live = op.spend(dl.csa_level, co)
        live["a"], live["b"] = compress_3_2(live.pop("s"), live.pop("c"), self.rnd_o, acc_width)
        live = pipelined_add(op, live, "a", "b", "acc", acc_width)
        live = barrel_shift_saturate(op, live, "acc", self.o_shift, acc_width, self.o_shift_levels, "y", [o_bits])
        live = op.register(live)
        m.submodules.o_fifo = o_fifo = SyncFIFOBuffered(width=o_bits, depth=self.depth)
        m.d.comb += [o_fifo.w_en.eq(live["valid"]), o_fifo.w_data.eq(live["y"]),
                     self.o.valid.eq(o_fifo.r_rdy), self.o.payload.eq(o_fifo.r_data.as_signed()),
                     o_fifo.r_en.eq(self.o.ready)]
        return m


class _Cursor:
    """One pass's issue cursor: walks the words in memory order (column-major, column
    c = h*d_v + j holding words c*nb .. c*nb+nb-1), with the row block and column it is at."""
    def __init__(self, m, name, words, H, nb, dv):
        self.m, self.nb, self.dv = m, nb, dv
        N = H * dv
        self.addr = Signal(range(words), name=f"{name}_addr")
        self.g = Signal(range(H * nb), name=f"{name}_g")          # row block h*nb + b
        self.g_head = Signal(range(H * nb), name=f"{name}_ghead")  # h*nb
        self.b = Signal(range(nb), name=f"{name}_b")
        self.j = Signal(range(dv), name=f"{name}_j")
        self.col = Signal(range(N + 1), name=f"{name}_col")
        self.last = self.b == nb - 1

    def reset(self):
        return [v.eq(0) for v in (self.addr, self.g, self.g_head, self.b, self.j, self.col)]

    def advance(self):
        m, nb, dv = self.m, self.nb, self.dv
        m.d.sync += [self.addr.eq(self.addr + 1), self.b.eq(self.b + 1), self.g.eq(self.g + 1)]
        with m.If(self.last):
            m.d.sync += [self.b.eq(0), self.col.eq(self.col + 1), self.j.eq(self.j + 1),
                         self.g.eq(self.g_head)]
            with m.If(self.j == dv - 1):       # next head: g + 1 is its first block
                m.d.sync += [self.j.eq(0), self.g_head.eq(self.g_head + nb), self.g.eq(self.g + 1)]
