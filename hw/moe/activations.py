"""The MoE unit's first result stages: the engine's row -> its consumer's code -> tables.

The engine saturates every row to the widest consumer's width (16-bit expert output);
stage S clamps the narrower ones (table code, int8 up) from that value (sat_a(sat_b(x)) ==
sat_a(x) for a <= b) and registers it with its tag (matrix, row, segment).  Stage C:
router codes read the score table, gate codes the SiLU (c * sigmoid, hw/arith/silu.py, a few
stages) or with SiTU-GLU the SITU table, into ``sbuf``; with SiTU-GLU every row for the
products passes the up cap's pipeline (hw/arith/situ.py).  Stage T: the router's choice key
(score + selection bias) to the top-k, a LatentMoE's lat_down rows into ``z``.  The rows
for the products leave on ``q_*`` in their order.  Nothing stalls.
"""
from __future__ import annotations

from amaranth.hdl import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.lut import LookupTable, drive_constant
from hw.arith.matvec import saturate
from hw.arith.pipeline import Pipe
from hw.arith.silu import silu
from hw.arith.situ import up_cap
from hw.moe.phases import GATE, LDOWN, ROUTER, UP, param_ports, per_bank, register
from moekda.config import ConfigError
from moekda.tables import fixed_table, situ_in_bits, situ_table


