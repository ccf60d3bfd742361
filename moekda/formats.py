"""The number formats of the integer layer, derived once from Config.formats and Config.model.

Read by the numpy integer model (model/int_*.py), the quantiser and the
RTL generator (hw/).  Nothing else states a width.  The *fixed* choices below
(fractional bits of the sigmoid outputs, the decay, the routing weights, the
rsqrt constants) were picked by the accuracy measurement of docs/numerics.md;
*calibrated* quantities (tensor scales, fractional-bit positions of k, q, v and
the state) live in the quantised parameters (model/quantize.py), because
they depend on the weights and the data, not on the hardware.

Notation: Qa.b signed = a integer bits (incl. sign) and b fractional bits;
"U0.b" = unsigned fraction with b fractional bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moekda.config import Config
from moekda.numerics import clog2, rsqrt_seed_table   # noqa: F401 - clog2 is read from here by the blocks


@dataclass(frozen=True)
class Formats:
    # --- from Config.formats ---
    act_bits: int            # int8 activations, signed
    weight_bits: int         # int8 weights, signed
    acc_bits: int            # matvec accumulator, signed
    mult_bits: int           # requantisation multiplier, unsigned
    state_bits: int          # KDA state entry, signed
    lut_in_bits: int         # signed code indexing every nonlinearity table

    # --- fixed choices (see module doc) ---
    unit_frac: int = 8       # beta and output gate: sigmoid as U0.8, values 0..256 (9 bits, 256 = 1.0)
    score_frac: int = 15     # router score: sigmoid as U0.15, values 0..2**15 (16 bits)
    alpha_frac: int = 16     # decay alpha = exp(g): U0.16, values 1..2**16-1 (16 bits)
    qkv_bits: int = 16      # SiLU table outputs q, k, v (before the L2 norms / into the state): signed
    qk_bits: int = 12       # L2-normalised q and k, the delta rule's multiplier operands: signed (12: numerics.md)
    hid_bits: int = 8       # SwiGLU hidden vector into W_down (> 8 means several engine passes): signed
    o_bits: int = 16         # KDA read o = S^T q, requantised by a static shift before its RMSNorm
    resid_bits: int = 16     # residual stream x, h, y (layer input and output) and the MoE output: signed
    expert_out_bits: int = 16  # expert outputs (W_down requantised), which only feed the weighted sum
    router_bias_bits: int = 19  # selection bias in score units (U0.15 scale), signed: |bias| < 8
    wn_frac: int = 12        # normalised routing weight w / sum(w): U0.12, values 0..2**12
    rs_frac: int = 8         # routed_scaling as unsigned fixed point U.8
    rsqrt_norm_bits: int = 16   # rsqrt input normalised into [2**14, 2**16) by even shifts
    rsqrt_frac: int = 14        # rsqrt mantissa y: Q2.14 unsigned, value in (1, 2]
    rsqrt_seed_bits: int = 5    # seed LUT index = top 5 bits of the normalised input: 24 entries
    rsqrt_newton_steps: int = 2
    # Gated MLA's online softmax (issue 15; model/int_mla.py): scores in base 2
    mla_exp_frac: int = 8       # u = score * log2(e) with 8 fractional bits; the 2**-f table has 256 entries
    mla_u_bits: int = 24        # u, signed, saturating (|score| < 2**15 / log2 e, far beyond any softmax's use)
    mla_p_frac: int = 15        # softmax weight p = 2**-(n + f / 256) as U1.15 (32768 = 1.0)
    mla_context_bits: int = 16  # cached tokens per sequence: up to 2**16 (the sums' widths)
    # MX formats (issue 48; moekda/mx.py, docs/numerics.md section 11)
    mx_block: int = 32          # elements sharing one E8M0 scale, along the input dimension
    mx_scale_range: int = 8     # a matrix's block scales span at most 2**8: byte >= max byte - 8
    mx_in_bits: int = 16        # the source of an MXFP8 expert input (rounded to E4M3 blocks in its units)

    @property
    def lut_size(self) -> int:
        return 1 << self.lut_in_bits

    @property
    def mla_exp2_table(self) -> np.ndarray:
        """2**-(f / 2**mla_exp_frac) for f = 0 .. 2**mla_exp_frac - 1 as U1.mla_p_frac: the
        fractional part of the online softmax's exponent (a ROM; the integer part is a shift)."""
        f = np.arange(1 << self.mla_exp_frac)
        return np.floor(2.0 ** (self.mla_p_frac - f / (1 << self.mla_exp_frac)) + 0.5).astype(np.int64)

    @property
    def rsqrt_seed(self) -> np.ndarray:
        return rsqrt_seed_table(self.rsqrt_norm_bits, self.rsqrt_seed_bits, self.rsqrt_frac)


