"""`moekda context`: what each layer kind costs per token as the context grows (issue 15, item 4).

K3's hybrid rests on one contrast: a KDA layer carries a state of fixed size, so its cycles and
bytes per token do not depend on how many tokens came before; a Gated MLA layer reads its whole
latent cache every token, so its cost grows with the context.  Three sources:

* **the datapath's cost of each layer kind** at context T (``kind_cost``): weight MACs and weight
  bytes counted from the layer's parameter shapes (model/params.py ``expected_shapes``, the
  shapes the float and integer models check), the MLA attention's 2 H r T MACs (scores
  qa_h . c_j and the weighted sum of the latents c_j), the latent cache read over the weight
  port (T r int8 bytes; the append is r bytes), the KDA state's two passes over
  ``hw.state_lanes``.  Its roofline, max(MACs / lanes, bytes / port bytes, state cycles), is
  the floor any control of this datapath has.  For MLA the unit's RTL is measured next to it
  (``measure_mla_unit``); for KDA the RTL's measured cycles sit on their bound within the
  utilisation of bench/results/model-*.md (flat in context, measured to 4096 tokens);
* **what the integer model keeps between tokens**, measured (``kept_bytes``): the integer
  model of the config runs a sequence and, at each context, the arrays it carries (KDA state
  and short-convolution history, MLA latents) are counted at their formats' widths.  The same
  for the model of the same shape with every layer MLA: the hybrid's cache saving;
* **the integer model against the float model along the context** (``accuracy_along``): the
  cosine of the logits in the window before each context, so the MLA's online softmax over a
  4096-token cache is checked where it is longest.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from studies.bench import _fmt
from flow.paths import RESULTS_DIR
from moekda.config import REPO_ROOT, Config, with_settings
from moekda.formats import formats_for

CONTEXTS = (16, 256, 1024, 4096)
WINDOW = 8              # tokens before each context position whose logits are compared
REPORTED_SAVING = 0.75  # K3's report: the 3:1 hybrid keeps about a quarter of all-MLA's cache


# ---- the datapath's cost of one layer kind --------------------------------------------------

def _elements(shapes: dict, prefix: str) -> int:
    """Weight elements (arrays of 2 or more axes) of the parameters under ``prefix``."""
    return sum(math.prod(s) for n, s in shapes.items() if n.startswith(prefix) and len(s) >= 2)


def channel_mixer_cost(cfg: Config, mixer: str) -> dict:
    """Weight MACs (= weight elements used) per token of a channel mixer: a dense SwiGLU all of
    it; a MoE the router, the shared experts and top_k of the routed experts (LatentMoE: and
    its two projections at full width)."""
    from model.params import expected_shapes
    m = cfg.model
    sh = expected_shapes(cfg, mixer)
    if mixer == "dense":
        used = _elements(sh, "dense.")
    else:
        p = "lmoe." if m.moe_latent else "moe."
        routed = sum(math.prod(sh[p + t]) for t in ("w_gate", "w_up", "w_down"))
        used = _elements(sh, p) - routed + routed * m.top_k // m.n_experts
    return {"macs": used, "weight_bytes": used * cfg.formats.weight_bits // 8}


def kind_cost(cfg: Config, kind: str, context: int) -> dict:
    """One token mixer of ``kind`` ("kda" or "mla") for a token at ``context`` (tokens in the
    sequence so far, this one included), on the config's datapath.  The limits are the
    chip's units: the matrix-vector engine's MAC lanes (weights, and an MLA's scores), the
    weight port, an MLA's cache port (its own, as wide as the weight port: each head reads
    the cache's rows, whole beats), the online softmax (a position a cycle per head; its
    weighted sum of the latents has its own kv_rank lanes), the KDA state's lanes."""
    from model.params import expected_shapes
    m, hw, fm = cfg.model, cfg.hw, formats_for(cfg)
    H, dh, pb = m.n_heads, m.head_dim, hw.weight_port_bytes
    weight = _elements(expected_shapes(cfg, kind=kind), kind + ".")
    c = {"kind": kind, "context": context, "weight_macs": weight,
         "weight_bytes": weight * fm.weight_bits // 8}
    limits = {}
    if kind == "mla":
        r = m.kv_rank
        from hw.mla.cache import row_beats
        row = row_beats(cfg) * pb                           # a latent in whole port beats
        # scores qa_h . c_j on the engine, the weighted sum of the c_j in the softmax's lanes
        c["attention_macs"] = 2 * H * r * context
        c["cache_read_bytes"] = H * context * row
        c["cache_write_bytes"] = row
        c["state_cycles"] = 0.0
        c["kept_bytes"] = context * r * fm.act_bits // 8
        engine = weight + H * r * context
        limits["cache port"] = (c["cache_read_bytes"] + c["cache_write_bytes"]) / pb
        limits["softmax"] = float(H * context)
    else:
        c["attention_macs"] = 0
        c["cache_read_bytes"] = c["cache_write_bytes"] = 0
        # the delta rule's two passes over S (hw/kda/delta.py), state_lanes entries a cycle
        c["state_cycles"] = 2 * H * dh * dh / hw.state_lanes
        c["kept_bytes"] = (H * dh * dh * fm.state_bits + 3 * (m.conv_kernel - 1) * H * dh * fm.act_bits) // 8
        engine = weight
    c["macs"] = c["weight_macs"] + c["attention_macs"]
    c["engine_macs"] = engine
    c["port_bytes"] = c["weight_bytes"] + c["cache_read_bytes"] + c["cache_write_bytes"]
    limits.update({"MAC lanes": engine / hw.lanes, "weight port": c["weight_bytes"] / pb,
                   "KDA state lanes": c["state_cycles"]})
    c["limits"] = limits
    c["bound_cycles"] = max(limits.values())
    c["bound_by"] = max(limits, key=limits.get)
    return c


def model_cost(cfg: Config, context: int) -> dict:
    """Every layer of the model (token mixer and channel mixer), the LM head and, with
    Attention Residuals, the depth unit's mixes, one token at ``context``: MACs, port bytes and the sum of the layers' bounds (the layers run one after
    another on the one datapath; a layer's engine and weight port are shared by its two
    mixers, its cache port and softmax are the MLA's own)."""
    m, hw = cfg.model, cfg.hw
    macs = port = cycles = kept = 0.0
    for kind, mixer in zip(m.layers, m.mixers):
        k, x = kind_cost(cfg, kind, context), channel_mixer_cost(cfg, mixer)
        macs += k["macs"] + x["macs"]
        port += k["port_bytes"] + x["weight_bytes"]
        own = [v for n, v in k["limits"].items() if n in ("cache port", "softmax", "KDA state lanes")]
        cycles += max((k["engine_macs"] + x["macs"]) / hw.lanes, (k["weight_bytes"] + x["weight_bytes"]) / hw.weight_port_bytes,
                      *own)
        kept += k["kept_bytes"]
    head = m.vocab * m.d_model
    macs, port = macs + head, port + head * cfg.formats.weight_bits // 8
    cycles += max(head / hw.lanes, head * cfg.formats.weight_bits / 8 / hw.weight_port_bytes)
    if m.attn_res != "none":
        # Attention Residuals: the depth unit's mixes (their MACs, a query row each on the
        # weight port), one job after another between the layers (hw/attnres/kept.py)
        from hw.attnres.kept import depth_cycles_per_token, depth_macs_per_token, depth_query_bytes_per_token
        macs += depth_macs_per_token(cfg)
        port += depth_query_bytes_per_token(cfg)
        cycles += depth_cycles_per_token(cfg)
    return {"context": context, "macs": int(macs), "port_bytes": int(port), "bound_cycles": cycles,
            "kept_bytes": int(kept)}


# ---- measured on the integer model -----------------------------------------------------------

def all_mla(cfg: Config) -> Config:
    """The model of the same shape with every token mixer a Gated MLA layer."""
    layers = ", ".join('"mla"' for _ in cfg.model.layers)
    return with_settings(cfg, [f"model.layers=[{layers}]"])


def state_bytes(cfg: Config, state) -> list[int]:
    """Bytes of what an IntModelState carries to the next token, per layer, at the formats' widths."""
    from model.int_mla import IntMLACache
    fm = formats_for(cfg)
    out = []
    for st in state.layers:
        if isinstance(st, IntMLACache):
            bits = sum(c.size for c in st.latents) * fm.act_bits
        else:
            bits = st.S.size * fm.state_bits + (st.conv_q.size + st.conv_k.size + st.conv_v.size) * fm.act_bits
        out.append(bits // 8)
    return out


def run_integer(cfg: Config, tokens: np.ndarray, seed: int = 0, with_float: bool = False,
                progress=None) -> dict:
    """The config's integer model (``quantize_random_model``) over ``tokens``: the bytes it keeps
    at each context in CONTEXTS reached, and (``with_float``) the cosine of its logits to the
    float model's in the WINDOW tokens before each."""
    from model.float_model import ModelState, model_step
    from model.int_model import IntModelState, dequantize_logits, int_model_step
    from model.params import random_model_params
    from model.quantize import quantize_model
    mp = random_model_params(cfg, seed)
    qm = quantize_model(mp, cfg, model_seed=seed)
    st, fst = IntModelState.zeros(cfg), ModelState.zeros(cfg) if with_float else None
    kept, cos, ints, floats = {}, {}, [], []
    t0 = time.monotonic()
    for t, tok in enumerate(tokens, start=1):
        st, logits = int_model_step(qm, cfg, st, tok)
        if with_float:
            fst, fl = model_step(mp, cfg, fst, tok)
            ints.append(dequantize_logits(qm, logits))
            floats.append(fl)
            ints, floats = ints[-WINDOW:], floats[-WINDOW:]
        if t in CONTEXTS:
            kept[t] = state_bytes(cfg, st)
            if with_float:
                a, b = np.concatenate(ints), np.concatenate(floats)
                cos[t] = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
            if progress:
                progress(f"{cfg.name}: context {t:,} after {time.monotonic() - t0:.0f} s")
    return {"kept_bytes": kept, "cosine": cos, "seconds": time.monotonic() - t0}


# ---- measured on the RTL ---------------------------------------------------------------------

def token_mixer_config(cfg: Config) -> str:
    """A config file the MLA unit's bench takes for ``cfg``: the same model without Attention
    Residuals and LatentMoE (the memory image holds neither yet; neither changes the token
    mixer's unit, its parameters or its cycles); ``cfg``'s own file when it has neither."""
    m = cfg.model
    if m.attn_res == "none" and not m.moe_latent:
        return cfg.source or cfg.name
    from studies.sweep import write_config
    raw = cfg.to_dict()
    raw["model"].update(attn_res="none", moe_latent=0)
    raw["name"] = f"{cfg.name}-mixers"
    return write_config(raw)


def measure_mla_unit(cfg: Config, contexts, seed: int = 0, progress=None) -> dict:
    """The MLA unit's RTL (hw/mla/unit.py, Icarus, no stalls) on one sequence of the last
    MLA layer: the cache rows before each measured token restored into the bench's cache
    memory (sim/cocotb/tb_mla.py ``long_mla_case``), then the tokens at positions
    context - 1 run, each checked bit for bit against ``int_mla_step``; their
    ``token_cycles`` (input accepted to output offered)."""
    from sim.cocotb.tb_mla import long_mla_case, run_mla_case
    config = token_mixer_config(cfg)
    t0 = time.monotonic()
    case = long_mla_case(config, seed, max(contexts), run_at=[c - 1 for c in contexts])
    cycles = run_mla_case(config, case, stall=False, seed=seed, name="context_sweep")
    if progress:
        progress(f"MLA unit RTL: token_cycles {cycles} at contexts {list(contexts)} "
                 f"({time.monotonic() - t0:.0f} s)")
    # the config as the repository names it (a derived one is written under build/configs/)
    path = Path(config).resolve()
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else config
    return {"config": str(shown), "token_cycles": dict(zip(map(str, contexts), cycles)), "simulator": "icarus",
            "seconds": round(time.monotonic() - t0, 1)}


# ---- the record ----------------------------------------------------------------------------------

def sweep(cfg: Config, tokens: int = CONTEXTS[-1], seed: int = 0, progress=None, rtl: bool = True) -> dict:
    from model.params import random_tokens
    ctxs = [c for c in CONTEXTS if c <= tokens]
    kinds = {k: [kind_cost(cfg, k, c) for c in ctxs] for k in ("kda", "mla") if k != "mla" or cfg.model.kv_rank}
    toks = random_tokens(cfg, tokens, seed=seed + 1, model_seed=seed)
    rec = {"config": cfg.name, "contexts": ctxs, "tokens": tokens,
           "hw": {"lanes": cfg.hw.lanes, "weight_port_bytes": cfg.hw.weight_port_bytes,
                  "state_lanes": cfg.hw.state_lanes},
           "layers": list(cfg.model.layers), "kinds": kinds,
           "model": [model_cost(cfg, c) for c in ctxs]}
    if rtl and "mla" in kinds:
        rec["mla_rtl"] = measure_mla_unit(cfg, ctxs, seed, progress)
    hyb = run_integer(cfg, toks, seed, with_float=True, progress=progress)
    rec["integer"] = hyb
    if "mla" in cfg.model.layers and "kda" in cfg.model.layers:
        ref = all_mla(cfg)
        rec["all_mla"] = {"model": [model_cost(ref, c) for c in ctxs],
                          "integer": run_integer(ref, toks, seed, progress=progress)}
        far = ctxs[-1]
        h, a = sum(hyb["kept_bytes"][far]), sum(rec["all_mla"]["integer"]["kept_bytes"][far])
        # per token of context: the growth between the first and the last context measured
        first = ctxs[0]
        slope = lambda kb: (sum(kb[far]) - sum(kb[first])) / (far - first) if far > first else None
        hs, as_ = slope(hyb["kept_bytes"]), slope(rec["all_mla"]["integer"]["kept_bytes"])
        rec["cache_saving"] = {"context": far, "hybrid_bytes": h, "all_mla_bytes": a, "saving": 1 - h / a,
                               "hybrid_bytes_per_token": hs, "all_mla_bytes_per_token": as_,
                               "saving_per_token": 1 - hs / as_ if as_ else None, "reported": REPORTED_SAVING}
    return rec


def markdown(rec: dict) -> str:
    ctxs = rec["contexts"]
    hw = rec["hw"]
    out = [f"# context sweep: {rec['config']} (layers {' '.join(rec['layers'])})", "",
           f"One token mixer of each kind on this datapath ({hw['lanes']} MAC lanes, {hw['weight_port_bytes']}-byte "
           f"weight port, {hw['state_lanes']} state lanes), for a token at each context: the units' bound "
           "(docs/bench.md) and, for MLA, the MLA unit's RTL measured.", "",
           "| kind | context | MACs | port bytes (weights + cache) | cache read | kept bytes | bound cycles | bound by | RTL cycles |",
           "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    rtl = rec.get("mla_rtl", {}).get("token_cycles", {})
    for kind, rows in rec["kinds"].items():
        for c in rows:
            meas = rtl.get(str(c["context"])) if kind == "mla" else None
            out.append(f"| {kind} | {c['context']:,} | {c['macs']:,} | {c['port_bytes']:,} | "
                       f"{c['cache_read_bytes']:,} | {c['kept_bytes']:,} | {c['bound_cycles']:,.1f} | {c['bound_by']} | "
                       f"{_fmt(meas, ',d')} |")
    for kind, rows in rec["kinds"].items():
        out.append("")
        out.append(f"- {kind}: bound cycles at context {ctxs[-1]:,} / at {ctxs[0]}: "
                   f"{rows[-1]['bound_cycles'] / rows[0]['bound_cycles']:.3f}")
    if rtl:
        r = rec["mla_rtl"]
        first, last = str(ctxs[0]), str(ctxs[-1])
        slope = (rtl[last] - rtl[first]) / (ctxs[-1] - ctxs[0]) if len(ctxs) > 1 else None
        out += ["", f"- mla, RTL: {rtl[last]:,} cycles at context {ctxs[-1]:,} against {rtl[first]:,} at "
                f"{ctxs[0]} ({_fmt(slope, '.3f')} cycles per cached token; {r['simulator']}, no stalls, every token "
                f"bit-exact; the unit of `{r['config']}`).  KDA's RTL cycles are flat to the cycle: "
                "bench/results/model-*.md, sim/tests/block/test_kda_unit.py."]
    out += ["", "The whole model per token (every layer and the LM head, one after another):", "",
            "| context | MACs | port bytes | bound cycles | kept bytes (cost model) | kept bytes (integer model, measured) | int vs float logits cosine |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    integ = rec["integer"]
    for m in rec["model"]:
        c = m["context"]
        kb = integ["kept_bytes"].get(c) or integ["kept_bytes"].get(str(c))
        cs = integ["cosine"].get(c, integ["cosine"].get(str(c)))
        out.append(f"| {c:,} | {m['macs']:,} | {m['port_bytes']:,} | {m['bound_cycles']:,.1f} | {m['kept_bytes']:,} | "
                   f"{_fmt(sum(kb) if kb else None, ',.0f')} | {_fmt(cs, '.4f')} |")
    if "cache_saving" in rec:
        s = rec["cache_saving"]
        out += ["", f"Cache kept against the model of the same shape with every layer MLA "
                f"(integer models, measured at context {s['context']:,}):", "",
                "| model | kept bytes | bytes per token of context |", "|---|---:|---:|",
                f"| hybrid ({' '.join(rec['layers'])}) | {s['hybrid_bytes']:,} | {_fmt(s['hybrid_bytes_per_token'], ',.1f')} |",
                f"| all MLA | {s['all_mla_bytes']:,} | {_fmt(s['all_mla_bytes_per_token'], ',.1f')} |", "",
                f"Saving: {s['saving']:.1%} of the bytes kept at context {s['context']:,}, "
                f"{_fmt(s['saving_per_token'], '.1%')} per token of context (K3 reports about {s['reported']:.0%})."]
    out += ["", f"Produced by `{rec.get('command', 'moekda context')}` at commit {rec.get('commit', 'unknown')[:12]}"
            + (" (working tree changed)" if rec.get("working_tree_changed") else "") + f", {rec.get('date', '')}."]
    return "\n".join(out) + "\n"


def plot(rec: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, rows in rec["kinds"].items():
        a.plot([c["context"] for c in rows], [c["bound_cycles"] for c in rows], "o--", label=f"{kind} layer, bound")
    rtl = rec.get("mla_rtl", {}).get("token_cycles", {})
    if rtl:
        a.plot([int(c) for c in rtl], list(rtl.values()), "s-", label="mla layer, RTL measured")
    a.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="cycles per token",
          title=f"{rec['config']}: one token mixer")
    a.legend()
    a.grid(True, which="both", alpha=0.3)
    ctxs = rec["contexts"]
    kb = lambda integ: [sum(integ["kept_bytes"].get(c) or integ["kept_bytes"][str(c)]) for c in ctxs]
    b.plot(ctxs, kb(rec["integer"]), "o-", label="hybrid " + "/".join(rec["layers"]))
    if "all_mla" in rec:
        b.plot(ctxs, kb(rec["all_mla"]["integer"]), "s-", label="all MLA, same shape")
    b.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="bytes kept (integer model)",
          title="state and cache of the whole model")
    b.legend()
    b.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(rec: dict, out_dir: Path = RESULTS_DIR) -> tuple[Path, Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"context-{rec['config']}"
    j, md, png = stem.with_suffix(".json"), stem.with_suffix(".md"), stem.with_suffix(".png")
    j.write_text(json.dumps(rec, indent=1, default=str) + "\n")
    md.write_text(markdown(rec))
    plot(rec, png)
    return j, md, png
