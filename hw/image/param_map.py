"""The parameter region: every per-model value that is not a weight matrix.

One source of truth for the chip's run-time parameters (issue 13: the RTL
is a function of the config alone).  Each ``ParamField`` names one value of
the quantised layer by its dotted name in ``QLayer.to_flat()`` (for example
``kda.q_proj.m``), with its shape, width, signedness and allowed range.
From this one list:

* the image writer (hw/image/format.py) packs the values into the
  parameter region of the memory image and refuses a value out of range,
  naming the field;
* the chip's LOAD step shifts the region into one register (the parameter
  bank), and every block reads its values from a slice of it: the blocks'
  ``params`` ports have the Amaranth layout ``param_layout`` builds from the
  same list, so the bit positions in the image and in the register are the
  same by construction (model/tests/test_param_map.py checks it);
* docs/chip.md's table of what is where.

Packing: fields in list order, each element ``bits`` wide, elements of an
array in C order, least significant bit first; the region is the bit
string cut into bytes, little-endian, zero-padded to a whole port beat.
A layer's fields depend on its token mixer (``kind``: "kda", or a Gated MLA
layer's "mla") and its channel mixer (``mixer``: "moe" or "dense"); in a
config with both kinds the shorter token mixer's fields are followed by
``token_pad``, zeros that are no value (``param_fields`` says why).

``structural(cfg)`` lists the integers of ``QLayer`` that are not
parameters but facts of the config (the output width of each requantiser,
the input width of each table): the hardware uses them as constants, the
quantiser must produce exactly them, and the image writer checks them.

This module imports neither Amaranth nor sim/: the layout builder imports
Amaranth lazily, so the image tools stay light.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from moekda.formats import clog2, derived_widths, formats_for
from moekda.tables import FIXED_TABLES, fixed_table

# every requantisation shift (matrices, short conv, residual adds, MoE combine) is
# a SHIFT_BITS-bit unsigned field: the quantiser's shifts are 4..28 on tiny and small
SHIFT_BITS = 6


@dataclass(frozen=True)
class ParamField:
    name: str              # dotted, as in QLayer.to_flat()
    shape: tuple           # () for a scalar
    bits: int
    signed: bool
    lo: int                # allowed values, inclusive
    hi: int
    doc: str = ""
    pad: bool = False      # padding (PAD_FIELD), not a value: packed as zeros, not read back

    @property
    def count(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def total_bits(self) -> int:
        return self.count * self.bits


def _full_range(bits: int, signed: bool) -> tuple[int, int]:
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def _f(name, shape, bits, signed, doc, lo=None, hi=None) -> ParamField:
    flo, fhi = _full_range(bits, signed)
    return ParamField(name, tuple(shape), bits, signed, flo if lo is None else lo, fhi if hi is None else hi, doc)


def mla_norm_ss_bits(cfg) -> int:
    """Sum-of-squares width of the Gated MLA's latent RMSNorm (``mla.kv_norm``): the squares of
    kv_rank resid_bits values."""
    fm = formats_for(cfg)
    return 2 * (fm.resid_bits - 1) + clog2(cfg.model.kv_rank + 1) + 1


def lat_norm_ss_bits(cfg) -> int:
    """Sum-of-squares width of LatentMoE's exit norm (``moe.lat_norm``, model.latent_exit_norm):
    the squares of moe_latent resid_bits values."""
    fm = formats_for(cfg)
    return 2 * (fm.resid_bits - 1) + clog2(cfg.model.moe_latent + 1) + 1


def kda_norm_ss_bits(cfg) -> int:
    """Sum-of-squares width of the KDA's shared normaliser (q, k L2 norms and the o RMSNorm)."""
    fm = formats_for(cfg)
    nbits = max(fm.qkv_bits, fm.o_bits)
    return 2 * (nbits - 1) + clog2(cfg.model.head_dim + 1) + 1


# The weight matrices, each list written once: the memory map's regions and the image's
# sources (hw/image/memory_map.py), the requantisers here (one per matrix) and the units'
# weight reads (hw/kda/unit.py, hw/mla/unit.py OPS) are all made from them.
# A token mixer's: (memory-map region, the quantised layer's field (QKDA / QMLA,
# model/qparams.py), rows, cols) in memory order, the dimensions as kda_tensors and
# mla_tensors (hw/image/memory_map.py) name them.
KDA_MATRICES = (("w_q", "q_proj", "hk", "d"), ("w_k", "k_proj", "hk", "d"), ("w_v", "v_proj", "hk", "d"),
                ("w_f_down", "f_down", "r", "d"), ("w_g_down", "g_down", "r", "d"), ("w_b", "b_proj", "H", "d"),
                ("w_f_up", "f_up", "hk", "r"), ("w_g_up", "g_up", "hk", "r"), ("w_o", "o_proj", "d", "hk"))
