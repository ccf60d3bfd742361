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


def _imported_tops(top: str, banned: tuple[str, ...]) -> dict[str, list[str]]:
    """Modules of ``banned`` packages that the non-test files of ``top`` import."""
    bad = {}
    for p in (REPO_ROOT / top).rglob("*.py"):
        if "tests" in p.parts:
            continue
        found = sorted(m for m in _imports(p) if m.split(".")[0] in banned)
        if found:
            bad[str(p.relative_to(REPO_ROOT))] = found
    return bad


def test_hw_imports_neither_sim_nor_flow():
    """hw/ is below the simulation and the flow: the cost model (hw/cost.py) is the chip's
    own, read by the benches and the flow, never the other way round."""
    assert _imported_tops("hw", ("sim", "flow")) == {}


def test_sim_imports_no_flow():
    """The benches and the driver read the roofline from hw/cost.py; importing flow.bench
    closed the circle flow.bench -> sim.driver -> sim.cocotb_util -> flow.bench (issue 49)."""
    assert _imported_tops("sim", ("flow",)) == {}


def _module_graph() -> dict[str, set[str]]:
    """Every non-test module of the project -> the project modules it imports (at the top
    or inside a function: a lazy import is still an arrow of the structure)."""
    tops = ("moekda", "hw", "sim", "flow", "pdk", "train", "bench")
    files = {".".join(p.relative_to(REPO_ROOT).with_suffix("").parts): p
             for top in tops for p in (REPO_ROOT / top).rglob("*.py") if "tests" not in p.parts}
    files = {m.removesuffix(".__init__"): p for m, p in files.items()}
    graph = {}
    for mod, p in files.items():
        out = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & files.keys()
                out |= subs or ({node.module} & files.keys())
        graph[mod] = out - {mod}
    return graph


def test_no_import_circles():
    """No two modules import each other, directly or round a longer circle (issue 49: the
    circles flow.bench -> sim.driver -> sim.cocotb_util -> flow.bench, hw.chip.layer <->
    hw.chip.model and hw.image.format <-> hw.image.memory_map were taken apart)."""
    graph = _module_graph()
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, circles
