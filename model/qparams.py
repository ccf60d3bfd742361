"""Integer parameters of one layer: what the hardware's ROMs, weight memory and
constant registers hold.  Produced by model/quantize.py, consumed by the
integer model (model/int_*.py), the test-vector export and hw/.

Every field is an int or an integer numpy array (int64 dtype holding values of
the stated width), except ``QLayer.scales`` (the real value of one LSB of each
integer tensor), which only the reports and the dequantisation use.
No ``from __future__ import annotations`` here: ``from_flat`` reads the field
types to rebuild the nesting.
"""
import dataclasses
from dataclasses import dataclass, field, fields
import typing
from typing import Optional

import numpy as np

from moekda.config import Config
from moekda.formats import Formats, formats_for


@dataclass
class QLinear:
    """y = requantize(W @ x + bias, m, s, out_bits): one matrix on the shared engine.
    ``out_bits`` is act_bits for an int8 result or lut_in_bits for a table code."""
    w: np.ndarray            # (out, in) int8 values; for a short conv (channels, K)
    m: int
    s: int
    out_bits: int
    bias: Optional[np.ndarray] = None   # (out,) added to the int32 accumulator, or None


@dataclass
class QNorm:
    """y = requantize_rows(x, x * K / sqrt(sum(x^2) + eps_int)) with K = m / 2**s (RMSNorm, L2 norm)."""
    eps_int: int
    m: int
    s: int


@dataclass
class QLut:
    """A nonlinearity table: out = table[code - code_min], code signed ``in_bits``."""
    table: np.ndarray
    in_bits: int


@dataclass
class QSilu:
    """SiLU as x * sigmoid(x) of a code c at the model's scale (moekda/tables.py):
    t = requantize(c, t_m, t_s, silu_sigmoid_in_bits), the sigmoid's input in the config's
    format; out = requantize(c * SILU_SIGMOID[t], m, s, out_bits)."""
    t_m: int
    t_s: int
    m: int
    s: int
    out_bits: int


@dataclass
class QKDA:
    q_proj: QLinear
    k_proj: QLinear
    v_proj: QLinear
    conv_q: QLinear          # w (H*dk, K); out = table code
    conv_k: QLinear
    conv_v: QLinear
    silu_q: QSilu            # -> qkv_bits, any scale (L2 normalised next)
    silu_k: QSilu
    silu_v: QSilu            # -> qkv_bits at 2**-f_v
    q_norm: QNorm            # -> int8 at 2**-f_q (unit vector, the d_k**-0.5 cancels in the o norm)
    k_norm: QNorm            # -> int8 at 2**-f_k
    f_down: QLinear
    f_up: QLinear            # A folded into rows, A*dt_bias (minus the code centre) as bias
    alpha: QLut              # code -> exp(lb*sigmoid(z)) as U0.alpha_frac
    b_proj: QLinear
    beta: QLut               # code -> sigmoid as U0.unit_frac
    g_down: QLinear
    g_up: QLinear
    gate: QLut               # code -> sigmoid as U0.unit_frac
    o_norm: QNorm            # o (o_bits) -> int8
    o_proj: QLinear          # o_norm weight folded into the columns
    f_q: int                 # fractional bits of q, k, v and of the state S
    f_k: int
    f_v: int
    f_s: int
    o_shift: int             # o16 = sat_{o_bits}(round_shift(q . S, o_shift))