MLA_MATRICES = (("w_dkv", "dkv", "r", "d"), ("w_q", "q_proj", "Hdh", "d"), ("w_g", "g_proj", "Hdh", "d"),
                ("w_uk", "uk", "Hr", "dh"), ("w_uv", "uv", "Hdh", "r"), ("w_o", "o_proj", "d", "Hdh"))
# an expert's (and a dense chunk's) matrices, in memory order
EXPERT_MATS = ("gate", "up", "down")
# the KDA's requantised matrices and short convolutions, as QKDA field names
KDA_LINEARS = tuple(field for _, field, _, _ in KDA_MATRICES)
KDA_CONVS = ("conv_q", "conv_k", "conv_v")
KDA_NORMS = ("q_norm", "k_norm", "o_norm")
# the Gated MLA's requantised matrices, as QMLA field names, in region order
MLA_LINEARS = tuple(field for _, field, _, _ in MLA_MATRICES)
LAYER_KINDS = ("kda", "mla")
# the padding after a shorter token mixer's fields (param_fields): zeros, not a value
PAD_FIELD = "token_pad"


def conv_taps_in_sram(cfg) -> bool:
    """The KDA's short-convolution taps live in an SRAM macro beside the convolution's history
    (hw/kda/short_conv.py) instead of the parameter bank: with hw.state_memory = "sram" (the
    history is there already), kernel > 1, and a port beat of whole channels' taps (K divides
    the beat, a power of two of channels per beat, the q, k, v channels whole beats).  Their
    fields then leave the layer's block (``param_fields``) for a block of their own at the
    start of the parameter region (``tap_map``, one per KDA layer): LOAD writes its beats
    into the macro, one word a beat.  On tiny the 1,536 bank flip-flops and their 48:1 read
    became one 64x32 macro (docs/chip.md "Short-convolution taps in SRAM")."""
    m, W = cfg.model, cfg.hw.weight_port_bytes
    K, hk = m.conv_kernel, m.n_heads * m.head_dim
    if cfg.hw.state_memory != "sram" or K < 2 or "kda" not in m.layers or W % K:
        return False
    per_beat = W // K
    return per_beat & (per_beat - 1) == 0 and (3 * hk * K) % W == 0


def tap_fields(cfg) -> list["ParamField"]:
    """A KDA layer's short-convolution taps (q's, k's, v's channels, oldest tap first): the
    convolution's channel order, so the packed bytes are the tap memory's words in order."""
    m, fm = cfg.model, formats_for(cfg)
    hk, hv = m.n_heads * m.head_dim, m.n_heads * m.head_dim
    return [_f(f"kda.{conv}.w", (n, m.conv_kernel), fm.weight_bits, True, "short-conv taps, oldest first")
            for conv, n in zip(KDA_CONVS, (hk, hk, hv))]


def tap_map(cfg) -> "ParamMap":
    """One KDA layer's block of taps when they live in SRAM (``conv_taps_in_sram``): whole
    port beats, each a word of the tap memory (hw/kda/short_conv.py)."""
    return ParamMap(tuple(tap_fields(cfg)), cfg.hw.weight_port_bytes, memory="taps")


def tap_words(cfg) -> int:
    """Words (port beats) of the tap memory: every KDA layer's ``tap_map``; 0 when the taps
    are in the bank."""
    if not conv_taps_in_sram(cfg):
        return 0
    return tap_map(cfg).beats * sum(1 for k in cfg.model.layers if k == "kda")


def _check_kind(kind: str) -> None:
    if kind not in LAYER_KINDS:
        raise ValueError(f"layer kind {kind!r}: one of {', '.join(LAYER_KINDS)}")


def table_fields(cfg, mixer: str = "moe", kind: str = "kda") -> list[tuple[str, int, bool, str]]:
    """(dotted name, entry bits, signed, what) of every nonlinearity table of a layer whose
    channel mixer is ``mixer`` ("moe", or "dense": no router score table)
    and whose token mixer is ``kind`` ("kda", or "mla": its one gate table in place of the
    KDA's three).  Every one is the config's (moekda/tables.py FIXED_TABLES)."""
    _check_kind(kind)
    fm = formats_for(cfg)
    if kind == "mla":
        tok = [("mla.gate", fm.unit_frac + 1, False, "output gate = sigmoid, U0.unit_frac")]
    else:
        tok = [("kda.alpha", fm.alpha_frac, False, "decay alpha = exp(lb sigmoid(z)), U0.alpha_frac"),
               ("kda.beta", fm.unit_frac + 1, False, "beta = sigmoid, U0.unit_frac"),
               ("kda.gate", fm.unit_frac + 1, False, "output gate = sigmoid, U0.unit_frac")]
    if mixer == "dense":
        return tok
    return tok + [("moe.score", fm.score_frac + 1, False, "router score = sigmoid, U0.score_frac")]


