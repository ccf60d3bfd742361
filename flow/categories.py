"""Area by functional category (issue 7): the one table that maps the chip's
instance hierarchy onto the categories the area report is asked for.

A category owns instance paths (``kda/engine``, ``norm/rsqrt``; ``(top)`` is
the top module's own logic) by pattern: one ``/``-separated segment per
level, shell wildcards inside a segment, and a final ``**`` for "this
instance and everything below it".  Each instance's OWN cells (not its
children's) go to the first category whose pattern matches, so a block is
never counted twice.  An instance no pattern matches goes to ``unmapped``,
which the report and metrics.json always show (never silently dropped), and
flow/tests/test_categories.py fails when the elaborated layer has one: a
renamed block breaks the test, not the report.

KDA state is the named submodule ``kda/delta/mem`` (hw/kda/state.py,
StateMemory: the state registers, their write decode and registered one-hot read select);
the rest of the delta rule (its arithmetic) is KDA datapath.
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from flow.synth import SynthStats

TOP = "(top)"
UNMAPPED = "unmapped"
# the layer datapath (hw/chip/datapath.py) is one level of both chips' hierarchy; the
# patterns name what is inside it (``kda/...`` is ``datapath/kda/...``), its own logic
# (the stage FSMs and token buffers) is ``datapath``
DATAPATH = "datapath"
MACROS = "macros"


@dataclass(frozen=True)
class Category:
    key: str             # the metrics.json qualifier: ...__category:<key>
    title: str
    patterns: tuple[str, ...]


CATEGORIES: tuple[Category, ...] = (
    Category("engine", "matrix-vector engine",
             ("kda/engine/**",            # the KDA's projections (hw/arith/matvec.py)
              "moe/engine*/**")),         # router, gate, up, down on the MoE's engine
    Category("kda_state", "KDA state",
             ("kda/delta/mem/**",)),
    Category("norms", "norms (RMSNorm, q/k/o norms, rsqrt)",
             ("norm/**", "kda/norm/**",
              "rsqrt/**",                  # the layer's rsqrt, shared with the KDA's norm (hw/arith/rsqrt.py)
              "norm1/**", "norm2/**")),   # the layer's two RMSNorms before they were shared (1448559): older netlists
    Category("kda_datapath", "KDA datapath",
             ("kda", "kda/delta/**", "kda/lut_*/**",
              "kda/qkv/**",                # short convolution, requantisation, SiLU (hw/kda/rows.py)
              "kda/seq/**", "kda/rq/**", "kda/pending/**", "kda/gate/**", "kda/phases/**")),
    Category("router_topk", "router and top-k",
             ("moe/route/**", "moe/topk/**", "moe/activations/score_lut/**")),
    Category("experts", "experts' datapath (MoE control, SiLU or SiTU-GLU, combine)",
             ("moe", "moe/requests/**", "moe/feeder/**",      # hw/moe/*.py, one instance a part
              "moe/activations", "moe/activations/silu_sigmoid/**",
              "moe/activations/situ_lut/**", "moe/activations/cap_cap/**",   # SiTU-GLU: SITU and CAP ROMs
              "moe/sums/**", "moe/hidden/**", "moe/combine")),
    Category("residual", "token buffers and residual adds (top)",
             (TOP, DATAPATH, "res1/**", "res2/**")),
    Category("control", "control (weight arbiter, port slices, CSRs)",
             ("arbiter/**", "req_slice/**", "resp_slice/**", "csr/**")),
    Category("params", "parameter bank and LOAD (hw/chip/loader.py)",
             ("loader/**",)),
    Category("head", "embedding and LM head (hw/chip/embed.py, head.py)",
             ("embed/**", "head/**")),
    # no instance pattern: a cell category.  The SRAM macros (their own Liberty files, e.g.
    # the KDA state's fakeram45_* in hw.state_memory = "sram") are counted here wherever they
    # are instantiated, so the macros' area is its own line next to the logic around them
    Category(MACROS, "SRAM macros (hw/mem/fakeram.py)", ()),
)


def _matches(pattern: str, path: str) -> bool:
    pat, parts = pattern.split("/"), path.split("/")
    if pat[-1] == "**":
        pat = pat[:-1]
        if len(parts) < len(pat):
            return False
        parts = parts[:len(pat)]
    return len(pat) == len(parts) and all(fnmatchcase(s, p) for s, p in zip(parts, pat))


def category_of(path: str) -> str:
    """The key of the first category with a pattern matching ``path``, else ``unmapped``.
    ``path`` is an instance path (a/b/c, ``#i`` suffixes of repeated instances ignored)."""
    clean = "/".join(part.split("#", 1)[0] for part in path.split("/"))
    if clean.startswith(DATAPATH + "/"):
        clean = clean[len(DATAPATH) + 1:]
    for cat in CATEGORIES:
        if any(_matches(p, clean) for p in cat.patterns):
            return cat.key
    return UNMAPPED


def titles() -> dict[str, str]:
    return {**{c.key: c.title for c in CATEGORIES}, UNMAPPED: "unmapped (no pattern matches)"}


@dataclass
class CategoryArea:
    area: float = 0.0
    cells: int = 0
    sequential: float = 0.0
    instances: list[str] | None = None


def category_areas(stats: SynthStats) -> dict[str, CategoryArea]:
    """Category key -> own area, cells, sequential area and the instances counted, for
    every category in table order, then ``unmapped`` (always present)."""
    out = {c.key: CategoryArea(instances=[]) for c in CATEGORIES}
    out[UNMAPPED] = CategoryArea(instances=[])
    for path, module in [(TOP, stats.top)] + stats.instances():
        own = stats.modules[module].cells
        for key, cells in ((category_of(path), {c: n for c, n in own.items() if c not in stats.macros}),
                           (MACROS, {c: n for c, n in own.items() if c in stats.macros})):
            if not cells and key == MACROS:
                continue
            entry = out[key]
            entry.area += sum(n * stats.cell_area[c] for c, n in cells.items())
            entry.cells += sum(cells.values())
            entry.sequential += sum(n * stats.cell_area[c] for c, n in cells.items() if c in stats.sequential)
            entry.instances.append(path)
    return out


def elaborated_instances(elaboratable) -> list[str]:
    """Instance paths of every Amaranth submodule below ``elaboratable`` (those that
    become Verilog modules, so the instances synthesis reports), without synthesis."""
    from amaranth.hdl import Fragment
    out = []

    def walk(frag, prefix):
        for sub, name, _loc in frag.subfragments:
            if type(sub) is not Fragment:      # memories, instances: no module of their own
                continue
            path = prefix + str(name)
            out.append(path)
            walk(sub, path + "/")
    walk(Fragment.get(elaboratable, None), "")
    return out