@dataclass
class QExperts:
    """A bank of SwiGLU experts (routed or shared).  Per-expert (m, s): every expert
    matrix has its own weight scale and every expert its own up / hidden scales
    (the SiLU table's input and output scales and the expert output scale are
    common, so one table serves all experts and the outputs can be summed)."""
    gate_w: np.ndarray   # (n, d_ff, d)
    gate_m: np.ndarray   # (n,)
    gate_s: np.ndarray
    up_w: np.ndarray
    up_m: np.ndarray
    up_s: np.ndarray
    down_w: np.ndarray   # (n, d, d_ff)
    down_m: np.ndarray   # for the hidden at the product's scale; the per-token exponent is subtracted
    down_s: np.ndarray
    # SiTU-GLU (model.glu = "situ", QMoE/QDense.silu None): the up code's requantisation to the
    # CAP table's input t (moekda/tables.py), per expert as the up code's scale is; None for SwiGLU
    cap_t_m: Optional[np.ndarray] = None
    cap_t_s: Optional[np.ndarray] = None
    # MXFP4 (formats.*_expert_weights = "mxfp4", issue 48; moekda/mx.py): the *_w arrays hold
    # E2M1 elements in half units (|w| <= 12), *_sb the E8M0 scale byte of every block of 32
    # along the input (n, rows, blocks), *_sf the matrix's floor byte (n,): block b's partial
    # sum is shifted left by sb - sf (0..Formats.mx_scale_range), and (m, s) carry
    # 2^-1 * 2^(sf - 127).  None: int8 as above.
    gate_sb: Optional[np.ndarray] = None
    gate_sf: Optional[np.ndarray] = None
    up_sb: Optional[np.ndarray] = None
    up_sf: Optional[np.ndarray] = None
    down_sb: Optional[np.ndarray] = None
    down_sf: Optional[np.ndarray] = None


@dataclass
class QMoE:
    router: QLinear          # -> table code
    score: QLut              # code -> sigmoid as U0.score_frac
    bias: np.ndarray         # (E,) selection bias in score units, router_bias_bits signed
    silu: Optional[QSilu]    # expert gate code -> int8 at the code's scale (shared by all experts); None:
                             # SiTU-GLU (model.glu = "situ"), whose gate code indexes the config's SITU table
    routed: QExperts
    shared: QExperts
    rs: int                  # routed_scaling as U.rs_frac
    comb_m: int              # sum_i w_i e_i (+ shared << wn_frac) -> resid_bits
    comb_s: int
    # LatentMoE (model.moe_latent > 0; int_moe.py): the routed experts work on z = lat_down(hn)
    # (int8, width l); their weighted sum is requantised by (lat_m, lat_s) to int8 and
    # lat_up brings it back to width d at the experts' common output scale
    lat_down: Optional[QLinear] = None
    lat_up: Optional[QLinear] = None
    lat_m: Optional[int] = None
    lat_s: Optional[int] = None
    # formats.expert_inputs = "mxfp8_e4m3" (issue 48): the routed experts' input is a 16-bit
    # vector rounded to MXFP8 (moekda.mx.mx8_round_int): the plain MoE's is h normalised by
    # mx_norm to 16 bits (the MLP norm's rsqrt, its own K), the LatentMoE's is lat_down's
    # output, then 16 bits wide
    mx_norm: Optional[QNorm] = None
    # K3's exit norm (model.latent_exit_norm, issue 47 difference 4): (lat_m, lat_s) then take the
    # routed latent sum to resid_bits, and lat_norm (int_normalize, the layers' RMSNorm) to the int8
    # unit vector lat_up reads; the norm's weight is folded into lat_up's columns
    lat_norm: Optional[QNorm] = None


@dataclass
class QDense:
    """A dense channel mixer as the MoE unit's shared-expert path runs it: the SwiGLU of width
    d_ff_dense cut into C = d_ff_dense / d_ff chunks of width d_ff (``params.dense_chunks``),
    each an expert of ``chunks`` (its own (m, s), like a shared expert); one SiLU table and
    one common chunk-output scale, so

      acc = sum_c (e_c(hn) << wn_frac)                 as the MoE's shared experts
      out = requantize(acc, comb_m, comb_s, resid_bits)

    (no router, no routed experts).  ``silu`` None: SiTU-GLU chunks (model.glu = "situ")."""
    silu: Optional[QSilu]
    chunks: QExperts
    comb_m: int
    comb_s: int