def silu_fields(cfg, mixer: str = "moe", kind: str = "kda") -> list[tuple[str, int, str]]:
    """(dotted name, output bits, what) of every SiLU (QSilu: x * sigmoid(x), moekda/tables.py)
    of a layer whose channel mixer is ``mixer`` and token mixer ``kind`` (as table_fields).
    With SiTU-GLU (model.glu = "situ") the experts and dense chunks have none: their gate code
    indexes the config's SITU table directly."""
    _check_kind(kind)
    fm = formats_for(cfg)
    tok = [] if kind == "mla" else [
        ("kda.silu_q", fm.qkv_bits, "SiLU after the q short conv"),
        ("kda.silu_k", fm.qkv_bits, "SiLU after the k short conv"),
        ("kda.silu_v", fm.qkv_bits, "SiLU after the v short conv (v at 2**-f_v)")]
    if cfg.model.glu == "situ":
        return tok
    if mixer == "dense":
        return tok + [("dense.silu", fm.act_bits, "dense chunks' SiLU -> int8")]
    return tok + [("moe.silu", fm.act_bits, "expert SiLU -> int8")]


def param_fields(cfg, mixer: str = "moe", kind: str = "kda") -> list[ParamField]:
    """Every run-time parameter of one layer, in region (and bank) order.  ``mixer="dense"``:
    the layer of a model whose channel mixer is dense (QDense: its chunks take the MoE's
    shared-expert fields' form under ``dense.*``; no router, score table, bias or rs).
    ``kind="mla"``: a Gated MLA layer (QMLA: its ``mla.*`` fields in place of ``kda.*``).

    The token mixer's half comes first (``attn_norm``, the kind's fields, ``res1``), then the
    channel mixer's (``mlp_norm`` on).  The model chip fetches either half of any layer's
    block into its one parameter bank (hw/chip/loader.py), so each half must start at the
    same bit in every block (``mixer_split_bit``).  An MLA layer's fields are far fewer than
    a KDA layer's (one table in place of six, no short convolutions), so in a config with
    both kinds the shorter kind's fields are followed by ``PAD_FIELD`` (``token_pad``,
    ``token_pad_bits`` zero bits: packed as zeros, never read back).  ``res1`` and the
    channel mixer's fields are then at the same bits in a KDA and an MLA layer of the same
    mixer; only the token mixer's own fields differ.  A config with one kind has no padding
    (a KDA-only config's blocks are what they were)."""
    out = _token_fields(cfg, kind)
    pad = token_pad_bits(cfg, kind)
    if pad:
        out.append(ParamField(PAD_FIELD, (), pad, False, 0, 0, "the token mixer half's padding (zeros)", True))
    fm, m = formats_for(cfg), cfg.model
    dw = derived_widths(cfg)
    requant, norm, residual, silu = _adders(cfg, out, mixer, kind)

    def cap(prefix, what, shape):
        # SiTU-GLU's up branch 25 tanh(u/25) = c * CAP[t] (moekda/tables.py): per expert, the
        # up code's requantisation to CAP's fixed input format
        requant(f"{prefix}.cap_t_m", f"{prefix}.cap_t_s", f"{what} up code -> CAP input (SiTU-GLU)", shape)

    residual("res1", f"{kind.upper()} residual add")
    norm("mlp_norm", dw["ss_rmsnorm"], "MoE RMSNorm")
    situ = m.glu == "situ"
    if mixer == "dense":
        if not situ:
            silu("dense.silu")
        for mat in EXPERT_MATS:
            requant(f"dense.chunks.{mat}_m", f"dense.chunks.{mat}_s", f"dense chunks' {mat} requantisation",
                    (m.dense_chunks,))
        out[-1] = replace(out[-1], lo=dw["swiglu_prod"] - fm.hid_bits + 1)   # as the experts' down_s
        if situ:
            cap("dense.chunks", "dense chunks'", (m.dense_chunks,))
        requant("dense.comb_m", "dense.comb_s", "dense combine -> resid_bits")
        residual("res2", "dense residual add")
        _check_tree_order([f.name for f in out])
        return out
    # ---- MoE
    E = m.n_experts
    requant("moe.router.m", "moe.router.s", "router requantisation")
    out.append(_f("moe.bias", (E,), fm.router_bias_bits, True, "expert selection bias, score units"))
    if not situ:
        silu("moe.silu")
    for bank, n in (("routed", E), ("shared", m.n_shared)):
        if n == 0:
            continue
        for mat in EXPERT_MATS:
            requant(f"moe.{bank}.{mat}_m", f"moe.{bank}.{mat}_s", f"{bank} experts' {mat} requantisation", (n,))
        # the down projection's shift is down_s - sh, sh the per-token hidden exponent
        # (0 .. swiglu_prod - hid_bits, hw/moe/unit.py), and the model needs it >= 1: with
        # down_s above every sh the unit's 6-bit subtraction can neither wrap nor reach 0
        out[-1] = replace(out[-1], lo=dw["swiglu_prod"] - fm.hid_bits + 1)
        if situ:
            cap(f"moe.{bank}", f"{bank} experts'", (n,))
    out.append(_f("moe.rs", (), dw["rs_int"], False, "routed_scaling as U.rs_frac"))
    if m.moe_latent:
        # LatentMoE (int_moe.py): z = lat_down(hn) int8; the routed sum requantised by
        # (lat_m, lat_s) to int8; lat_up back to d_model at the experts' output scale
        requant("moe.lat_down.m", "moe.lat_down.s", "LatentMoE down-projection")
        requant("moe.lat_up.m", "moe.lat_up.s", "LatentMoE up-projection")
        requant("moe.lat_m", "moe.lat_s", "LatentMoE routed sum -> int8" if not m.latent_exit_norm
                else "LatentMoE routed sum -> resid_bits, into the exit norm")
        if m.latent_exit_norm:
            # K3's exit norm (issue 47 difference 4): the 16-bit sum's RMSNorm to int8, its
            # weight folded into lat_up (QMoE.lat_norm)
            norm("moe.lat_norm", lat_norm_ss_bits(cfg), "LatentMoE exit RMSNorm")
    requant("moe.comb_m", "moe.comb_s", "MoE combine -> resid_bits")
    residual("res2", "MoE residual add")
    _check_tree_order([f.name for f in out])
    return out


