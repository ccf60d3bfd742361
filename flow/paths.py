"""Where every build product lives: one place, so steps find each other's files.

    build/<config>/
      rtl/<top>.v                 generated Verilog (moekda rtl)
      synth/<top>.netlist.v       gate-level netlist (moekda synth)
      synth/<top>.sdc             constraints generated from the config
      reports/                    raw tool reports, metrics.json, report.md, plots
                                  (of the chip top; another top, a block run, writes
                                  reports/<top>/ and logs/<top>/ so runs never mix)
      logs/<step>.log             one log per step
      pnr/                        OpenROAD stages (moekda pnr)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moekda.config import REPO_ROOT, Config

BUILD_ROOT = REPO_ROOT / "build"
# committed measurements (bench, sweeps, context sweeps, place-and-route records)
RESULTS_DIR = REPO_ROOT / "bench" / "results"
# the committed metric rules each bench record is checked against (flow/rules.py)
RULES_DIR = REPO_ROOT / "bench" / "rules"


@dataclass(frozen=True)
class BuildPaths:
    root: Path
    top: str
    block: bool = False   # a top other than the chip top: reports and logs in <top>/ sub-dirs

    @classmethod
    def for_config(cls, cfg: Config, top: str = "layer", build_root: Path | None = None,
                   block: bool = False) -> "BuildPaths":
        return cls(root=(build_root or BUILD_ROOT) / cfg.name, top=top, block=block)

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
    def reports(self) -> Path: return self.root / "reports" / (self.top if self.block else "")
    @property
    def metrics(self) -> Path: return self.reports / "metrics.json"
    @property
    def logs(self) -> Path: return self.root / "logs" / (self.top if self.block else "")

    # synthesis and STA inputs/outputs (flow/synth.py, flow/sta.py)
    @property
    def synth_script(self) -> Path: return self.synth_dir / f"{self.top}.synth.ys"
    @property
    def abc_constr(self) -> Path: return self.synth_dir / f"{self.top}.abc.constr"
    @property
    def abc_script(self) -> Path: return self.synth_dir / f"{self.top}.abc.script"
    @property
    def srst_map(self) -> Path: return self.synth_dir / "srst_enable_map.v"
    @property
    def sta_script(self) -> Path: return self.synth_dir / f"{self.top}.sta.tcl"
    @property
    def synth_stat(self) -> Path: return self.reports / "synth_stat.txt"
    @property
    def synth_stat_json(self) -> Path: return self.reports / "synth_stat.json"
    @property
    def synth_blocks_script(self) -> Path: return self.synth_dir / f"{self.top}.synth_blocks.ys"
    @property
    def synth_stat_blocks(self) -> Path: return self.reports / "synth_stat_blocks.txt"
    @property
    def synth_stat_blocks_json(self) -> Path: return self.reports / "synth_stat_blocks.json"
    @property
    def report_md(self) -> Path: return self.reports / "report.md"

    def report(self, name: str) -> Path:
        """A raw tool report or plot in the reports directory."""
        return self.reports / name

    def log(self, step: str) -> Path:
        return self.logs / f"{step}.log"

    def make_dirs(self) -> "BuildPaths":
        for d in (self.rtl_dir, self.synth_dir, self.reports, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        return self