def formats_for(cfg: Config) -> Formats:
    f = cfg.formats
    return Formats(act_bits=f.act_bits, weight_bits=f.weight_bits, acc_bits=f.acc_bits,
                   mult_bits=f.requant_mult_bits, state_bits=f.state_bits, lut_in_bits=f.lut_in_bits)


def derived_widths(cfg: Config) -> dict[str, int]:
    """Widths of the intermediate integers of one layer, each the exact worst case.

    The hardware sizes its registers from these; the integer model asserts them.
    """
    fm, m = formats_for(cfg), cfg.model
    a, w = fm.act_bits, fm.weight_bits
    prod = a + w - 1                                   # |int8 * int8| <= 2**14
    d, dk, K, k = m.d_model, m.head_dim, m.conv_kernel, m.top_k
    return {
        # sum of squares of int8 (RMSNorm over d, L2 norm over dk), of o_bits (o norm over dv)
        "ss_rmsnorm": 2 * (fm.resid_bits - 1) + clog2(d + 1) + 1,
        "ss_l2norm": 2 * (fm.qkv_bits - 1) + clog2(dk + 1) + 1,
        "ss_onorm": 2 * (fm.o_bits - 1) + clog2(dk + 1) + 1,
        "conv_acc": prod + clog2(K) + 1,
        # delta rule: S*alpha, k.S', k*u, q.S
        "state_x_alpha": fm.state_bits + fm.alpha_frac + 1,
        "kS_acc": fm.state_bits + fm.qk_bits - 1 + clog2(dk) + 1,
        "u_pre": fm.state_bits + 1 + fm.unit_frac + 1,   # beta (9 bits) * (v - kS) (state_bits+1)
        "ku_prod": fm.qk_bits + fm.state_bits - 1,
        "o_acc": fm.state_bits + fm.qk_bits - 1 + clog2(dk) + 1,
        # MoE routing
        "router_choice": fm.router_bias_bits + 1,
        "div_num": fm.score_frac + 1 + fm.wn_frac,
        "div_den": fm.score_frac + 1 + clog2(k + 1),
        "rs_int": fm.rs_frac + int(np.ceil(np.log2(m.routed_scaling + 1))) + 1,
        "route_weight": fm.wn_frac + int(np.ceil(np.log2(m.routed_scaling + 1))) + 1,
        "moe_combine_acc": fm.expert_out_bits + fm.wn_frac + int(np.ceil(np.log2(m.routed_scaling + 1)))
        + clog2(k + m.n_shared + 1),
        # a dense mixer (model.mixers) on the same accumulators: C chunk outputs << wn_frac,
        # wider than the MoE's only for many chunks (C > top_k + n_shared)
        "dense_combine_acc": fm.expert_out_bits + fm.wn_frac + clog2(m.dense_chunks + 1),
        "swiglu_prod": prod + 1,
        # Gated MLA's online softmax over at most 2**mla_context_bits cached tokens: the sum of
        # the weights p (U1.p_frac, at most 1.0 each) and the weighted sum of int8 latents
        "mla_sum": fm.mla_p_frac + 1 + fm.mla_context_bits,
        "mla_acc": fm.mla_p_frac + 1 + fm.act_bits + fm.mla_context_bits,
        # Attention Residuals' mix (the same online softmax) over at most 2 L + 1 kept values of
        # resid_bits
        "attn_res_sum": fm.mla_p_frac + 1 + clog2(2 * m.n_layers + 2),
        "attn_res_acc": fm.mla_p_frac + 1 + fm.resid_bits + clog2(2 * m.n_layers + 2),
        "residual_acc": fm.resid_bits + fm.mult_bits + 2,
        **_mx_widths(cfg, fm),
    }


def _mx_widths(cfg: Config, fm: Formats) -> dict[str, int]:
    """The MXFP4 engine's accumulators (moekda.mx.mx_block_dot) where the config uses it: the
    widest row of an expert (d_model or the latent, d_ff) against int8 or MXFP8 (mx_in_bits)."""
    from moekda.mx import mx_widths
    f, m = cfg.formats, cfg.model
    if "mxfp4" not in (f.routed_expert_weights, f.shared_expert_weights):
        return {}
    n = max(m.d_model, m.d_ff, m.d_ff_dense)
    in_bits = fm.mx_in_bits if f.expert_inputs == "mxfp8_e4m3" else fm.act_bits
    return {"mx_acc": mx_widths(n, max(in_bits, fm.hid_bits), fm.mx_scale_range, fm.mx_block)["mx_acc"]}