def _adders(cfg, out: list, mixer: str, kind: str):
    """The helpers that append a requantiser's, a norm's, a residual add's and a SiLU's
    fields to ``out``.  Tables have none: every one is the config's (moekda/tables.py)."""
    fm = formats_for(cfg)
    mb = fm.mult_bits

    def requant(m_name, s_name, doc, shape=()):
        out.append(_f(m_name, shape, mb, False, f"{doc}: multiplier"))
        out.append(_f(s_name, shape, SHIFT_BITS, False, f"{doc}: shift"))

    def norm(prefix, ss_bits, doc):
        out.append(_f(f"{prefix}.eps_int", (), ss_bits, False, f"{doc}: eps in sum-of-squares units"))
        out.append(_f(f"{prefix}.m", (), mb, False, f"{doc}: output multiplier"))
        out.append(_f(f"{prefix}.s", (), 5, False, f"{doc}: output shift"))

    def residual(prefix, doc):
        out.append(_f(f"{prefix}.m_a", (), mb, False, f"{doc}: multiplier of the residual"))
        out.append(_f(f"{prefix}.m_b", (), mb, False, f"{doc}: multiplier of the branch"))
        out.append(_f(f"{prefix}.s", (), SHIFT_BITS, False, f"{doc}: shift"))

    silus = {name: doc for name, _, doc in silu_fields(cfg, mixer, kind)}

    def silu(name):
        # SiLU = c * sigmoid (QSilu): the code's requantisation to the sigmoid's input and the
        # product's to the output; the sigmoid itself is the config's
        requant(f"{name}.t_m", f"{name}.t_s", f"{silus[name]}: code -> sigmoid input")
        requant(f"{name}.m", f"{name}.s", f"{silus[name]}: c * sigmoid -> output")
    return requant, norm, residual, silu


def _token_fields(cfg, kind: str) -> list[ParamField]:
    """The token mixer's fields of a ``kind`` layer before its padding and ``res1``:
    ``attn_norm`` and the ``kda.*`` or ``mla.*`` fields."""
    _check_kind(kind)
    fm, m = formats_for(cfg), cfg.model
    dw = derived_widths(cfg)
    hk, hv, K = m.n_heads * m.head_dim, m.n_heads * m.head_dim, m.conv_kernel
    out: list[ParamField] = []
    requant, norm, residual, silu = _adders(cfg, out, "moe", kind)

    norm("attn_norm", dw["ss_rmsnorm"], "attention RMSNorm")
    if kind == "mla":
        # ---- Gated MLA (QMLA; model/int_mla.py)
        for lin in MLA_LINEARS:
            requant(f"mla.{lin}.m", f"mla.{lin}.s", f"mla {lin} requantisation")
        norm("mla.kv_norm", mla_norm_ss_bits(cfg), "mla latent RMSNorm")
        out.append(_f("mla.u_m", (), fm.mult_bits, False, "mla score qa . c -> u (base 2): multiplier"))
        out.append(_f("mla.u_s", (), SHIFT_BITS, False, "mla score qa . c -> u (base 2): shift"))
        return out
    # ---- KDA
    for lin in KDA_LINEARS:
        requant(f"kda.{lin}.m", f"kda.{lin}.s", f"kda {lin} requantisation")
        if lin == "f_up":
            out.append(_f("kda.f_up.bias", (hk,), fm.acc_bits, True, "f_up accumulator bias (A dt_bias - code centre)"))
    taps = {} if conv_taps_in_sram(cfg) else {f.name: f for f in tap_fields(cfg)}
    for conv in KDA_CONVS:
        if f"kda.{conv}.w" in taps:
            out.append(taps[f"kda.{conv}.w"])
        requant(f"kda.{conv}.m", f"kda.{conv}.s", f"kda {conv} requantisation")
    for name in ("kda.silu_q", "kda.silu_k", "kda.silu_v"):
        silu(name)
    ss = kda_norm_ss_bits(cfg)
    for nm in KDA_NORMS:
        norm(f"kda.{nm}", ss, f"kda {nm}")
    # power-of-two formats of q, k, v and the state: the delta rule's shifts
    out.append(_f("kda.f_q", (), 4, False, "fractional bits of q", 0, fm.qk_bits - 1))
    out.append(_f("kda.f_k", (), 4, False, "fractional bits of k", 0, fm.qk_bits - 1))
    out.append(_f("kda.f_v", (), 5, False, "fractional bits of v (<= f_s)", 0, fm.qkv_bits - 1))
    out.append(_f("kda.f_s", (), 5, False, "fractional bits of the state", 0, fm.state_bits - 1))
    out.append(_f("kda.o_shift", (), 5, False, "o16 = sat(rs(q . S, o_shift))", 0,
                  fm.qk_bits + fm.state_bits - 2))
    return out


