"""Where a unit is in the matrices it streams: the beat of a row, the row of a matrix, the
matrix of a token.

A weight-port response beat is one engine beat (hw.lanes == hw.weight_port_bytes), so the
position of the beat in its row says the engine's ``first`` / ``last`` and which group of
the input vector goes with it (``input_group``), and the row says the result's tag.  The
KDA, MLA and MoE units each kept these counters of their own; they are one here.
"""
from __future__ import annotations

from amaranth.hdl import Array, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.proj.requests import RequestTable


class RowBeatCounter(wiring.Component):
    """(row, beat) inside one matrix of ``last_row + 1`` rows of ``last_beat + 1`` beats.

    ``step``: a beat is taken this cycle (the beat moves on; past the row's last beat the
    row does; past the matrix's last row both return to 0).  ``restart``: both to 0 (it wins
    over ``step``; the units never raise both).  The limits are the owner's (a matrix's
    constants or a mux of them) and may change only when ``phase_end``.  ``row_end`` /
    ``phase_end``: the current beat is its row's / matrix's last (not gated by ``step``)."""

    def __init__(self, max_rows: int, max_beats: int):
        self.max_rows, self.max_beats = max_rows, max_beats
        super().__init__({
            "step": In(1), "restart": In(1),
            "last_row": In(range(max_rows)), "last_beat": In(range(max_beats)),
            "row": Out(range(max_rows)), "beat": Out(range(max_beats)),
            "at_start": Out(1), "row_end": Out(1), "phase_end": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.at_start.eq((self.row == 0) & (self.beat == 0)),
                     self.row_end.eq(self.beat == self.last_beat),
                     self.phase_end.eq(self.row_end & (self.row == self.last_row))]
        with m.If(self.step):
            m.d.sync += self.beat.eq(self.beat + 1)
            with m.If(self.row_end):
                m.d.sync += [self.beat.eq(0), self.row.eq(self.row + 1)]
                with m.If(self.row == self.last_row):
                    m.d.sync += self.row.eq(0)
        with m.If(self.restart):
            m.d.sync += [self.row.eq(0), self.beat.eq(0)]
        return m


class ProjectionSequencer(wiring.Component):
    """A token's matrices in a fixed order, streamed from the weight port into the engine.

    ``shapes``: (rows, beats per row) of each matrix (an ``op``), in the order their weights
    arrive.  ``heads``: for an op whose rows come in per-head groups, the rows of a head
    (W_uk: r, W_uv: d_h of the MLA unit), else None: ``head`` counts the groups (the input
    vector is the head's).  ``ready``: the engine can stall (a result FIFO), so a beat also
    waits for ``eng_ready``.

    ``restart`` (at a token's acceptance): op 0, row 0, beat 0.  ``enable`` (the unit's phase
    control): beats may flow; a beat goes (``go``) when the port has one (``resp_valid``)
    and the engine takes it.  ``op`` passes the last op's index after its last row: the
    phase control reads ``op`` to know where the token is.  ``row_issued``: a row's last
    beat goes this cycle.

    ``requests``: (per layer the token's weight requests as (address, beats), how many the
    first group holds): the sequencer also issues them (hw/proj/requests.py, submodule
    ``requests``): ``restart`` starts the first group, ``more`` opens the rest, ``layer``
    picks the layer's addresses; ``req_*`` is the weight port's request (see
    ``connect_weight_port``)."""

    def __init__(self, shapes: list[tuple[int, int]], heads: list[int | None] | None = None,
                 ready: bool = False, requests: tuple[list, int] | None = None):
        self.shapes = shapes
        self.heads = heads if heads is not None and any(h is not None for h in heads) else None
        self.has_ready = ready
        self.n_heads = max((rows // h for (rows, _), h in zip(shapes, self.heads or []) if h), default=1)
        ports = {
            "restart": In(1), "enable": In(1), "resp_valid": In(1),
            "op": Out(range(len(shapes) + 1)),
            "row": Out(range(max(rows for rows, _ in shapes))),
            "beat": Out(range(max(beats for _, beats in shapes))),
            "head": Out(range(max(2, self.n_heads))),
            "at_start": Out(1), "first": Out(1), "last": Out(1),
            "go": Out(1), "resp_ready": Out(1), "row_issued": Out(1),
        }
        if ready:
            ports["eng_ready"] = In(1)
        self.requests = requests
        if requests is not None:
            self.table = RequestTable(*requests)
            ports.update({"more": In(1), "layer": In(self.table.layer.shape()), "req_valid": Out(1),
                          "req_ready": In(1), "req_addr": Out(len(self.table.addr)),
                          "req_beats": Out(len(self.table.beats))})
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        shapes = self.shapes
        m.submodules.rows = rb = RowBeatCounter(max(r for r, _ in shapes), max(b for _, b in shapes))
        ready = self.eng_ready if self.has_ready else Const(1)
        m.d.comb += [
            rb.last_row.eq(Array(Const(rows - 1) for rows, _ in shapes)[self.op]),
            rb.last_beat.eq(Array(Const(beats - 1) for _, beats in shapes)[self.op]),
            self.row.eq(rb.row), self.beat.eq(rb.beat), self.at_start.eq(rb.at_start),
            self.first.eq(rb.beat == 0), self.last.eq(rb.row_end),
            self.resp_ready.eq(self.enable & ready) if self.has_ready else self.resp_ready.eq(self.enable),
            self.go.eq(self.enable & self.resp_valid & ready),
            self.row_issued.eq(self.go & rb.row_end),
            rb.step.eq(self.go), rb.restart.eq(self.restart),
        ]
        with m.If(self.go & rb.phase_end):
            m.d.sync += self.op.eq(self.op + 1)
        if self.heads is not None:
            # the row within its head, and the head: W_uk's r rows a head read q_h, ...
            per_head = [h if h else rows for (rows, _), h in zip(shapes, self.heads)]
            sub = Signal(range(max(per_head)), name="sub")
            with m.If(self.go & rb.row_end):
                m.d.sync += sub.eq(sub + 1)
                with m.If(sub == Array(Const(n - 1) for n in per_head)[self.op]):
                    m.d.sync += [sub.eq(0), self.head.eq(self.head + 1)]
                with m.If(rb.phase_end):
                    m.d.sync += [sub.eq(0), self.head.eq(0)]
            with m.If(self.restart):
                m.d.sync += [sub.eq(0), self.head.eq(0)]
        with m.If(self.restart):
            m.d.sync += self.op.eq(0)
        if self.requests is not None:
            m.submodules.requests = rt = self.table
            m.d.comb += [rt.start.eq(self.restart), rt.more.eq(self.more), rt.layer.eq(self.layer),
                         self.req_valid.eq(rt.valid), rt.ready.eq(self.req_ready),
                         self.req_addr.eq(rt.addr), self.req_beats.eq(rt.beats)]
        return m


def connect_weight_port(m: Module, seq: ProjectionSequencer, wport) -> None:
    """``seq``'s requests and beats on a unit's weight port (hw/chip/weight_port.py's
    signature, by its members' names: ``req`` with ``addr`` and ``beats``, ``resp``)."""
    m.d.comb += [wport.req.valid.eq(seq.req_valid), seq.req_ready.eq(wport.req.ready),
                 wport.req.payload.addr.eq(seq.req_addr), wport.req.payload.beats.eq(seq.req_beats),
                 seq.resp_valid.eq(wport.resp.valid), wport.resp.ready.eq(seq.resp_ready)]


def input_group(m: Module, sources: list[list[list]], op, head, beat, name: str = "x_group"):
    """The engine's ``x`` for this beat: ``sources[op][head][beat]``, each a port group
    (hw/arith/matvec.py ``port_groups``) of the op's input vector; an op with one input
    vector has one head.  A Signal (comb)."""
    from amaranth.hdl import Value
    width = max(len(Value.cast(g)) for groups in sources for per_head in groups for g in per_head)
    x = Signal(width, name=name)
    with m.Switch(op):
        for n, groups in enumerate(sources):
            with m.Case(n):
                h = head if len(groups) > 1 else 0
                m.d.comb += x.eq(Array(Array(g) for g in groups)[h][beat])
    return x
