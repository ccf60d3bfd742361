"""LayerSimTop: the layer chip with its weight memory, the top the layer bench simulates.

Not part of the chip.  The chip is instantiated by module name (``chip_module``)
with the port names of hw/chip/layer.py LayerTop's flattened signature, so the same
top wraps the RTL generated from the model (module ``layer``), an RTL file,
or the gate-level netlist behind run/driver.py's vector-port wrapper
(``layer_gl``): one bench for all three.  The weight port is answered by
HdlWeightMemory (sim/hdl/weight_memory.py) filled with the layer's image;
the token streams and the Wishbone bus stay the bench's.  The memory has two
image slots and is written by the bench (``mem_wr_*``), so the sim top is the
same for every model: one simulator build per chip.

Ports: ``i``, ``o``, ``bus`` as the chip's; ``mem_*`` are the memory's stall
thresholds, seed, slot select, write port and counters (HdlWeightMemory).  A chip with
MLA layers has a cache port too (hw/mla/cache.py), answered by HdlCacheMemory with
``cache_rows`` positions per context, its controls and counters as ``cmem_*``.
"""
from __future__ import annotations

import re

from amaranth import ClockSignal, Instance, Module, ResetSignal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out, connect

from hw.chip.csr import WishboneSignature
from hw.chip.layer import LayerTop
from hw.image.format import image_layout
from sim.hdl.weight_memory import HdlCacheMemory, HdlWeightMemory, control_members


def chip_signature(cfg) -> wiring.Signature:
    """The chip's port signature (LayerTop's, or ModelTop's for a config with a vocabulary:
    no quantised model needed to know it)."""
    if cfg.model.is_layer_chip:
        chip = LayerTop(cfg)
    else:
        from hw.chip.model import ModelTop
        chip = ModelTop(cfg)
    chip._MustUse__silence = True       # built for its signature only, never elaborated
    return chip.signature


class LayerSimTop(wiring.Component):
    """The chip's streams and bus (and, on the model chip, its ``logits`` stream) as its own,
    the weight port answered by the memory."""

    def __init__(self, cfg, chip_module: str = "layer", max_outstanding: int = 8, cache_rows: int = 4096):
        self.cfg, self.chip_module = cfg, chip_module
        self.max_outstanding, self.cache_rows = max_outstanding, cache_rows
        self.members = control_members(cfg.hw.weight_port_bytes)
        chip = chip_signature(cfg).members
        self.cache = "cport" in chip
        self.streams = [n for n in chip if n not in ("wport", "cport", "bus")]
        mems = ("mem", "cmem") if self.cache else ("mem",)
        super().__init__({
            **{n: chip[n] for n in self.streams},
            "bus": In(WishboneSignature()),
            **{f"{mem}_{name}": member for mem in mems for name, member in self.members.items()},
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.mem = mem = HdlWeightMemory(image_layout(cfg).length, cfg.hw.weight_port_bytes,
                                                 cfg.hw.weight_port_latency, self.max_outstanding, slots=2)
        sig = chip_signature(cfg)
        chip = sig.create(path=("chip",))
        ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
        for path, member, value in sig.flatten(chip):
            name = "__".join(str(p) for p in path)
            ports[("i_" if member.flow == In else "o_") + name] = Value.cast(value)
        m.submodules.chip = Instance(self.chip_module, **ports)

        for n in self.streams:
            if chip.signature.members[n].flow == In:
                connect(m, wiring.flipped(getattr(self, n)), getattr(chip, n))
            else:
                connect(m, getattr(chip, n), wiring.flipped(getattr(self, n)))
        connect(m, wiring.flipped(self.bus), chip.bus)
        connect(m, chip.wport.req, mem.req)
        connect(m, mem.resp, chip.wport.resp)
        mems = [("mem", mem)]
        if self.cache:
            m.submodules.cmem = cmem = HdlCacheMemory(cfg, self.cache_rows, self.max_outstanding)
            connect(m, chip.cport.req, cmem.req)
            connect(m, cmem.resp, chip.cport.resp)
            connect(m, chip.cport.wr, cmem.wr_port)
            mems.append(("cmem", cmem))
        for prefix, memory in mems:      # the memories' controls and counters, as mem_* and cmem_*
            for name, member in self.members.items():
                outer, inner = getattr(self, f"{prefix}_{name}"), getattr(memory, name)
                m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
        return m


def sim_top_verilog(cfg, chip_module: str = "layer", name: str = "layer_sim") -> str:
    from amaranth.back import verilog
    return zero_init_loops(verilog.convert(LayerSimTop(cfg, chip_module), name=name, emit_src=False))


_INIT_BLOCK = re.compile(r"^  initial begin\n((?:    [\w$\\.]+ ?\[\d+\] = \d+'[dh][0-9a-f]+;\n)+)  end\n", re.M)
_INIT_WORD = re.compile(r"    ([\w$\\.]+ ?)\[(\d+)\] = \d+'([dh])([0-9a-f]+);")


def zero_init_loops(text: str) -> str:
    """Yosys writes a memory's initial contents one word per line, zeros too: the sim top's
    weight memory (written by the bench at run time, so all zeros) became 62k lines, which
    Verilator turned into 30 MB of start-up C++, half of model-small-sram's build.  A block
    that sets every word of one memory to zero becomes a loop (the same contents)."""
    def loop(match: re.Match) -> str:
        words = [_INIT_WORD.fullmatch(line) for line in match.group(1).splitlines()]
        names = {w.group(1) for w in words}
        if len(names) != 1 or any(int(w.group(4), 16) for w in words):
            return match.group(0)
        mem = names.pop().rstrip()
        if sorted(int(w.group(2)) for w in words) != list(range(len(words))):
            return match.group(0)
        i = "zero_init_" + re.sub(r"\W", "_", mem)
        return (f"  integer {i};\n  initial for ({i} = 0; {i} < {len(words)}; {i} = {i} + 1)\n"
                f"    {mem}[{i}] = 0;\n")
    return _INIT_BLOCK.sub(loop, text)