def token_pad_bits(cfg, kind: str = "kda") -> int:
    """Zero bits after a ``kind`` layer's token-mixer fields, before ``res1``: what makes its
    token mixer's half as long as the longest of the kinds the config's layers use (0 when
    it is the longest, or the config has one kind)."""
    bits = {k: sum(f.total_bits for f in _token_fields(cfg, k)) for k in set(cfg.model.layers) | {kind}}
    return max(bits.values()) - bits[kind]


def _check_tree_order(names: list[str]) -> None:
    """Every dotted prefix's fields must be contiguous, so a nested StructLayout (which
    groups by prefix) lays the bits out in list order."""
    if len(set(names)) != len(names):
        raise AssertionError("param_fields: a name is listed twice")
    closed: set[str] = set()
    prev: list[str] = []
    for name in names:
        parts = name.split(".")[:-1]
        prefixes = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
        for p in prev:
            if p not in prefixes:
                closed.add(p)
        for p in prefixes:
            if p in closed:
                raise AssertionError(f"param_fields: fields under {p!r} are not contiguous ({name})")
        prev = prefixes


def table_shape(cfg, name: str):
    """The Amaranth shape of table ``name``'s entries (loaded or fixed), from table_fields."""
    from amaranth import signed, unsigned
    for mixer in ("moe", "dense"):
        for kind in LAYER_KINDS:
            for n, bits, sgn, _ in table_fields(cfg, mixer, kind):
                if n == name:
                    return (signed if sgn else unsigned)(bits)
    raise KeyError(f"{name}: not a table")


def structural(cfg, mixer: str = "moe", kind: str = "kda") -> dict[str, int | np.ndarray]:
    """Integers of QLayer that the config fixes (not loaded): name -> required value; the
    fixed tables' entries (moekda/tables.py) as arrays."""
    fm = formats_for(cfg)
    a, lb = fm.act_bits, fm.lut_in_bits
    out = {}
    if kind == "mla":
        # the latent goes into its RMSNorm at resid_bits; the gate's logit is a table code
        for lin in MLA_LINEARS:
            out[f"mla.{lin}.out_bits"] = fm.resid_bits if lin == "dkv" else lb if lin == "g_proj" else a
    else:
        for lin in KDA_LINEARS:
            out[f"kda.{lin}.out_bits"] = lb if lin in ("f_up", "b_proj", "g_up") else a
        for conv in KDA_CONVS:
            out[f"kda.{conv}.out_bits"] = lb
    if mixer == "moe":
        out["moe.router.out_bits"] = lb
        if cfg.model.moe_latent:
            out["moe.lat_down.out_bits"] = a
            out["moe.lat_up.out_bits"] = fm.expert_out_bits
    for name, *_ in table_fields(cfg, mixer, kind):
        out[f"{name}.in_bits"] = lb
        if name in FIXED_TABLES:
            out[f"{name}.table"] = fixed_table(cfg, name)
    for name, bits, _ in silu_fields(cfg, mixer, kind):
        out[f"{name}.out_bits"] = bits
    return out


def fixed_value_differs(value, want) -> bool:
    """Whether a model's ``value`` is not the config's ``want`` (a structural entry)."""
    value, want = np.asarray(value), np.asarray(want)
    return value.shape != want.shape or not np.array_equal(value.astype(np.int64), want)


# ---- the model stack (issue 14) ---------------------------------------------------------

def head_param_fields(cfg) -> list[ParamField]:
    """The head's run-time parameters (QHead; the embedding and LM head are matrices)."""
    fm = formats_for(cfg)
    dw = derived_widths(cfg)
    mb = fm.mult_bits
    return [_f("head.final_norm.eps_int", (), dw["ss_rmsnorm"], False, "final RMSNorm: eps in sum-of-squares units"),
            _f("head.final_norm.m", (), mb, False, "final RMSNorm: output multiplier"),
            _f("head.final_norm.s", (), 5, False, "final RMSNorm: output shift"),
            _f("head.norm_w", (cfg.model.d_model,), fm.resid_bits, True,
               "final-norm weight per channel (identity 1 << norm_w_shift when untied)"),
            _f("head.norm_w_shift", (), 5, False, "fn = sat8(rs(fn_unit * norm_w, norm_w_shift))", 0, 30),
            _f("head.head_m", (), mb, False, "LM head requantisation: multiplier"),
            _f("head.head_s", (), SHIFT_BITS, False, "LM head requantisation: shift")]


