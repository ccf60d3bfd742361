"""Which kept value each step of Attention Residuals touches (model/int_attn_res.py):
plain integers of the config, shared by the depth unit (hw/attnres/unit.py), its bench and
the float model's buffer count.

After n sub-layer outputs (n = 0 .. N, N = 2 n_layers) a token's kept values are, in the
order the mix sees them:

  full   v_0, v_1 .. v_n                                   n + 1 values
  block  v_0, the finished blocks' sums, the running partial   1 + ceil(n / block)

The partial sits where its block's sum will be kept, so output n + 1 goes into index
``add_index(n)``: full n + 1, block 1 + n // block; in block mode it is added to what is
there unless it starts a block (``adds_to_partial``).
"""
from __future__ import annotations


def kept_vectors(mode: str, n_sublayers: int, block: int = 2) -> int:
    """The most vectors of d_model a token holds on its way down the stack (the buffer per
    sequence): the plain residual one, full AttnRes N + 1 (the output's mix sees all of
    them), block AttnRes v_0, the finished summaries and one partial sum."""
    if mode == "none":
        return 1
    if mode == "full":
        return n_sublayers + 1
    return 1 + -(-n_sublayers // block)


def sublayers(cfg) -> int:
    return 2 * cfg.model.n_layers


def kept_count(cfg, n: int) -> int:
    """Values the mix after n outputs sees."""
    m = cfg.model
    return n + 1 if m.attn_res == "full" else 1 + -(-n // m.attn_res_block)


def add_index(cfg, n: int) -> int:
    """The index output n + 1 is kept at (n outputs before it)."""
    m = cfg.model
    return n + 1 if m.attn_res == "full" else 1 + n // m.attn_res_block


def adds_to_partial(cfg, n: int) -> bool:
    """Block AttnRes: output n + 1 is added to its block's partial (it does not start one)."""
    m = cfg.model
    return m.attn_res == "block" and n % m.attn_res_block != 0


# ---- the depth unit's work per token (one place: the chip's MACS counters, the bench's roofline)

def scored_per_token(cfg) -> int:
    """Kept values a token's mixes go over: the mixes n = 0 .. N (N sub-layer inputs and the
    stack's output) each score and mix ``kept_count(n)`` of them."""
    return sum(kept_count(cfg, n) for n in range(sublayers(cfg) + 1))


def depth_macs_per_token(cfg) -> int:
    """The depth unit's multiply-adds per token: a mix scores each kept key against its query
    (d each, on the unit's engine) and sums as many values weighted by their softmax weights
    (d each, in the softmax's lanes), as an MLA layer's scores and weighted sum
    (studies/context.py attention_macs).  0 without Attention Residuals."""
    if cfg.model.attn_res == "none":
        return 0
    return 2 * cfg.model.d_model * scored_per_token(cfg)


def depth_engine_beats_per_token(cfg) -> int:
    """Beats the depth unit's matrix-vector engine takes per token (the chip's MACS counter
    counts hw.lanes a beat): a score is one d-long key in ceil(d / lanes) beats."""
    if cfg.model.attn_res == "none":
        return 0
    return scored_per_token(cfg) * -(-cfg.model.d_model // cfg.hw.lanes)


def depth_query_bytes_per_token(cfg) -> int:
    """Weight-port bytes of a token's query rows: one row of ``attn_res.queries`` per mix (the
    N sub-layer inputs and the stack's output), at the memory map's padded row stride.  0
    without Attention Residuals."""
    if cfg.model.attn_res == "none":
        return 0
    from hw.stream.weight_port import padded_row_bytes
    return (sublayers(cfg) + 1) * padded_row_bytes(cfg.model.d_model, cfg.hw.weight_port_bytes)


def depth_cycles_per_token(cfg) -> int:
    """The depth unit's bound per token (it does one job at a time, for every slot): each of
    the N + 1 values a token keeps (START, ADDs) passes the residual add once and the
    normaliser twice (sum of squares, then the scaling), an element a cycle: 3 d; each score
    takes its engine beats.  The unit's fixed latencies (the rsqrt, the query read, the
    softmax's divider) are not in it: a rate bound, as the port's and the lanes'."""
    if cfg.model.attn_res == "none":
        return 0
    return (sublayers(cfg) + 1) * 3 * cfg.model.d_model + depth_engine_beats_per_token(cfg)
