"""No silent clock (issue 49 item 5): a component of hw/ that takes the clock period takes it
without a default, so a caller that forgets the config's clock (hw.clock_period_ns) fails
instead of getting a pipeline planned for some other clock."""
from __future__ import annotations

import ast
from pathlib import Path

from moekda.config import REPO_ROOT

HW = REPO_ROOT / "hw"
# still with a default, and why; drop the entry with the default
PENDING: dict[str, str] = {}


def _defaulted_clocks(path: Path) -> list[str]:
    """``function:line`` of every parameter named ``*period_ns`` that has a default."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        positional = a.posonlyargs + a.args
        with_default = positional[len(positional) - len(a.defaults):]
        with_default += [p for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        out += [f"{node.name}:{node.lineno} {p.arg}" for p in with_default if p.arg.endswith("period_ns")]
    return out


def test_no_component_takes_the_clock_by_default():
    found = {str(p.relative_to(REPO_ROOT)): _defaulted_clocks(p) for p in sorted(HW.rglob("*.py"))}
    silent = {k: v for k, v in found.items() if v and k not in PENDING}
    assert not silent, f"a clock period with a default (pass cfg.hw.clock_period_ns instead): {silent}"
    done = [k for k in PENDING if not found.get(k)]
    assert not done, f"{done} take the clock without a default now: drop them from PENDING"
