"""The depth unit of Attention Residuals (issue 15): each sequence slot's kept values, their
keys, and the softmax mix over them.  Implements ``model.int_attn_res.IntDepthResidual``
bit for bit, one command at a time.

Commands (``i``, one beat each: ``op``, ``slot``, ``v`` d x resid_bits):

``START``  a new token in ``slot``: v = x_0; v_0 = requantize(x_0, emb_m, emb_s, resid_bits)
           becomes the slot's only kept value (what the slot held before is dropped).
``ADD``    sub-layer n's output, already at the depth scale: v = v_n.  The chip's residual
           add gives it (m_a = 0, m_b = out_m[n], s = out_s[n]: hw/image/param_map.py
           attn_res_residuals).  Full: kept as a new value; block: added into its block's
           partial with saturation, or starting one (hw/attnres/kept.py).
``MIX``    the slot's next input: the softmax over its kept values with query n (n = the
           outputs added so far: sub-layer n + 1's input, or the stack's output after N),
           one beat on ``o`` (d x resid_bits).  ``v`` is not read.

The value a START or ADD keeps is formed in a work register by a residual add
(hw/arith/residual.py; x_0 with (0, emb_m, emb_s), a new value with (0, 1, 0), a partial with
(1, 1, 0): sat(rs(a m_a + b m_b, s)) is each of the model's steps exactly), its key by the
shared normaliser (hw/kda/norm.py, ``attn_res.key_norm``, int8), then both are stored in the
slot's row.  A key is computed once, when its value is kept: only a block's partial changes,
and it is then a new value with a new key.

A MIX reads its query row (``attn_res.queries`` row n, hw/image/memory_map.py) on ``wport``
into registers, then streams each kept key against it through the unit's matrix-vector
engine (hw/arith/matvec.py: u_i = requantize(q . key_i, u_m[n], u_s[n], mla_u_bits)), and each
score with its value into the online softmax (hw/mla/softmax.py, at the widths
attn_res_sum / attn_res_acc, d lanes, out resid_bits).  The command ends when its last
value is in the softmax (the softmax holds it from there), so the next command overlaps
the softmax's divider; ``o`` back-pressure holds the softmax and so the next MIX.

``params`` is ``param_layout(cfg, "attn_res", mixer="head")`` (the model's block); stable
while a command is inside.  Reset drops every command inside; a slot's next command must
then be a START.  Storage: registers, slots x kept_vectors x d x (resid_bits + act_bits)
bits (model-tiny-hybrid: 2 x 5 x 16 x 24 = 3,840).

Measured (sim/tests/block/test_attnres.py, Icarus, no stalls, weight-port latency 4): on
model-tiny-hybrid (block, 5 kept values at most) 80.8 cycles from a MIX to its output, 119
cycles per START or ADD (the residual add over d, then the normaliser's two passes and its
rsqrt: the larger share), 1,376 cycles per token (9 mixes, a START, 8 ADDs, one after
another); full (9 kept values) 87.7 per mix, 1,440 per token.  The commands do not overlap
(a MIX's query read could start while the ADD before it normalises): left for the chip,
where the sub-layers' own cycles (hundreds per sub-layer) hide most of it.
Post-synthesis (`moekda synth -c configs/model-tiny-hybrid.toml --top attnres`): WNS
+0.137 ns at 1.25 ns (898 MHz reg-to-reg), 213,148 um2 (18,927 flip-flops); the softmax's
16 lanes of 16-bit values are 60 % of it (128,884 um2), the kept rows and the unit's own
logic 20 %, the engine 8 %, the normaliser 7 %.
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from hw.arith.matvec import MatVecEngine, MatVecFormats, port_groups
from hw.attnres.kept import add_index, adds_to_partial, kept_count, kept_vectors, sublayers
from hw.arith.residual import ResidualAdd
from hw.stream.skid import SkidBuffer
from hw.stream.weight_port import WeightPortSignature
from hw.image.memory_map import memory_map, sequence_slots, slot_bits
from hw.image.param_map import param_layout
from hw.kda.norm import Normalizer
from hw.mla.softmax import OnlineSoftmax
from moekda.config import ConfigError
from moekda.formats import derived_widths, formats_for


class Op(enum.Enum, shape=2):
    START = 0
    ADD = 1
    MIX = 2


def command_layout(cfg) -> data.StructLayout:
    fm = formats_for(cfg)
    return data.StructLayout({"op": Op, "slot": slot_bits(cfg),
                              "v": data.ArrayLayout(signed(fm.resid_bits), cfg.model.d_model)})


def require_attn_res(cfg) -> None:
    """ConfigError (one line) unless the config has Attention Residuals."""
    if cfg.model.attn_res == "none":
        raise ConfigError(f"config {cfg.name}: model.attn_res = \"none\", so no depth unit "
                          f"(\"full\" or \"block\" has one)")


class DepthUnit(wiring.Component):
    def __init__(self, cfg):
        require_attn_res(cfg)
        self.cfg, self.fm = cfg, formats_for(cfg)
        m = cfg.model
        self.d, self.N = m.d_model, sublayers(cfg)
        self.K = kept_vectors(m.attn_res, self.N, m.attn_res_block)
        self.slots = sequence_slots(cfg)
        self.W = cfg.hw.weight_port_bytes
        self.queries = memory_map(cfg)["attn_res.queries"]
        super().__init__({
            "i": In(stream.Signature(command_layout(cfg))),
            "o": Out(stream.Signature(data.ArrayLayout(signed(self.fm.resid_bits), self.d))),
            "wport": Out(WeightPortSignature(self.W)),
            "params": In(param_layout(cfg, "attn_res", mixer="head")),
            "mac_beat": Out(1),         # the engine's beat: hw.lanes MACs (the chip's MACS counter)
        })

    def elaborate(self, platform):
        # the kept rows, forming a value and its key, and the control here; the mix (query
        # row, scores, softmax) is a method of its own, building into this Module
        m = Module()
        cfg, fm, P = self.cfg, self.fm, self.params
        d, N, K, S = self.d, self.N, self.K, self.slots
        rb, a = fm.resid_bits, fm.act_bits

        def vec(name, n, shape):
            return [Signal(shape, name=f"{name}{i}") for i in range(n)]
        # the kept values and keys, row slot * K + k
        VAL = [vec(f"val{r}_", d, signed(rb)) for r in range(S * K)]
        KEY = [vec(f"key{r}_", d, signed(a)) for r in range(S * K)]
        WORK = vec("work", d, signed(rb))        # the value being formed
        KEYW = vec("keyw", d, signed(a))         # its key
        VIN = vec("vin", d, signed(rb))          # the command's vector
        Q = vec("q", d, signed(a))               # the mix's query
        count = [Signal(range(N + 1), name=f"count{s}") for s in range(S)]   # outputs added per slot

        op = Signal(Op)
        slot = Signal(range(max(2, S)))
        n = Signal(range(N + 1))                 # the slot's outputs so far
        row = Signal(range(S * K))               # the row written (START, ADD)
        cont = Signal()                          # the ADD goes into a partial
        keep = Signal()                          # the ADD has a place (n < N)
        kept = Signal(range(K + 1))              # MIX: values it sees
        base = Signal(range(S * K))              # MIX: the slot's row 0
        val_rows = Array(Cat(*r) for r in VAL)
        key_rows = Array(Cat(*r) for r in KEY)

        # ---- forming a value: the residual add, in place over WORK -----------------------------
        m.submodules.form = res = ResidualAdd(rb, rb, rb, d, clock_period_ns=cfg.hw.clock_period_ns,
                                              mult_bits=fm.mult_bits)
        m.d.comb += [res.a.eq(Cat(*WORK)), res.b.eq(Cat(*VIN)),
                     res.params.m_a.eq(Mux(cont, 1, 0)),
                     res.params.m_b.eq(Mux(op == Op.START, P.emb_m, 1)),
                     res.params.s.eq(Mux(op == Op.START, P.emb_s, 0))]
        issue = Signal(range(d + 1))
        formed = Signal(range(d + 1))
        with m.If(res.wr_en):
            m.d.sync += [Array(WORK)[res.wr_idx].eq(res.wr_y), formed.eq(formed + 1)]

        # ---- its key ------------------------------------------------------------------------
        m.submodules.norm = norm = Normalizer(fm, d, rb, derived_widths(cfg)["ss_rmsnorm"], [a],
                                              param_layout(cfg, "attn_res.key_norm", mixer="head"),
                                              clock_period_ns=cfg.hw.clock_period_ns)
        m.d.comb += [norm.norms[0].eq(P.key_norm), norm.mode.eq(0), norm.rd_x.eq(Array(WORK)[norm.rd_idx])]
        with m.If(norm.wr_en):
            m.d.sync += Array(KEYW)[norm.wr_idx].eq(norm.wr_y)

        # ---- the mix: query row, scores, softmax ---------------------------------------------
        mx = self._mix(m, Q, n, kept, base, val_rows, key_rows)
        q_req, q_beat, qbeats, resp = mx["q_req"], mx["q_beat"], mx["qbeats"], self.wport.resp
        sc_on, sc_i, sc_b, mixed = mx["sc_on"], mx["sc_i"], mx["sc_b"], mx["mixed"]

        # ---- control ------------------------------------------------------------------------
        cmd = self.i.payload
        n_now = Array(count)[cmd.slot] if S > 1 else count[0]
        add_tab = Array(Const(add_index(cfg, k), range(K + 1)) for k in range(N + 1))
        cont_tab = Array(Const(int(adds_to_partial(cfg, k)), 1) for k in range(N + 1))
        kept_tab = Array(Const(kept_count(cfg, k), range(K + 1)) for k in range(N + 1))
        slot_base = cmd.slot * K if S > 1 else 0
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [op.eq(cmd.op), slot.eq(cmd.slot), n.eq(n_now), base.eq(slot_base),
                                 kept.eq(kept_tab[n_now]), Cat(*VIN).eq(cmd.v),
                                 issue.eq(0), formed.eq(0), sc_i.eq(0), sc_b.eq(0), mixed.eq(0), q_beat.eq(0)]
                    with m.Switch(cmd.op):
                        with m.Case(Op.START):
                            m.d.sync += [row.eq(slot_base), cont.eq(0), keep.eq(1)]
                            m.next = "LOAD"
                        with m.Case(Op.ADD):
                            m.d.sync += [row.eq(slot_base + add_tab[n_now]), cont.eq(cont_tab[n_now]),
                                         keep.eq(n_now != N)]
                            m.next = "LOAD"
                        with m.Case(Op.MIX):
                            m.d.sync += q_req.eq(1)
                            m.next = "QUERY"
            with m.State("LOAD"):
                # the partial into WORK (read by the add as ``a``); the add registers its new
                # parameters this cycle
                m.d.sync += Cat(*WORK).eq(val_rows[row])
                m.next = "FORM"
            with m.State("FORM"):
                m.d.comb += [res.valid.eq(issue != d), res.idx.eq(issue)]
                with m.If(issue != d):
                    m.d.sync += issue.eq(issue + 1)
                with m.If(formed == d):
                    m.d.comb += norm.start.eq(1)
                    m.next = "KEY"
            with m.State("KEY"):
                with m.If(~norm.busy):
                    with m.If(keep):
                        for r in range(S * K):
                            with m.If(row == r):
                                m.d.sync += [Cat(*VAL[r]).eq(Cat(*WORK)), Cat(*KEY[r]).eq(Cat(*KEYW))]
                        for s in range(S):
                            with m.If(slot == s):
                                m.d.sync += count[s].eq(Mux(op == Op.START, 0, n + 1))
                    m.next = "IDLE"
            with m.State("QUERY"):
                m.d.comb += resp.ready.eq(1)
                with m.If(resp.valid & (q_beat == qbeats - 1)):
                    m.d.sync += sc_on.eq(1)
                    m.next = "SCORE"
            with m.State("SCORE"):
                with m.If(~sc_on & (mixed == kept)):
                    m.next = "IDLE"
        return m


    def _mix(self, m, Q, n, kept, base, val_rows, key_rows) -> dict:
        """The mix: the query row read on the weight port into ``Q``, the scores of the kept
        keys on the engine, the softmax over them with the kept values.  Returns the
        control's handles: the query request and beat count, the score cursor, the scores
        passed on."""
        cfg, fm, P = self.cfg, self.fm, self.params
        d, N, K, W = self.d, self.N, self.K, self.W
        rb, a = fm.resid_bits, fm.act_bits
        lanes = cfg.hw.lanes
        qreg = self.queries
        qbeats = qreg.row_beats
        q_addr = Array(Const(qreg.row_addr(k), 32) for k in range(N + 1))
        q_req = Signal()
        q_beat = Signal(range(qbeats + 1))
        m.d.comb += [self.wport.req.valid.eq(q_req), self.wport.req.payload.addr.eq(q_addr[n]),
                     self.wport.req.payload.beats.eq(qbeats)]
        with m.If(self.wport.req.valid & self.wport.req.ready):
            m.d.sync += q_req.eq(0)
        resp = self.wport.resp
        with m.If(resp.valid & resp.ready):
            m.d.sync += q_beat.eq(q_beat + 1)
            for b in range(qbeats):
                with m.If(q_beat == b):
                    m.d.sync += [Q[b * W + j].eq(resp.payload.data[8 * j:8 * j + 8].as_signed())
                                 for j in range(W) if b * W + j < d]

        fmt = MatVecFormats.from_config(cfg, out_widths=[fm.mla_u_bits])
        m.submodules.engine = eng = MatVecEngine(fmt)
        m.d.comb += self.mac_beat.eq(eng.beat)
        ebeats = -(-d // lanes)
        sc_on = Signal()
        sc_i = Signal(range(K + 1))
        sc_b = Signal(range(ebeats))
        key_now = Signal(d * a)
        m.d.comb += key_now.eq(key_rows[base + sc_i])
        key_groups = port_groups([key_now[e * a:(e + 1) * a].as_signed() for e in range(d)], lanes, a)
        p = eng.i.payload
        m.d.comb += [eng.i.valid.eq(sc_on), p.w.eq(Array(key_groups)[sc_b]),
                     p.x.eq(Array(port_groups(Q, lanes, a))[sc_b]),
                     p.first.eq(sc_b == 0), p.last.eq(sc_b == ebeats - 1),
                     p.mult.eq(P.u_m[n]), p.shift.eq(P.u_s[n])]
        with m.If(eng.i.valid & eng.i.ready):
            m.d.sync += sc_b.eq(sc_b + 1)
            with m.If(sc_b == ebeats - 1):
                m.d.sync += [sc_b.eq(0), sc_i.eq(sc_i + 1)]
                with m.If(sc_i == kept - 1):
                    m.d.sync += sc_on.eq(0)

        w = derived_widths(cfg)
        m.submodules.softmax = sm = OnlineSoftmax(d, u_bits=fm.mla_u_bits, value_bits=rb, out_bits=rb,
                                                  frac_bits=fm.mla_exp_frac, table=fm.mla_exp2_table,
                                                  sum_bits=w["attn_res_sum"], acc_bits=w["attn_res_acc"])
        # scores and values into the softmax through a register slice: the engine's FIFO read
        # and the value row's mux end there, not in the softmax's first stage
        m.submodules.softmax_slice = sk = SkidBuffer(sm.i.payload.shape())
        connect(m, sk.o, sm.i)
        connect(m, sm.o, wiring.flipped(self.o))
        mixed = Signal(range(K + 1))             # scores passed on
        m.d.comb += [sk.i.valid.eq(eng.o.valid), eng.o.ready.eq(sk.i.ready),
                     sk.i.payload.u.eq(eng.o.payload.y), sk.i.payload.c.eq(val_rows[base + mixed]),
                     sk.i.payload.last.eq(mixed == kept - 1)]
        with m.If(eng.o.valid & eng.o.ready):
            m.d.sync += mixed.eq(mixed + 1)
        return {"q_req": q_req, "q_beat": q_beat, "qbeats": qbeats, "sc_on": sc_on, "sc_i": sc_i, "sc_b": sc_b,
                "mixed": mixed}

def default_attnres(cfg) -> DepthUnit:
    """What `moekda rtl/synth --top attnres` builds: the config's depth unit."""
    require_attn_res(cfg)
    return DepthUnit(cfg)