class MoEActivations(wiring.Component):
    """``valid`` / ``tag`` / ``y``: the engine's result.  ``key_*``: a router row's choice
    key and score for the top-k.  ``sbuf``: a gate row's SiLU value per hidden unit.  ``z`` /
    ``z_ok`` (LatentMoE): lat_down(hn), complete (cleared at ``start``).  ``q_*``: every row
    for the products (up, down, lat_up), in order."""

    def __init__(self, unit, key_bits: int):
        self.u = u = unit
        eo = u.engine.o.payload
        self.score_bits = u.score_shape.width
        ports = {"start": In(1), "valid": In(1), "tag": In(eo.tag.shape()), "y": In(eo.y.shape()),
                 **u.kind.port(), **param_ports(u),
                 "key_valid": Out(1), "key": Out(signed(key_bits)), "key_tag": Out(unsigned(self.score_bits)),
                 "sbuf": Out(data.ArrayLayout(u.silu_shape, u.f)),
                 "q_valid": Out(1), "q_kind": Out(u.mat_bits), "q_row": Out(eo.tag.row.shape()),
                 "q_seg": Out(eo.tag.seg.shape()), "q_y": Out(eo.y.shape())}
        if u.lat:
            ports.update({"z": Out(data.ArrayLayout(signed(8), u.lat)), "z_ok": Out(1)})
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        u, fm, plan = self.u, self.u.fm, self.u.plan
        E, f, nb_d, lat, mat_bits = u.E, u.f, u.nb_d, u.lat, u.mat_bits
        prm, dprm = self.params, (self.dense_params if u.has_dense else None)
        tag, sbuf = self.tag, self.sbuf
        # stage S: the result clamped to the width of its consumer, registered with its tag
        y_kind = Signal(self.y.shape(), name="y_kind")
        with m.Switch(tag.kind):
            for kind, bits in u.kind_bits.items():
                with m.Case(kind):
                    m.d.comb += y_kind.eq(saturate(self.y, bits) if bits < len(self.y) else self.y)
        c_valid = register(m, "c_valid", 1, self.valid, reset_less=False)
        c_kind = register(m, "c_kind", mat_bits, tag.kind)
        c_row_r = register(m, "c_row_r", tag.row.shape(), tag.row)
        c_seg_r = register(m, "c_seg_r", tag.seg.shape(), tag.seg)
        c_y = register(m, "c_y", self.y.shape(), y_kind)

        # stage C: tables addressed by the requantised code (the score table the config's)
        m.submodules.score_lut = score_lut = LookupTable(fm.lut_in_bits, u.score_shape)
        drive_constant(m, score_lut, fixed_table(u.cfg, "moe.score"))
        m.d.comb += [score_lut.addr.eq(c_y), score_lut.en.eq(c_valid & (c_kind == ROUTER))]
        if u.situ:
            # SiTU-GLU: the gate code (SITU's fixed input format, clamped at stage S) reads the
            # config's SITU table (ROM logic, one cycle like the score table): int8 at the fixed
            # scale, into sbuf at stage T
            c_bank = register(m, "c_bank", tag.bank.shape(), tag.bank)
            m.submodules.situ_lut = situ_lut = LookupTable(situ_in_bits(fm), signed(fm.act_bits))
            drive_constant(m, situ_lut, situ_table(fm))
            m.d.comb += [situ_lut.addr.eq(c_y[:situ_in_bits(fm)].as_signed()),
                         situ_lut.en.eq(c_valid & (c_kind == GATE))]
        else:
            # gate codes: SiLU = c * sigmoid over a few stages into sbuf, with the MoE layer's
            # (t_m, t_s, m, s) or, by the token's kind, a dense layer's
            if u.kind.mixed:
                silu_ops, silu_op = [prm.silu, dprm.silu], self.dense
            else:
                silu_ops, silu_op = [(dprm if u.has_dense else prm).silu], Const(0, 1)
            sp = Pipe(m, plan, "silu")
            s_live = silu(sp, {"valid": c_valid & (c_kind == GATE), "row": c_row_r,
                               "code": c_y[:fm.lut_in_bits].as_signed(), "op": silu_op}, "code", "op",
                          [(p.t_m, p.t_s, p.m, p.s) for p in silu_ops], u.silu_shape.width, fm)
            s_live = sp.register(s_live)
            # the up row j reads sbuf[j] at stage T: it comes f rows of nb_d beats after gate row j
            if f * nb_d <= sp.stages:
                raise ConfigError(f"model.d_ff = {f}: the SiLU pipeline ({sp.stages} stages) is longer than "
                                  f"the {f * nb_d} cycles between a gate row and its up row")
            for j in range(f):
                with m.If(s_live["valid"] & (s_live["row"] == j)):
                    m.d.sync += sbuf[j].eq(s_live["silu"])

        # SiTU-GLU: every row for stage O (up, down, lat_up) passes the up cap's pipeline (the
        # up rows' 25 tanh(u/25) = c * CAP[t], with their bank's (t_m, t_s)), the others
        # alongside it, so stage O sees the rows in their order, a few cycles later
        if u.situ:
            cp = Pipe(m, plan, "cap")
            c_live = {"valid": c_valid, "kind": c_kind, "row": c_row_r, "seg": c_seg_r, "y": c_y, "bank": c_bank,
                      "code": c_y[:fm.act_bits].as_signed()}
            cap_params = list(zip(per_bank(u, prm, dprm, "cap_t_m"), per_bank(u, prm, dprm, "cap_t_s")))
            c_live = up_cap(cp, c_live, "code", "bank", cap_params, fm)
            c_live = cp.spend(plan.delays.mux_level, c_live)
            capped = Signal(c_y.shape(), name="cap_y")
            m.d.comb += capped.eq(Mux(c_live["kind"] == UP, c_live.pop("cap"), c_live["y"]))
            c_live = cp.register({**c_live, "y": capped})
            q = [c_live[n] for n in ("valid", "kind", "row", "seg", "y")]
            # an up row reads sbuf[j] when it leaves the cap's pipeline; the next expert's gate row j
            # (its rows follow this expert's up rows) writes it f rows of nb_d beats after it entered
            if f * nb_d <= cp.stages + 1:
                raise ConfigError(f"model.d_ff = {f}: the up cap's pipeline ({cp.stages} stages) is longer than "
                                  f"the {f * nb_d} cycles between an up row and the next expert's gate row")

        t_valid = register(m, "t_valid", 1, c_valid, reset_less=False)
        t_kind = register(m, "t_kind", mat_bits, c_kind)
        t_row = register(m, "t_row", c_row_r.shape(), c_row_r)
        t_seg = register(m, "t_seg", c_seg_r.shape(), c_seg_r)
        t_y = register(m, "t_y", c_y.shape(), c_y)
        if u.situ:
            # SITU's output: the gate row's act into sbuf
            with m.If(t_valid & (t_kind == GATE)):
                for j in range(f):
                    with m.If(t_row == j):
                        m.d.sync += sbuf[j].eq(situ_lut.data)
        else:
            q = [t_valid, t_kind, t_row, t_seg, t_y]
        m.d.comb += [port.eq(v) for port, v in zip((self.q_valid, self.q_kind, self.q_row, self.q_seg, self.q_y), q)]
        # the selection bias of this router row, looked up while the table reads
        bias = Array(prm.bias[e] for e in range(E))
        t_bias = register(m, "t_bias", signed(len(self.key)), bias[c_row_r[:max(1, (E - 1).bit_length())]])
        # stage T: table outputs valid; the router's choice key registered before the top-k
        m.d.comb += [self.key_valid.eq(register(m, "k_valid", 1, t_valid & (t_kind == ROUTER), reset_less=False)),
                     self.key.eq(register(m, "k_key", signed(len(self.key)), score_lut.data + t_bias)),
                     self.key_tag.eq(register(m, "k_tag", unsigned(self.score_bits), score_lut.data))]
        if lat:
            # lat_down's rows: z, int8 (clamped at stage S)
            with m.If(self.start):
                m.d.sync += self.z_ok.eq(0)
            with m.If(t_valid & (t_kind == LDOWN)):
                for j in range(lat):
                    with m.If(t_row == j):
                        m.d.sync += self.z[j].eq(t_y[:8])
                with m.If(t_row == lat - 1):
                    m.d.sync += self.z_ok.eq(1)
        return m
