"""`moekda rtl`: write the Verilog of a synthesisable top (hw/tops.py).

    moekda rtl -c tiny --top matvec      -> build/tiny/rtl/matvec.v

One Verilog module per Amaranth module, so the synthesis reports can give
area per block.  The file is rewritten only when its text changes, so make
and the synthesis step see a stable timestamp.
"""
from __future__ import annotations

from pathlib import Path

from cli import UserError
from moekda.config import load_config, require_chip_formats


def configure(p):
    from hw.tops import TOPS
    p.add_argument("--top", default="matvec", choices=sorted(TOPS),
                   help="which top to generate (default: matvec)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="output file (default: build/<config>/rtl/<top>.v)")


def run(args) -> int:
    from flow.paths import BuildPaths
    from hw.tops import top_verilog
    cfg = load_config(args.config)
    require_chip_formats(cfg)       # MXFP4 / MXFP8: numpy models only (issue 48)
    out = args.output or BuildPaths.for_config(cfg, top=args.top).rtl
    try:
        text = top_verilog(args.top, cfg)
    except ValueError as e:   # e.g. a clock the library cannot reach
        raise UserError(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    modules = sum(1 for line in text.splitlines() if line.startswith("module "))
    print(f"{out}: top {args.top}, {modules} modules, config {cfg.name} ({cfg.hash()})")
    return 0
