"""What the KDA and MLA units do with their engine's rows after the engine: count the rows
still on their way (``PendingRows``), read a table by a row's code (``TableStage``) and
multiply a vector by its gate (``GatedProduct``)."""
from __future__ import annotations

from amaranth.hdl import Array, Const, Module, Shape, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.booth_multiply import booth_multiply
from hw.arith.lut import LookupTable, drive_constant
from hw.arith.pipeline import Pipe, PipelinePlan


class PendingRows(wiring.Component):
    """Rows issued to the engine (``issued``: a row's last beat went) and not yet in their
    register (``stored``: one strobe per destination, each a row reaching it).  ``drained``:
    none on the way, the phase control's license to start a matrix that reads an earlier
    one's rows (KDA: f_up reads fd; MLA: W_uk reads q).  The strobes are registered before
    they are counted (their own logic plus the count did not fit 1 ns): a store leaves the
    count a cycle late, which only holds ``drained`` back a cycle, never lets it through
    early.  ``most``: the most rows ever on the way (sizes the count)."""

    def __init__(self, strobes: int, most: int):
        self.most = most
        super().__init__({"issued": In(1), "stored": In(strobes), "drained": Out(1)})

    def elaborate(self, platform):
        m = Module()
        n = len(self.stored)
        stored_r = Signal(n, name="stored_r")
        pending = Signal(range(self.most + 1), name="pending")
        m.d.sync += [stored_r.eq(self.stored),
                     pending.eq(pending + self.issued - sum(stored_r[i].as_unsigned() for i in range(n)))]
        m.d.comb += self.drained.eq(pending == 0)      # (rows issued this cycle are not in it yet)
        return m


class GatedProduct(wiring.Component):
    """``z = rs(y * gates[idx], unit_frac)``, one element a cycle over clock-derived stages:
    the KDA's o-norm output times its gate (into zo), the MLA's W_uv rows times theirs.

    The gate read is an index mux with a level for the index's fan-out to every gate bit's
    mux, then a stage of its own: the index's decode and fan-out and the mux tree with the
    product's first Booth words behind them were 0.038 ns longer than model-tiny's 1.25 ns
    in one stage.  The stage adds one cycle of latency, not one per element, and is
    unconditional (a slow clock pays it too).  The rounding constant is a word of the
    product's tree.  ``count``: ``empty`` says no element is inside (the KDA's o norm waits
    for it before the next head)."""

    def __init__(self, n: int, y_shape, gate_shape, idx_shape, unit_frac: int, plan: PipelinePlan,
                 count: bool = False):
        self.n, self.unit_frac, self.plan, self.count = n, unit_frac, plan, count
        self.y_shape, self.gate_shape = Shape.cast(y_shape), Shape.cast(gate_shape)
        self.g_width = self.y_shape.width + self.gate_shape.width + 2
        ports = {"valid": In(1), "idx": In(idx_shape), "y": In(y_shape),
                 "gates": In(data.ArrayLayout(gate_shape, n)),
                 "o_valid": Out(1), "o_idx": Out(idx_shape), "z": Out(unsigned(self.g_width - unit_frac))}
        if count:
            ports["empty"] = Out(1)
        super().__init__(ports)
        # the stage count, for an owner that sizes a count of rows on their way by it: the
        # same pipeline built once on stand-ins and dropped
        dry = Module()
        _, self.stages = self._pipeline(dry, Signal(), Signal(idx_shape), Signal(y_shape),
                                        [Signal(gate_shape) for _ in range(n)])
        dry._MustUse__silence = True

    def _pipeline(self, m, valid, idx, y, gates):
        plan = self.plan
        gp = Pipe(m, plan, "gate")
        live = {"valid": valid, "idx": idx, "y": y}
        live = gp.spend(plan.delays.mux_level * (max(1, (self.n - 1).bit_length()) + 1), live)
        g_val = Signal(self.gate_shape, name="gate_val")
        m.d.comb += g_val.eq(Array(gates)[live["idx"]])
        live["g"] = g_val
        live = gp.register(live)
        g_val = live.pop("g")
        g_rnd = Const((1 << (self.unit_frac - 1)) if self.unit_frac else 0, self.g_width)
        live = gp.register(booth_multiply(gp, live, live.pop("y"), g_val, self.g_width, "z", extra_words=[g_rnd]))
        return live, gp.stages

    def elaborate(self, platform):
        m = Module()
        live, stages = self._pipeline(m, self.valid, self.idx, self.y, [self.gates[i] for i in range(self.n)])
        m.d.comb += [self.o_valid.eq(live["valid"]), self.o_idx.eq(live["idx"]),
                     self.z.eq(live["z"][self.unit_frac:])]
        if self.count:
            inside = Signal(range(stages + 2), name="gate_pending")
            m.d.sync += inside.eq(inside + self.valid - live["valid"])
            m.d.comb += self.empty.eq(inside == 0)
        return m


class TableStage(wiring.Component):
    """A requantised row's code through one of the config's tables (moekda/tables.py): one
    cycle, the table read a 2**in_bits : 1 mux of constants.  ``valid`` / ``row`` / ``addr``
    in; ``o_valid`` / ``o_row`` / ``data`` a cycle later (the owner stores ``data`` by row).
    The table is the submodule ``lut``."""

    def __init__(self, in_bits: int, shape, table, row_shape):
        self.in_bits, self.shape, self.table = in_bits, shape, table
        super().__init__({"valid": In(1), "row": In(row_shape), "addr": In(in_bits),
                          "o_valid": Out(1), "o_row": Out(row_shape), "data": Out(shape)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.lut = lut = LookupTable(self.in_bits, self.shape)
        drive_constant(m, lut, self.table)
        m.d.comb += [lut.addr.eq(self.addr), lut.en.eq(self.valid), self.data.eq(lut.data)]
        m.d.sync += [self.o_valid.eq(self.valid), self.o_row.eq(self.row)]
        return m
