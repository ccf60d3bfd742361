"""Where every build product lives: one place, so steps find each other's files.

    build/<config>/
      rtl/<top>.v                 generated Verilog (moekda rtl)
      synth/<top>.netlist.v       gate-level netlist (moekda synth)
      synth/<top>.sdc             constraints generated from the config
      reports/                    raw tool reports, metrics.json, report.md, plots
      logs/<step>.log             one log per step
      pnr/                        OpenROAD stages (moekda pnr)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moekda.config import REPO_ROOT, Config

BUILD_ROOT = REPO_ROOT / "build"


@dataclass(frozen=True)
class BuildPaths:
    root: Path
    top: str

    @classmethod
    def for_config(cls, cfg: Config, top: str = "layer", build_root: Path | None = None) -> "BuildPaths":
        return cls(root=(build_root or BUILD_ROOT) / cfg.name, top=top)

    @property
    def rtl_dir(self) -> Path: return self.root / "rtl"
    @property
    def rtl(self) -> Path: return self.rtl_dir / f"{self.top}.v"
    @property
    def synth_dir(self) -> Path: return self.root / "synth"
    @property
    def netlist(self) -> Path: return self.synth_dir / f"{self.top}.netlist.v"
    @property
    def sdc(self) -> Path: return self.synth_dir / f"{self.top}.sdc"
    @property
    def reports(self) -> Path: return self.root / "reports"
    @property
    def metrics(self) -> Path: return self.reports / "metrics.json"
    @property
    def logs(self) -> Path: return self.root / "logs"
    @property
    def pnr_dir(self) -> Path: return self.root / "pnr"

    def log(self, step: str) -> Path:
        return self.logs / f"{step}.log"

    def make_dirs(self) -> "BuildPaths":
        for d in (self.rtl_dir, self.synth_dir, self.reports, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        return self