def attn_res_param_fields(cfg) -> list[ParamField]:
    """Attention Residuals' run-time parameters (QAttnRes, model/int_attn_res.py; model.attn_res
    "full" or "block"), read by the depth unit (hw/attnres/): each mix's logit requantiser (one
    per query: sub-layers 1 .. N, then the output), the keys' normaliser and x_0's requantiser.
    The queries are a matrix (hw/image/memory_map.py ``attn_res.queries``); the sub-layers'
    output requantisers (out_m, out_s) are the layers' residual adds (``attn_res_residuals``)."""
    fm = formats_for(cfg)
    mb, n = fm.mult_bits, 2 * cfg.model.n_layers + 1
    return [_f("attn_res.u_m", (n,), mb, False, "logit w_n . key_i -> u (base 2): multiplier"),
            _f("attn_res.u_s", (n,), SHIFT_BITS, False, "logit w_n . key_i -> u (base 2): shift"),
            _f("attn_res.key_norm.eps_int", (), derived_widths(cfg)["ss_rmsnorm"], False,
               "key normaliser: eps in sum-of-squares units"),
            _f("attn_res.key_norm.m", (), mb, False, "key normaliser: output multiplier"),
            _f("attn_res.key_norm.s", (), 5, False, "key normaliser: output shift"),
            _f("attn_res.emb_m", (), mb, False, "x_0 -> the depth scale: multiplier"),
            _f("attn_res.emb_s", (), SHIFT_BITS, False, "x_0 -> the depth scale: shift")]


def model_block_fields(cfg) -> list[ParamField]:
    """The fields of a model's block after the layers' (prefix "", LOADed into the head's bank):
    the head's (with a vocabulary), then Attention Residuals' (model.attn_res != "none")."""
    out = head_param_fields(cfg) if cfg.model.vocab else []
    if cfg.model.attn_res != "none":
        out += attn_res_param_fields(cfg)
    return out


def _sublayer_residual(n: int) -> str:
    """Sub-layer n's (0-based) residual add: layer n // 2's res1 (token mixer) or res2."""
    return f"layers.{n // 2}.res{n % 2 + 1}"


