"""Synthesisable tops by name: what `moekda rtl`, the synthesis flow and the
cocotb benches build.  A factory takes a Config and returns the elaboratable
and its port list (amaranth.back.verilog wants them explicitly).

One entry per top, nothing else.  ``layer`` is the chip of the config: the layer
chip (hw/chip/layer.py), or the model chip (hw/chip/model.py) for a config with a
vocabulary.
"""
from __future__ import annotations

from typing import Callable

from amaranth.hdl import Value
from amaranth.lib import wiring



def flat_ports(component: wiring.Component):
    """The component's port signals, as amaranth.back.verilog wants them."""
    for _path, _member, value in component.signature.flatten(component):
        yield Value.cast(value)   # a View (struct payload) stands for its signal


def _matvec(cfg):
    from hw.arith.matvec import MatVecEngine
    engine = MatVecEngine(cfg)
    return engine, list(flat_ports(engine))


def _moe(cfg):
    from amaranth.hdl import Value
    from hw.moe.unit import MoEUnit
    unit = MoEUnit(cfg)   # model-free: the per-model values come in on ``params``
    # stream payloads are data.Views: their underlying signals are the ports
    return unit, [Value.cast(v) for v in flat_ports(unit)]


def _kda(cfg):
    from amaranth.hdl import Value
    from hw.kda.unit import default_kda
    unit = default_kda(cfg)
    return unit, [Value.cast(v) for v in flat_ports(unit)]


def layer_for_config(cfg):
    """The chip for ``cfg``: one netlist for every model (the model is the image it LOADs):
    the layer chip (hw/chip/layer.py), or the model chip (hw/chip/model.py) for a config
    with a vocabulary."""
    if cfg.model.is_layer_chip:
        from hw.chip.layer import LayerTop
        return LayerTop(cfg)
    from hw.chip.model import ModelTop
    return ModelTop(cfg)


def _layer(cfg):
    chip = layer_for_config(cfg)
    return chip, [Value.cast(v) for v in flat_ports(chip)]


def _embed(cfg):
    from hw.chip.embed import Embedding
    block = Embedding(cfg)      # ConfigError (one line) for a config without a vocabulary
    return block, [Value.cast(v) for v in flat_ports(block)]


def _mla_softmax(cfg):
    from hw.mla.softmax import mla_softmax
    unit = mla_softmax(cfg)     # ConfigError (one line) for a config without an MLA layer
    return unit, [Value.cast(v) for v in flat_ports(unit)]


def _mla(cfg):
    from hw.mla.unit import default_mla
    unit = default_mla(cfg)     # ConfigError (one line) for a config without an MLA layer
    return unit, [Value.cast(v) for v in flat_ports(unit)]


def _attnres(cfg):
    from hw.attnres.unit import default_attnres
    unit = default_attnres(cfg)   # ConfigError (one line) for a config without Attention Residuals
    return unit, [Value.cast(v) for v in flat_ports(unit)]


def _head(cfg):
    from hw.chip.head import Head
    block = Head(cfg)           # ConfigError (one line) for a config without a vocabulary
    return block, [Value.cast(v) for v in flat_ports(block)]


TOPS: dict[str, Callable] = {
    "matvec": _matvec,
    "moe": _moe,
    "kda": _kda,
    "layer": _layer,    # the chip top, layer or model chip (flow/rtl.py picks "layer" first)
    "embed": _embed,    # the model chip's ends (configs with model.vocab > 0)
    "head": _head,
    "mla_softmax": _mla_softmax,   # a block of the hybrid's MLA layer (issue 15), before its chip
    "mla": _mla,                   # the hybrid's MLA token mixer (issue 15), before its chip
    "attnres": _attnres,           # the hybrid's Attention Residuals depth unit (issue 15), before its chip
}

# the hybrid's blocks alone: built for any config with an "mla" layer (or AttnRes), also one
# the chip refuses (AttnRes), so each can be synthesised on its own
LATER_KIND_BLOCKS = {"mla_softmax", "mla", "attnres"}


def build_top(name: str, cfg):
    """(elaboratable, ports) for top ``name``; KeyError names the known tops."""
    if name not in TOPS:
        raise KeyError(f"unknown top {name!r} (known: {', '.join(TOPS)})")
    from moekda.config import require_chip_model
    if name not in LATER_KIND_BLOCKS:
        require_chip_model(cfg)
    return TOPS[name](cfg)


def top_verilog(name: str, cfg) -> str:
    """Verilog text of top ``name``: one module per Amaranth module (hierarchy kept).
    SRAM macros (hw.state_memory = "sram") are instances of the macro cells, with each
    macro's behavioural model appended as a module of its name (hw/mem/fakeram.py): the
    one file simulates as it is, and synthesis replaces those modules by the black boxes
    of the macros' Liberty files (flow/synth.py)."""
    from hw.mem.fakeram import convert_with_macros
    elaboratable, ports = build_top(name, cfg)
    return convert_with_macros(elaboratable, name, ports)


def write_verilog(cfg, name: str, path) -> None:
    """Write top ``name``'s Verilog to ``path`` (the hook flow/rtl.py looks for)."""
    from pathlib import Path
    text = top_verilog(name, cfg)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
