"""The flow's view of hw.tops (owned by the hardware side): which tops exist,
which one is the chip, and the Verilog of one for a config.

hw.tops maps a top's name to a factory ``factory(cfg) -> (elaboratable,
ports)``.  The chip top is ``hw.tops.DEFAULT_TOP`` when it says so, else
"layer" once registered, else "matvec" (the first block, today's chip).
The Verilog is written the way ``moekda rtl`` writes it: through hw.tops's
own writer when it offers one, so both commands give the same file.
"""
from __future__ import annotations

from pathlib import Path

from moekda.errors import UserError
from moekda.config import Config

CHIP_TOP_PREFERENCE = ("layer", "matvec")


def _tops():
    try:
        from hw import tops
    except ImportError as e:
        raise UserError(f"hw.tops is not available ({e}); give --verilog FILE --top NAME") from None
    return tops


def registry() -> dict:
    tops = _tops()
    for name in ("TOPS", "REGISTRY", "tops", "registry"):
        reg = getattr(tops, name, None)
        if isinstance(reg, dict):
            return reg
    raise UserError("hw.tops has no registry of tops (expected a dict TOPS)")


def chip_top() -> str | None:
    """The chip top, or None while hw.tops does not exist."""
    try:
        tops = _tops()
    except UserError:
        return None
    explicit = getattr(tops, "DEFAULT_TOP", None)
    if explicit:
        return explicit
    reg = registry()
    return next((t for t in CHIP_TOP_PREFERENCE if t in reg), None)


def describe_verilog(path: Path) -> str:
    """One line for the rtl log: size and modules (a huge file means a slow synthesis)."""
    text = path.read_text()
    modules = sum(1 for line in text.splitlines() if line.startswith("module "))
    return (f"{path}: {len(text) / 1e6:.2f} MB, {text.count(chr(10))} lines, {modules} modules, "
            f"{text.count('assign ')} assigns")


def write_rtl(cfg: Config, top: str, path: Path, log: Path | None = None) -> Path:
    tops = _tops()
    reg = registry()
    if top not in reg:
        raise UserError(f"--top {top}: unknown top (known: {', '.join(sorted(reg))})")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = getattr(tops, "write_verilog", None)
    if callable(writer):
        writer(cfg, top, path)
    else:
        from amaranth.back import verilog
        elaboratable, ports = reg[top](cfg)
        path.write_text(verilog.convert(elaboratable, name=top, ports=ports))
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"# top {top}, config {cfg.name} ({cfg.hash()})\n{describe_verilog(path)}\n")
    return path
