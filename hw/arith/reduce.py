"""Balanced reductions: a log-depth tree instead of a linear chain."""
from __future__ import annotations

from amaranth.hdl import Value


def or_tree(values) -> Value:
    """The OR of ``values``, pairwise in ceil(log2 n) levels (the AND-OR read trees of
    one-hot selected words, where at most one input is non-zero)."""
    level = list(values)
    if not level:
        raise ValueError("or_tree: no values")
    while len(level) > 1:
        level = [level[i] | level[i + 1] if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
    return level[0]
