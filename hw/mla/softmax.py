"""The online softmax of a Gated MLA head (issue 15): scores and latents in, one pass, the
softmax-weighted latent out.  Implements ``model.int_mla.online_softmax`` bit for bit.

For the positions j = 0 .. T-1 of one head (u_j: the score in base 2 with F = mla_exp_frac
fractional bits; c_j: the cached latent, r values), token by token:

    M_j  = max(M_j-1, ceil(u_j / 2**F))      (M_0 = ceil(u_0 / 2**F))
    D    = M_j - M_j-1                       l, acc = floor(l / 2**D), floor(acc / 2**D)
    n, f = divmod(M_j 2**F - u_j, 2**F)      p_j = table2[f] >> n   (U1.P, Formats.mla_exp2_table)
    l   += p_j;  acc += p_j c_j
    out  = sat(sign(acc) floor((2|acc| + l) / (2 l)))   after the last position

The maximum moves in whole powers of two, so the rescale is an arithmetic shift (the
integer model's segments are the same integers).  The same recurrence mixes Attention
Residuals' kept values (widths attn_res_*), so the unit takes its widths as arguments;
``mla_softmax(cfg)`` builds the MLA layer's.

Ports
-----
``i``  stream, one beat per position: ``u`` (u_bits signed), ``c`` (r x value_bits signed),
       ``last`` (the head's final position).  The beat after a ``last`` (and the first after
       reset) starts a new head.
``o``  stream, one beat per head: r x out_bits signed.  From registers.

Pipeline (the loop-carried parts in one stage each: the running maximum in stage 2, the
sums in stage 6):

    1  the beat, w = ceil(u / 2**F) and -u mod 2**F in registers
    2a M = max(M, w) (a compare and a mux: the loop)
    2b D = min(w - M_old, 63) when the maximum rose; delta = M 2**F - u (taken for both
       outcomes of the compare, then picked)
    3  table2[delta mod 2**F], n = min(delta >> F, 31)
    4  p = table >> n
    5  the r products p c_j as carry-save pairs (Booth words)
    6  acc += p c as a carry-save pair (two full adders: the loop has no carry chain),
       l += p (the same way).  When D > 0, first RESOLVE + 1 = 3 cycles with the pipeline
       held: the pair resolves (registers that resolve it every cycle, in two halves), then
       shifts back into the pair, l with it.

Then a restoring divider: one quotient bit every two cycles (subtract into a register, then
keep it or not) for every element at once, out_bits + 1 bits (the rounded quotient is at most
2**(out_bits - 1) + 1, as |acc| <= ~l 2**(out_bits - 1)), and a cycle to form the saturated
result.  It starts 2 RESOLVE = 4 cycles after a head's last add (the resolved sum, then
2|acc| + l, each a registered add in two halves) and works while the next head accumulates.

Every element is a ``SoftmaxLane`` (its value through the stages, product, sums, divider)
with its own copy of the stall control (``control``): the copies step together, and each
drives only its own module's registers.  With one copy, ``advance`` and ``busy`` each drove
every element's registers, and ABC buffered those nets as chains of 20-odd buffers (1.2 ns
of model-tiny-hybrid's 1.25).  The flow keeps the hierarchy, so Yosys does not merge them.

Every stage moves together (``advance``); the pipeline holds for a rescale and while a
finished head's sums wait for the divider, which waits for ``o`` to take the previous result.
Cycles per head: one per position, RESOLVE + 1 = 3 per rise of the running maximum (a
handful per head on real scores: the maximum of T random scores rises about ln T times),
2 RESOLVE + 1 = 5 between heads; at least 2 (out_bits + 1) + 6 (the divider), so shorter
heads wait on it.  Measured (sim/cocotb/tb_mla_softmax.py, heads of 32 positions):
model-tiny-hybrid 40.9 cycles per head with 1.3 rises, model-small-hybrid 43.4 with 2.1.
Post-synthesis (`moekda synth -c <cfg> --top mla_softmax`): model-tiny-hybrid (8 lanes)
WNS +0.221 ns at 1.25 ns, 62,951 um2; model-small-hybrid (32 lanes) WNS -0.029 ns at
1.0 ns (972 MHz: the divider's start decode and stage 2b's distance subtract), 243,133 um2.
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.carry_save import booth_partial_products, compress_3_2, prefix_add, sign_extend, zero_extend
from moekda.config import ConfigError
from moekda.formats import derived_widths, formats_for

MAX_SHIFT = 63      # a rescale by more clears the sums as a shift by 62 does in the model
N_MAX = 31          # p = table >> n is 0 for any n from p_bits up
SCORE_STAGES = 5    # stages 1, 2a, 2b, 3, 4 before the products (each lane's value beside them)
RESOLVE = 2         # cycles to resolve a carry-save sum (two chunked adds: 40 bits in one
                    # missed model-small-hybrid's 1 ns)


def beat_layout(r: int, u_bits: int, value_bits: int) -> data.StructLayout:
    return data.StructLayout({"u": signed(u_bits), "c": data.ArrayLayout(signed(value_bits), r), "last": 1})


def registered_add(m, a, b, width: int, name: str, carry_in=0) -> Signal:
    """(a + b + carry_in) mod 2**width in a register RESOLVE = 2 cycles later, as two halves:
    the low half's sum and carry, then the high half's.  For sums that are not in a loop: a
    40-bit add in one cycle missed model-small-hybrid's 1 ns (ABC maps the prefix network
    back to a ripple where it thinks the clock allows)."""
    a, b = zero_extend(a, width), zero_extend(b, width)
    H = width // 2
    lo = Signal(H + 1, name=f"{name}_lo")
    hi_a, hi_b = Signal(width - H, name=f"{name}_hi_a"), Signal(width - H, name=f"{name}_hi_b")
    out = Signal(width, name=name)
    m.d.sync += [lo.eq(prefix_add(m, a[:H], b[:H], carry_in=carry_in, name=f"{name}_lo_add")),
                 hi_a.eq(a[H:]), hi_b.eq(b[H:]),
                 out.eq(Cat(lo[:H], prefix_add(m, hi_a, hi_b, carry_in=lo[H], name=f"{name}_hi_add")[:width - H]))]
    return out


def _sub(m, a, b, width: int, name: str) -> Value:
    """a - b modulo 2**width as a Kogge-Stone add (a + ~b + 1); bit ``width``: a >= b (unsigned)."""
    return prefix_add(m, zero_extend(a, width), ~zero_extend(b, width), carry_in=1, name=name)


@dataclass
class Control:
    """The stall control of stages 5 and 6 and the divider, built in every module that needs
    it (``control``): the top, for ``i.ready`` and ``o.valid``, and each lane, for its own
    registers.  The copies see the same inputs and reset, so they step together; each module
    drives only its own registers, where one copy in the top drove every lane's (hundreds of
    flops on one net, which ABC buffered as chains of 20-odd buffers, 1.2 ns)."""
    advance: Value      # every stage moves
    add: Value          # the stage-5 beat goes into the sums
    rescale: Value      # a rise of the maximum, first cycle: the carry-save sums resolve
    shift: Value        # after RESOLVE cycles: the sums shift by D5 (the pipeline holds throughout)
    start: Value        # the divider takes the finished sums
    steps: Signal       # divider cycles left (divider_steps; the result forms with steps == 1)
    div_lo: Signal      # this cycle the divider subtracts the low half (steps odd, > 1)
    div_pick: Signal    # this cycle it subtracts the high half and keeps the result or not
    out_valid: Signal


def divider_steps(q_bits: int) -> int:
    """Cycles of the divider: two per quotient bit, one to form the result."""
    return 2 * q_bits + 1


def control(m, v5, first5, last5, nz5, out_ready, q_bits: int) -> Control:
    pending = Signal()        # the sums hold a whole head the divider has not taken
    phase = Signal(range(RESOLVE + 2))   # the stage-5 beat's rescale: cycles held so far
    steps = Signal(range(divider_steps(q_bits) + 1))
    out_valid = Signal()
    c = Control(advance=Signal(), add=Signal(), rescale=Signal(), shift=Signal(), start=Signal(),
                steps=steps, div_lo=Signal(), div_pick=Signal(), out_valid=out_valid)
    # pending for 2 RESOLVE cycles: the lanes' resolved sum, then their num_pre, hold the
    # final sums
    settled = Signal(2 * RESOLVE)
    m.d.sync += settled.eq(Mux(pending & ~c.start, Cat(1, settled[:-1]), 0))
    holds = Signal()
    m.d.comb += [holds.eq(v5 & ~first5 & nz5 & (phase != RESOLVE + 1) & ~pending),
                 c.rescale.eq(holds & (phase == 0)), c.shift.eq(holds & (phase == RESOLVE)),
                 c.advance.eq(~pending & ~holds), c.add.eq(v5 & c.advance),
                 c.start.eq(settled[-1] & (steps == 0) & ~out_valid)]
    with m.If(holds):
        m.d.sync += phase.eq(phase + 1)
    with m.If(c.add):
        m.d.sync += phase.eq(0)
        with m.If(last5):
            m.d.sync += pending.eq(1)
    # the divider's phases as flags registered from the next count (a decode of ``steps``
    # in front of every divider register's enable was 0.07 ns over model-small-hybrid's 1 ns)
    nxt = Signal.like(steps)
    m.d.comb += nxt.eq(Mux(c.start, divider_steps(q_bits), Mux(steps != 0, steps - 1, 0)))
    m.d.sync += [steps.eq(nxt), c.div_lo.eq((nxt > 1) & nxt[0]), c.div_pick.eq((nxt > 1) & ~nxt[0])]
    with m.If(c.start):
        m.d.sync += pending.eq(0)
    with m.Elif(steps != 0):
        with m.If(steps == 1):
            m.d.sync += out_valid.eq(1)
    with m.If(out_valid & out_ready):
        m.d.sync += out_valid.eq(0)
    return c


class SoftmaxLane(wiring.Component):
    """One latent element of the online softmax: its value through the SCORE_STAGES (beside the
    scores), the product p c as a carry-save pair (stage 5), its sums (stage 6: acc, and its
    own copy of l) and its divider, under its own copy of the control.  A module of its own
    so that Yosys keeps the copies apart (the flow keeps the hierarchy)."""

    def __init__(self, *, value_bits: int, out_bits: int, p_bits: int, sum_bits: int, acc_bits: int):
        self.value_bits, self.out_bits, self.p_bits = value_bits, out_bits, p_bits
        self.sum_bits, self.acc_bits, self.q_bits = sum_bits, acc_bits, out_bits + 1
        self.n_bits = max(acc_bits + 1, sum_bits + 1 + self.q_bits)
        super().__init__({
            "valid": In(1),         # the top's input offers a beat (taken when the stages move)
            "c": In(signed(value_bits)),
            # the stage-4 beat of the top's score stages: this lane registers its own copies
            "v4": In(1), "first4": In(1), "last4": In(1),
            "D4": In(range(MAX_SHIFT + 1)),
            "p4": In(p_bits),
            "out_ready": In(1),     # o.ready
            "out": Out(signed(out_bits)),   # the result, in the divider's last step
        })

    def elaborate(self, platform):
        m = Module()
        A, QB, NB, SB = self.acc_bits, self.q_bits, self.n_bits, self.sum_bits
        v5, first5, last5, nz5 = Signal(), Signal(), Signal(), Signal()
        D5 = Signal(range(MAX_SHIFT + 1))
        p5 = Signal(self.p_bits)
        ctl = control(m, v5, first5, last5, nz5, self.out_ready, QB)
        cs = [Signal(signed(self.value_bits), name=f"c{k}") for k in range(1, SCORE_STAGES + 1)]
        with m.If(ctl.advance):
            m.d.sync += cs[0].eq(Mux(self.valid, self.c, cs[0]))
            m.d.sync += [b.eq(a) for a, b in zip(cs, cs[1:])]
            m.d.sync += [v5.eq(self.v4), first5.eq(self.first4), last5.eq(self.last4), D5.eq(self.D4),
                         nz5.eq(self.D4 != 0), p5.eq(self.p4)]

        # stage 5: p c as Booth words of c's digits, reduced to a carry-save pair
        words = booth_partial_products(m, Cat(self.p4, Const(0, 1)).as_signed(), cs[-1], A, name="prod")
        while len(words) > 2:
            nxt = []
            for j in range(0, len(words) - 2, 3):
                nxt += compress_3_2(words[j], words[j + 1], words[j + 2], A)
            words = nxt + words[len(words) - len(words) % 3:]
        words += [Const(0, A)] * (2 - len(words))
        prod_s, prod_c = Signal(A), Signal(A)
        with m.If(ctl.advance):
            m.d.sync += [prod_s.eq(words[0]), prod_c.eq(words[1])]

        # stage 6: acc as a carry-save pair (sum + carry), so the loop is two full adders
        # deep: a resolved 40-bit add in the loop missed 1.25 ns.  ``res`` resolves the pair
        # every cycle (a register of its own): a rise of the maximum shifts it back into the
        # pair a cycle later (``shift``), and the divider reads it.  The divider's start
        # clears the sums for the next head.
        acc_s, acc_c = Signal(A), Signal(A)
        res = registered_add(m, acc_s, acc_c, A, "res").as_signed()   # RESOLVE cycles behind
        s1, c1 = compress_3_2(acc_s, acc_c, prod_s, A)
        s2, c2 = compress_3_2(s1, c1, prod_c, A)
        # l the same way (a resolved 32-bit add in its loop missed model-small-hybrid's 1 ns)
        l_s, l_c = Signal(SB), Signal(SB)
        l = registered_add(m, l_s, l_c, SB, "l")                   # resolved, RESOLVE cycles behind
        ls1, lc1 = compress_3_2(l_s, l_c, zero_extend(p5, SB), SB)
        with m.If(ctl.shift):
            m.d.sync += [acc_s.eq(res >> D5), acc_c.eq(0), l_s.eq(l >> D5), l_c.eq(0)]
        with m.Elif(ctl.add):
            m.d.sync += [acc_s.eq(s2), acc_c.eq(c2), l_s.eq(ls1), l_c.eq(lc1)]
        with m.Elif(ctl.start):
            m.d.sync += [acc_s.eq(0), acc_c.eq(0), l_s.eq(0), l_c.eq(0)]

        # the divider: q = floor((2|acc| + l) / (2 l)), QB bits, from the top bit
        num = Signal(NB)
        div = Signal(NB)                  # 2 l << (QB - 1), halved every bit
        quo = Signal(QB)
        neg = Signal()
        # 2|acc| + l = l + (2 acc XOR sign) + sign: one add (a negation, then an add, was
        # 1.8 ns), registered every cycle from the resolved sums; the start (2 RESOLVE
        # cycles after the last add) copies it
        a2 = sign_extend(Cat(Const(0, 1), res), NB)
        num_pre = registered_add(m, l, a2 ^ res[-1].replicate(NB), NB, "num_pre", carry_in=res[-1])
        # a quotient bit in two cycles (the subtract and the select in one were 1.4 ns):
        # ``div_lo``, the low half of num - div = num + ~div + 1 and its carry into a
        # register; ``div_pick``, the high half (its carry out: num >= div), then keep the
        # difference or not.  The last step (steps == 1) forms the saturated result from
        # the registered quotient.
        H = NB // 2
        lo = Signal(H + 1)
        with m.If(ctl.start):
            m.d.sync += [num.eq(num_pre), div.eq(l << QB), quo.eq(0), neg.eq(res[-1])]
        with m.Elif(ctl.div_lo):
            m.d.sync += lo.eq(prefix_add(m, num[:H], ~div[:H], carry_in=1, name="div_lo"))
        with m.Elif(ctl.div_pick):
            hi_sum = prefix_add(m, num[H:], ~div[H:], carry_in=lo[H], name="div_hi")
            ge = hi_sum[NB - H]
            m.d.sync += [num.eq(Mux(ge, Cat(lo[:H], hi_sum[:NB - H]), num)), quo.eq(Cat(ge, quo[:-1])),
                         div.eq(div >> 1)]
        hi = (1 << (self.out_bits - 1)) - 1
        m.d.comb += self.out.eq(Mux(neg, -Mux(quo > hi + 1, hi + 1, quo), Mux(quo > hi, hi, quo)))
        return m


class OnlineSoftmax(wiring.Component):
    def __init__(self, r: int, *, u_bits: int, value_bits: int, out_bits: int, frac_bits: int,
                 table, sum_bits: int, acc_bits: int):
        if r < 1:
            raise ValueError(f"online softmax: needs at least one value per position, got {r}")
        self.r, self.u_bits, self.value_bits, self.out_bits = r, u_bits, value_bits, out_bits
        self.F, self.table = frac_bits, [int(t) for t in table]
        if len(self.table) != 1 << frac_bits:
            raise ValueError(f"online softmax: the exp2 table has {len(self.table)} entries, 2**{frac_bits} needed")
        self.p_bits = max(self.table).bit_length()
        self.sum_bits, self.acc_bits = sum_bits, acc_bits
        self.q_bits = out_bits + 1
        super().__init__({
            "i": In(stream.Signature(beat_layout(r, u_bits, value_bits))),
            "o": Out(stream.Signature(data.ArrayLayout(signed(out_bits), r))),
        })

    def elaborate(self, platform):
        m = Module()
        F, UB = self.F, self.u_bits
        w_bits = UB - F + 1                           # ceil(u / 2**F), signed
        v5, first5, last5, nz5 = Signal(), Signal(), Signal(), Signal()
        ctl = control(m, v5, first5, last5, nz5, self.o.ready, self.q_bits)
        advance = ctl.advance
        m.d.comb += self.i.ready.eq(advance)

        # stage 1: the score, its ceil, and -u mod 2**F (the distance below a new maximum)
        v1, last1, first1 = Signal(), Signal(), Signal()
        u1 = Signal(signed(UB))
        whole1 = Signal(signed(w_bits))
        frac1 = Signal(F)
        head_start = Signal(init=1)                   # the next accepted beat starts a head
        u_in = self.i.payload.u
        with m.If(advance):
            m.d.sync += v1.eq(self.i.valid)
            with m.If(self.i.valid):
                m.d.sync += [u1.eq(u_in), last1.eq(self.i.payload.last),
                             whole1.eq((u_in + ((1 << F) - 1)) >> F), frac1.eq(-u_in[:F]),
                             first1.eq(head_start), head_start.eq(self.i.payload.last)]

        # stage 2a: the running maximum alone in its loop: a compare (the carry out of a
        # prefix subtract, sign bits flipped for the signed order) and a mux
        M = Signal(signed(w_bits))
        msb = 1 << (w_bits - 1)
        up = ~_sub(m, M ^ msb, whole1 ^ msb, w_bits, "cmp")[w_bits]   # whole > M: not M >= whole
        take_new = first1 | up
        va, lasta, firsta, upa = Signal(), Signal(), Signal(), Signal()
        m_old, wholea = Signal(signed(w_bits)), Signal(signed(w_bits))
        ua = Signal(signed(UB))
        fraca = Signal(F)
        with m.If(advance):
            m.d.sync += [va.eq(v1), lasta.eq(last1), firsta.eq(first1), upa.eq(up & ~first1),
                         m_old.eq(M), wholea.eq(whole1), ua.eq(u1), fraca.eq(frac1)]
            with m.If(v1):
                m.d.sync += M.eq(Mux(take_new, whole1, M))

        # stage 2b: the rise D = whole - M_old (when the maximum rose) and the distance
        # delta = M 2**F - u, taken both ways (a new maximum's is -u mod 2**F) and picked (the
        # adds as Kogge-Stone networks, hw/arith/carry_save.py prefix_add: Yosys's ripple
        # chains missed the clock here)
        rise = _sub(m, wholea, m_old, w_bits + 1, "rise")[:w_bits + 1]
        delta_m = _sub(m, Cat(Const(0, F), m_old), sign_extend(ua, UB + 1), UB + 1, "delta")[:UB + 1]
        v2, last2, first2 = Signal(), Signal(), Signal()
        D2 = Signal(range(MAX_SHIFT + 1))
        delta2 = Signal(UB + 1)
        big = rise[6:w_bits].any()                             # a rise past MAX_SHIFT
        with m.If(advance):
            m.d.sync += [v2.eq(va), last2.eq(lasta), first2.eq(firsta),
                         delta2.eq(Mux(upa | firsta, fraca, delta_m)),
                         D2.eq(Mux(upa, Mux(big, MAX_SHIFT, rise[:6]), 0))]

        # stage 3: the table entry of the fraction, the whole part of the distance
        v3, last3, first3 = Signal(), Signal(), Signal()
        D3 = Signal.like(D2)
        t3 = Signal(self.p_bits)
        n3 = Signal(range(N_MAX + 1))
        whole_dist = delta2 >> F
        table = Array(Const(t, self.p_bits) for t in self.table)
        with m.If(advance):
            m.d.sync += [v3.eq(v2), last3.eq(last2), first3.eq(first2), D3.eq(D2),
                         t3.eq(table[delta2[:F]]), n3.eq(Mux(whole_dist > N_MAX, N_MAX, whole_dist))]

        # stage 4: p = table >> n
        v4, last4, first4 = Signal(), Signal(), Signal()
        D4 = Signal.like(D2)
        p4 = Signal(self.p_bits)
        with m.If(advance):
            m.d.sync += [v4.eq(v3), last4.eq(last3), first4.eq(first3), D4.eq(D3), p4.eq(t3 >> n3)]
            # the top's copy of stage 5, for its control
            m.d.sync += [v5.eq(v4), first5.eq(first4), last5.eq(last4), nz5.eq(D4 != 0)]

        outs = []
        for k in range(self.r):
            lane = SoftmaxLane(value_bits=self.value_bits, out_bits=self.out_bits, p_bits=self.p_bits,
                               sum_bits=self.sum_bits, acc_bits=self.acc_bits)
            m.submodules[f"lane{k}"] = lane
            m.d.comb += [lane.valid.eq(self.i.valid), lane.c.eq(self.i.payload.c[k]),
                         lane.v4.eq(v4), lane.first4.eq(first4), lane.last4.eq(last4), lane.D4.eq(D4),
                         lane.p4.eq(p4), lane.out_ready.eq(self.o.ready)]
            outs.append(lane.out)
        # the results in a register of this module: the lanes' outputs straight on the array
        # port gave its element wires (o__payload[k]) to the lane instances, and the
        # netlist's bit-split ports then collided with them (o__payload[0]_1: OpenSTA
        # could not read the ports)
        result = Signal(self.r * self.out_bits)
        with m.If(ctl.steps == 1):
            m.d.sync += result.eq(Cat(*outs))
        m.d.comb += [self.o.payload.eq(result), self.o.valid.eq(ctl.out_valid)]
        return m


def mla_softmax(cfg) -> OnlineSoftmax:
    """The online softmax of ``cfg``'s MLA layer: kv_rank int8 latents, mla_u_bits scores."""
    m, fm = cfg.model, formats_for(cfg)
    if m.kv_rank == 0:
        raise ConfigError(f"config {cfg.name}: model.kv_rank = 0, there is no MLA layer "
                          f"(a config with \"mla\" in model.layers has one)")
    w = derived_widths(cfg)
    return OnlineSoftmax(m.kv_rank, u_bits=fm.mla_u_bits, value_bits=fm.act_bits, out_bits=fm.act_bits,
                         frac_bits=fm.mla_exp_frac, table=fm.mla_exp2_table, sum_bits=w["mla_sum"],
                         acc_bits=w["mla_acc"])
