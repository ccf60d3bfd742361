"""Which kept value each step of Attention Residuals touches (sim/models/int_attn_res.py):
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
