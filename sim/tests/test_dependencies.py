"""The house's one-way dependencies (issue 49): every import points down the floors of the
data path, and no modules import each other round a circle.

    floor 0  moekda (config, formats, numerics, tables: the ground floor), pdk (apart)
    floor 1  hw        the chip's generator, its cost model, its image format
    floor 2  model     float and integer models, quantiser, image builder
    floor 3  sim       benches and their helpers
    floor 4  run       the chip driver
    floor 5  flow      synthesis, place and route, power, DRC, metric rules
    floor 6  studies   bench, sweep, context: measurements on top of all of it
    floor 7  cli (the `moekda` command), train: imported by nothing

A lazy import inside a function is an arrow too.  Tests are outside the rule (a test may
use anything below or beside it)."""
import ast
from pathlib import Path

from moekda.config import REPO_ROOT

FLOORS = {"moekda": 0, "pdk": 0, "hw": 1, "model": 2, "sim": 3, "run": 4, "flow": 5, "studies": 6,
          "cli": 7, "train": 7}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _floor(module: str) -> str:
    """The top-level package a dotted module name belongs to."""
    return module.split(".")[0]


def _sources():
    for top in FLOORS:
        for p in (REPO_ROOT / top).rglob("*.py"):
            if "tests" not in p.parts:
                yield ".".join(p.relative_to(REPO_ROOT).with_suffix("").parts), p


def test_every_import_points_down():
    """No module imports one of a higher floor (the circle flow.bench -> sim.driver ->
    sim.cocotb_util -> flow.bench, the foundation's fingerprint reading pdk.kit's platform from
    above hw, the product pipeline living in sim/: each was an arrow up)."""
    up = {}
    for mod, p in _sources():
        me = FLOORS[_floor(mod)]
        found = sorted(m for m in _imports(p) if _floor(m) in FLOORS and FLOORS[_floor(m)] > me)
        if found:
            up[str(p.relative_to(REPO_ROOT))] = found
    assert up == {}, up


def test_nothing_imports_the_cli_or_the_training_extra():
    """The CLI is on top; train/ (JAX, an optional extra) sits on the models: the chip, the
    flow and the models run without it."""
    for mod, p in _sources():
        if _floor(mod) in ("cli", "train"):
            continue
        assert not {m for m in _imports(p) if _floor(m) in ("cli", "train")}, p


def test_the_floors_name_every_top_package():
    """A new top-level package must be given its floor here, or the rules above skip it."""
    tops = {p.parent.name for p in REPO_ROOT.glob("*/__init__.py")}
    assert tops <= set(FLOORS), tops - set(FLOORS)


def _module_graph() -> dict[str, set[str]]:
    """Every non-test module of the project -> the project modules it imports (at the top
    or inside a function: a lazy import is still an arrow of the structure)."""
    tops = tuple(FLOORS)
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
    circles studies.bench -> run.driver -> sim.cocotb_util -> studies.bench, hw.chip.layer <->
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


# hw's floors inside it: the chip (hw/chip/) assembles the blocks, and the tops and the cost
# model read the chip; nothing below imports it
ABOVE_THE_CHIP = {"hw.chip", "hw.tops", "hw.cost"}


def test_the_blocks_do_not_import_the_chip():
    """The blocks (KDA, MLA, MoE, AttnRes) and what they share (hw/arith, hw/stream: the
    weight port, the register slice, the residual add) sit below the chip: they import
    nothing from hw/chip (issue 49; they imported hw.chip.{weight_port,skid,residual})."""
    found = {}
    for mod, p in _sources():
        if _floor(mod) != "hw" or any(mod == a or mod.startswith(a + ".") for a in ABOVE_THE_CHIP):
            continue
        chip = sorted(m for m in _imports(p) if m == "hw.chip" or m.startswith("hw.chip."))
        if chip:
            found[str(p.relative_to(REPO_ROOT))] = chip
    assert found == {}, found


# issue 49 item 3: an elaborate longer than this is several components waiting to be named
MAX_ELABORATE_LINES = 150


def test_no_elaborate_is_longer_than_the_limit():
    long = []
    for mod, path in _sources():
        if _floor(mod) != "hw":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "elaborate":
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_ELABORATE_LINES:
                    long.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {lines} lines")
    assert not long, f"elaborate over {MAX_ELABORATE_LINES} lines (split it into named components): {long}"