@dataclass
class QMLA:
    """A Gated MLA token mixer (issue 15; model/int_mla.py, formats in docs/numerics.md).
    The cache holds c_unit, the int8 latent after its RMSNorm without the norm's weight:
    the weight is folded into the columns of uk and uv."""
    q_proj: QLinear          # (H*dh, d) -> int8
    uk: QLinear              # (H, r, dh): qa_h = W_uk,h^T q_h, 1/sqrt(dh) and kv_norm_w folded; -> int8
    dkv: QLinear             # (r, d) -> resid_bits, into the latent's RMSNorm
    kv_norm: QNorm           # -> c_unit int8
    u_m: int                 # score accumulator qa_h . c_j -> u = score * log2(e) * 2**mla_exp_frac
    u_s: int
    uv: QLinear              # (H, dh, r): o_h = W_uv,h ctx_h, kv_norm_w folded; -> int8
    g_proj: QLinear          # (H*dh, d) -> table code
    gate: QLut               # code -> sigmoid as U0.unit_frac
    o_proj: QLinear          # (d, H*dh) -> int8


@dataclass
class QResidual:
    """y = sat_resid(round_shift(a * m_a + b * m_b, s)): residual a (resid_bits) plus a
    branch output b (int8 KDA, resid_bits MoE), each at its own scale."""
    m_a: int
    m_b: int
    s: int


@dataclass
class QLayer:
    """One layer.  Its token mixer is ``kda`` or (issue 15) ``mla``, its channel mixer ``moe``
    or (a dense layer) ``dense``; the ones it lacks are None."""
    attn_norm: QNorm
    kda: Optional[QKDA]
    res1: QResidual
    mlp_norm: QNorm
    moe: Optional[QMoE]
    res2: QResidual
    scales: dict = field(default_factory=dict)   # tensor name -> real value of one LSB
    dense: Optional[QDense] = None
    mla: Optional[QMLA] = None

    @property
    def mixer(self) -> str:
        return "dense" if self.dense is not None else "moe"

    @property
    def kind(self) -> str:
        """The token mixer: "kda" or "mla" (model.layers)."""
        return "mla" if self.mla is not None else "kda"

    @property
    def mix_out(self) -> str:
        """The traced and scale name of the token mixer's output."""
        return f"{self.kind}_out"

    def to_flat(self) -> dict:
        """Flat {dotted name: array} view; ints become 0-d int64 arrays, scales 'scales.<name>'."""
        out = {}

        def walk(obj, prefix):
            for f in fields(obj):
                v = getattr(obj, f.name)
                name = f"{prefix}{f.name}"
                if v is None:
                    continue
                if dataclasses.is_dataclass(v):
                    walk(v, name + ".")
                elif isinstance(v, dict):
                    for k, x in v.items():
                        out[f"{name}.{k}"] = np.float64(x)
                else:
                    out[name] = np.asarray(v, dtype=np.int64)
        walk(self, "")
        return out

    @classmethod
    def from_flat(cls, flat: dict, prefix: str = "") -> "QLayer":
        """From flat names (``prefix`` before each: ``layers.2.`` in a model).  An optional
        part (the mixer not used) is None when none of its names is there."""
        return _build(cls, flat, prefix)


@dataclass
class QHead:
    """Embedding, final norm and LM head of a model with a vocabulary (formats: numerics.md,
    "The model stack").

      x_0    = emb[token]                                       int8 entry as a resid_bits value (scale s_emb)
      fn_u   = int_rmsnorm(x_L, final_norm)                     int8, unit RMS
      fn     = sat8(round_shift(fn_u * norm_w, norm_w_shift))   int8; norm_w resid_bits signed
      logits = requantize(W @ fn, head_m, head_s, resid_bits)   W = lm_head, or emb when tied
      next   = the lowest index of the largest logit

    Untied, the norm weight is folded into lm_head's columns and norm_w is the identity
    (every entry 1 << norm_w_shift); tied, the table is shared, so the weight is applied here."""
    emb: np.ndarray                      # (V, d) int8
    final_norm: QNorm
    norm_w: np.ndarray                   # (d,) signed resid_bits
    norm_w_shift: int
    head_m: int
    head_s: int
    lm_head: Optional[np.ndarray] = None  # (V, d) int8; None: tied, the head is emb


