"""The data path's one-way dependencies: hw/ never imports sim/ (the model is data for the
image, never an input to elaboration), and nothing imports the command-line layer."""
import ast
from pathlib import Path

from moekda.config import REPO_ROOT


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_hw_imports_no_sim():
    bad = {str(p.relative_to(REPO_ROOT)): sorted(m for m in _imports(p) if m == "sim" or m.startswith("sim."))
           for p in (REPO_ROOT / "hw").rglob("*.py")}
    assert not {k: v for k, v in bad.items() if v}, bad


def test_nothing_imports_the_cli():
    for top in ("hw", "sim", "flow", "pdk"):
        for p in (REPO_ROOT / top).rglob("*.py"):
            if "tests" in p.parts:
                continue
            assert "moekda.cli" not in _imports(p), p


def test_nothing_imports_the_training_extra():
    """train/ (JAX, an optional extra) sits on top of the models: the chip, the flow and the
    models run without it."""
    for top in ("moekda", "hw", "sim", "flow", "pdk"):
        for p in (REPO_ROOT / top).rglob("*.py"):
            assert not {m for m in _imports(p) if m == "train" or m.startswith("train.")}, p