def attn_res_residuals(cfg, flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """With Attention Residuals the layers' residual adds are not used as adds: sub-layer n's
    output v_n = requantize(out, out_m[n], out_s[n], resid_bits) is exactly what the chip's
    residual add (hw/arith/residual.py, sat(rs(a m_a + b m_b, s))) gives with m_a = 0, so the
    image keeps out_m, out_s once, as layer l's ``res1`` (sub-layer 2l + 1) and ``res2``
    (2l + 2) with m_a = 0.  Returns those residual-add values from ``flat``'s
    ``attn_res.out_m|out_s``."""
    out_m, out_s = (np.asarray(flat[f"attn_res.{k}"]) for k in ("out_m", "out_s"))
    out = {}
    for n in range(2 * cfg.model.n_layers):
        res = _sublayer_residual(n)
        out.update({f"{res}.m_a": np.int64(0), f"{res}.m_b": np.int64(out_m[n]), f"{res}.s": np.int64(out_s[n])})
    return out


def attn_res_outputs(cfg, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of ``attn_res_residuals``: ``attn_res.out_m|out_s`` from the residual adds."""
    res = [_sublayer_residual(n) for n in range(2 * cfg.model.n_layers)]
    return {f"attn_res.out_{k}": np.array([int(params[f"{r}.{f}"]) for r in res], dtype=np.int64)
            for k, f in (("m", "m_b"), ("s", "s"))}


def layer_pairs(cfg) -> list[tuple[str, str]]:
    """The (token mixer kind, channel mixer) pairs the config's layers use, sorted."""
    return sorted(set(zip(cfg.model.layers, cfg.model.mixers)))


def model_param_maps(cfg) -> list[tuple[str, "ParamMap"]]:
    """The parameter region of an image, as (name prefix, map) blocks in address order, each
    block padded to whole port beats: first, with the taps in SRAM, every KDA layer's taps
    (``tap_map``, memory "taps"); then the layer chip's one block (prefix "", its map); a model has layer 0 .. L-1 (prefix ``layers.<l>.``, the map of the layer's
    kind and mixer, ``model.layers[l]`` and ``model.mixers[l]``) and, with a vocabulary or
    Attention Residuals, the model's block (prefix "", ``model_block_fields``: ``head.*``, then
    ``attn_res.*``)."""
    # with the taps in SRAM (conv_taps_in_sram) every KDA layer's tap block comes first, in
    # layer order: the region's first ``tap_words`` beats are the tap memory's words in order
    taps = [] if not conv_taps_in_sram(cfg) else (
        [("", tap_map(cfg))] if cfg.model.is_layer_chip else
        [(f"layers.{l}.", tap_map(cfg)) for l, kind in enumerate(cfg.model.layers) if kind == "kda"])
    if cfg.model.is_layer_chip:
        return taps + [("", param_map(cfg))]
    pb = cfg.hw.weight_port_bytes
    # every layer's block has the size of the largest (kind, mixer)'s, so the chip fetches any
    # layer's block into one bank with the block's first byte at bit 0 (hw/chip/loader.py); a
    # shorter token mixer's fields are padded (param_fields), so the halves line up too
    size = layer_block_bytes(cfg)
    out = taps + [(f"layers.{l}.", ParamMap(tuple(param_fields(cfg, mx, kind)), pb, size))
           for l, (kind, mx) in enumerate(zip(cfg.model.layers, cfg.model.mixers))]
    fields = model_block_fields(cfg)
    if fields:
        out.append(("", ParamMap(tuple(fields), pb)))
    return out


def layer_block_bytes(cfg) -> int:
    """Bytes of one layer's parameter block in a model's image: the largest (kind, mixer)'s."""
    return max(param_map(cfg, mx, kind).nbytes for kind, mx in layer_pairs(cfg))


def mixer_split_bit(cfg) -> int:
    """Bit offset in a layer's block where the channel mixer's fields begin (``mlp_norm``
    first): bits [0, split) are the token mixer's half (attn_norm, kda or mla, the padding
    ``token_pad`` of a shorter kind, res1), read by the datapath's stage A only, the rest the
    channel mixer's, read by stage B only.  The same in every (kind, mixer) block
    (param_fields lists the token mixer first and pads the shorter kind's), so a model chip
    can fetch either half of a layer's block into the bank on its own (hw/chip/loader.py)."""
    splits = {param_map(cfg, mx, kind).offsets()["mlp_norm.eps_int"] for kind, mx in layer_pairs(cfg)}
    assert len(splits) == 1, "the layer kinds' blocks differ before the channel mixer"
    return splits.pop()


def fetch_halves(cfg) -> list[tuple[int, int]]:
    """(first beat within the block, beats) of each half of a layer's parameter block, the
    token mixer's then the channel mixer's: the whole beats holding bits [0, split) and
    [split, end); the beat the split falls in is in both."""
    W8 = 8 * cfg.hw.weight_port_bytes
    split, nb = mixer_split_bit(cfg), layer_block_bytes(cfg) // cfg.hw.weight_port_bytes
    return [(0, -(-split // W8)), (split // W8, nb - split // W8)]


def layer_bank_bits(cfg) -> int:
    """Bits of the chip's layer parameter bank: the fields of the largest (kind, mixer) (the
    layer chip: its whole map)."""
    return max(param_map(cfg, mx, kind).bits for kind, mx in layer_pairs(cfg))


def model_structural(cfg) -> dict[str, int]:
    """``structural`` of every layer under its prefix (the layer chip: unprefixed)."""
    if cfg.model.is_layer_chip:
        return structural(cfg)
    out = {}
    for l, (kind, mx) in enumerate(zip(cfg.model.layers, cfg.model.mixers)):
        out.update({f"layers.{l}.{k}": v for k, v in structural(cfg, mx, kind).items()})
    return out


def params_bytes(cfg) -> int:
    """Bytes of the whole parameter region (every block of ``model_param_maps``)."""
    return sum(pm.nbytes for _, pm in model_param_maps(cfg))


@dataclass(frozen=True)
class ParamMap:
    fields: tuple
    port_bytes: int
    min_bytes: int = 0       # padded to at least this many bytes (a model's layer blocks)
    memory: str = "bank"     # where LOAD puts the block: the parameter bank, or "taps" (tap_map)

    @property
    def bits(self) -> int:
        return sum(f.total_bits for f in self.fields)

    @property
    def nbytes(self) -> int:
        """The region's size in the image: whole port beats."""
        raw = max(-(-self.bits // 8), self.min_bytes)
        return -(-raw // self.port_bytes) * self.port_bytes

    @property
    def beats(self) -> int:
        return self.nbytes // self.port_bytes

    def offsets(self) -> dict[str, int]:
        """Bit offset of each field in the region."""
        out, pos = {}, 0
        for f in self.fields:
            out[f.name] = pos
            pos += f.total_bits
        return out

    def __getitem__(self, name: str) -> ParamField:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"no parameter {name!r} in the parameter map")

    def pack(self, flat: Mapping[str, np.ndarray]) -> bytes:
        """The region's bytes from ``{dotted name: integer array}``; ValueError naming the
        field when a value is missing, misshapen or outside the field's range."""
        acc, pos = 0, 0
        for f in self.fields:
            if f.pad:
                pos += f.total_bits
                continue
            if f.name not in flat:
                raise ValueError(f"parameter {f.name}: missing")
            v = np.asarray(flat[f.name])
            if v.shape != f.shape:
                raise ValueError(f"parameter {f.name}: shape {v.shape}, the config needs {f.shape}")
            if not np.issubdtype(v.dtype, np.integer):
                raise ValueError(f"parameter {f.name}: not integers ({v.dtype})")
            if v.size and (v.min() < f.lo or v.max() > f.hi):
                bad = int(v.min()) if v.min() < f.lo else int(v.max())
                raise ValueError(f"parameter {f.name} = {bad}: allowed range is {f.lo} to {f.hi} "
                                 f"({f.bits}-bit {'signed' if f.signed else 'unsigned'})")
            mask = (1 << f.bits) - 1
            for x in v.reshape(-1).tolist():
                acc |= (int(x) & mask) << pos
                pos += f.bits
        return acc.to_bytes(self.nbytes, "little")

    def unpack(self, region: bytes) -> dict[str, np.ndarray]:
        """The inverse of ``pack``: ``{dotted name: int64 array}`` (padding not included)."""
        if len(region) < -(-self.bits // 8):
            raise ValueError(f"parameter region: {len(region)} bytes, needs {-(-self.bits // 8)}")
        acc = int.from_bytes(region, "little")
        out, pos = {}, 0
        for f in self.fields:
            if f.pad:
                pos += f.total_bits
                continue
            mask, vals = (1 << f.bits) - 1, []
            for _ in range(f.count):
                x = (acc >> pos) & mask
                if f.signed and x >> (f.bits - 1):
                    x -= 1 << f.bits
                vals.append(x)
                pos += f.bits
            out[f.name] = np.array(vals, dtype=np.int64).reshape(f.shape)
        return out


def _under(name: str, prefix: str) -> bool:
    return not prefix or name == prefix or name.startswith(prefix + ".")


def param_map(cfg, mixer: str = "moe", kind: str = "kda") -> ParamMap:
    """One layer's map (the layer chip's whole parameter region; a model's layer of that
    mixer and kind, before the block padding of ``model_param_maps``)."""
    return ParamMap(tuple(param_fields(cfg, mixer, kind)), cfg.hw.weight_port_bytes)


def _fields_for(cfg, mixer: str, kind: str = "kda") -> list[ParamField]:
    return model_block_fields(cfg) if mixer == "head" else param_fields(cfg, mixer, kind)


def param_layout(cfg, prefix: str = "", mixer: str = "moe", kind: str = "kda"):
    """The Amaranth layout of the fields under ``prefix`` (``""``: all, ``"kda"``, ``"moe"``,
    ``"res1"``, ...): nested StructLayouts following the dotted names, arrays as
    ArrayLayouts, in region order, so ``Cat`` of the whole bank is the region's bits.
    A block's ``params`` port has ``param_layout(cfg, "<block>")``.  ``mixer``: the fields
    of a layer with that channel mixer ("moe", "dense"), or "head" for the model's
    block (``param_layout(cfg, "head", mixer="head")``; Attention Residuals' fields are in
    that block too: ``param_layout(cfg, "attn_res", mixer="head")``).  ``kind``: the token mixer, "kda" or
    "mla" (an MLA layer's block: ``param_layout(cfg, "mla", kind="mla")``)."""
    from amaranth import signed, unsigned
    from amaranth.lib import data

    fields = [f for f in _fields_for(cfg, mixer, kind) if _under(f.name, prefix)]
    if not fields:
        raise KeyError(f"no parameters under {prefix!r}")
    skip = len(prefix) + 1 if prefix else 0
    tree: dict = {}
    for f in fields:
        parts = f.name[skip:].split(".")
        node = tree
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        shape = signed(f.bits) if f.signed else unsigned(f.bits)
        for n in reversed(f.shape):
            shape = data.ArrayLayout(shape, n)
        node[parts[-1]] = shape

    def build(node):
        return data.StructLayout({k: build(v) if isinstance(v, dict) else v for k, v in node.items()})
    return build(tree)


def region_value(cfg, flat: Mapping[str, np.ndarray], prefix: str = "", mixer: str = "moe",
                 kind: str = "kda") -> int:
    """The bits of the fields under ``prefix`` as one integer, LSB first: the constant a
    test drives on a block's ``params`` port (the same bits LOAD puts in the bank).
    ``flat``: one layer's (or the head's) unprefixed names; ``mixer``, ``kind`` as for
    param_layout."""
    sub = ParamMap(tuple(f for f in _fields_for(cfg, mixer, kind) if _under(f.name, prefix)),
                   cfg.hw.weight_port_bytes)
    return int.from_bytes(sub.pack(flat), "little")


def sizes(cfg) -> dict[str, int]:
    """Bits per top-level block, for docs and reports."""
    out: dict[str, int] = {}
    for f in param_fields(cfg):
        key = f.name.split(".")[0]
        out[key] = out.get(key, 0) + f.total_bits
    return out