@dataclass
class QAttnRes:
    """Attention Residuals of a stack (issue 15; model/int_attn_res.py, formats in
    docs/numerics.md section 9): every value a sub-layer's input mixes is kept as resid_bits
    at one depth scale s_v."""
    queries: np.ndarray      # (N + 1, d) int8 pseudo-queries: sub-layers 1..N, then the output
    u_m: np.ndarray          # (N + 1,) logit accumulator w_n . key_i -> u (base 2, mla_exp_frac)
    u_s: np.ndarray
    key_norm: QNorm          # a kept value (resid_bits at s_v) -> its int8 key (unit RMS)
    emb_m: int               # x_0 (the embedding entry) -> s_v
    emb_s: int
    out_m: np.ndarray        # (N,) sub-layer n's output (its own scale) -> s_v
    out_s: np.ndarray


@dataclass
class QModel:
    """A quantised model: one QLayer per layer (layer l's output scale is layer l+1's input
    scale: the integer y is the next layer's x, as it is), and the head (None when vocab = 0).
    Flat names: ``layers.<l>.<QLayer name>``, ``head.<name>``, ``scales.<name>``."""
    layers: list
    head: Optional[QHead] = None
    scales: dict = field(default_factory=dict)   # emb, fn_unit, fn, logits (AttnRes: depth)
    attn_res: Optional[QAttnRes] = None          # model.attn_res != "none": the layers' residual adds unused

    def to_flat(self) -> dict:
        out = {}
        for l, q in enumerate(self.layers):
            out.update({f"layers.{l}.{k}": v for k, v in q.to_flat().items()})
        if self.attn_res is not None:
            for f in fields(self.attn_res):
                v = getattr(self.attn_res, f.name)
                if dataclasses.is_dataclass(v):
                    out.update({f"attn_res.{f.name}.{g.name}": np.asarray(getattr(v, g.name), np.int64)
                                for g in fields(v)})
                else:
                    out[f"attn_res.{f.name}"] = np.asarray(v, dtype=np.int64)
        if self.head is not None:
            for f in fields(self.head):
                v = getattr(self.head, f.name)
                if dataclasses.is_dataclass(v):
                    out.update({f"head.{f.name}.{g.name}": np.asarray(getattr(v, g.name), np.int64) for g in fields(v)})
                elif v is not None:
                    out[f"head.{f.name}"] = np.asarray(v, dtype=np.int64)
        out.update({f"scales.{k}": np.float64(v) for k, v in self.scales.items()})
        return out

    @classmethod
    def from_flat(cls, flat: dict, n_layers: int) -> "QModel":
        layers = [QLayer.from_flat(flat, f"layers.{l}.") for l in range(n_layers)]
        head = None
        if any(k.startswith("head.") for k in flat):
            head = _build(QHead, flat, "head.")
        scales = {k[len("scales."):]: float(v) for k, v in flat.items() if k.startswith("scales.")}
        attn_res = _build(QAttnRes, flat, "attn_res.") if any(k.startswith("attn_res.") for k in flat) else None
        return cls(layers=layers, head=head, scales=scales, attn_res=attn_res)


def _build(kind, flat: dict, prefix: str):
    """A dataclass from flat names: ints, int arrays, optional arrays (None when absent), nested
    dataclasses, optional nested ones (None when none of their names is there) and float dicts."""
    kw = {}
    for f in fields(kind):
        name = f"{prefix}{f.name}"
        t = f.type
        opt = [a for a in typing.get_args(t) if dataclasses.is_dataclass(a)]
        if opt:
            has = any(k.startswith(name + ".") for k in flat)
            kw[f.name] = _build(opt[0], flat, name + ".") if has else None
        elif dataclasses.is_dataclass(t):
            kw[f.name] = _build(t, flat, name + ".")
        elif t is dict:
            kw[f.name] = {k[len(name) + 1:]: float(v) for k, v in flat.items() if k.startswith(name + ".")}
        elif name not in flat:
            if f.default is dataclasses.MISSING:
                raise KeyError(f"integer parameters: missing {name}")
            kw[f.name] = f.default
        else:
            v = np.asarray(flat[name])
            kw[f.name] = int(v) if t in (int, Optional[int]) else v.astype(np.int64)
    return kind(**kw)
