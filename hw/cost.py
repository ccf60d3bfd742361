"""The chip's cost model: what a token costs in MACs, weight bytes and cycles, from the
config alone (no simulation, no synthesis).  The one copy of the roofline that the
benches, `moekda bench`, the sweep and the context study read.

MACs per token come from hw.chip.layer.macs_per_token / hw.chip.model.model_macs_per_token
(the chip's MACS counter, counted from the engines' beats, equals them plus the padding
lanes); weight bytes per token from the hw.image.memory_map regions, padding included:
what the port really fetches.  The roofline bound of one token is
max(MACs / lanes, bytes / port bytes) cycles (and the KDA state lanes and the depth unit
when they are slower): the MAC lanes and the weight port cannot go faster, whatever the
control does.  Utilisation is bound / measured (1.0 = at the roofline).
"""
from __future__ import annotations

from dataclasses import dataclass

from moekda.config import Config


@dataclass(frozen=True)
class Traffic:
    macs: int                # weight MACs per token (what the MAC lanes must do)
    weight_bytes: int        # bytes per token with top_k routed experts
    dense_bytes: int         # bytes per token if all routed experts ran (the dense equivalent)
    lanes: int
    port_bytes: int
    state_cycles: float = 0.0   # the KDA state update and read: every layer's H d_k d_v entries,
                                # read and written in two passes, hw.state_lanes a cycle
    depth_macs: int = 0         # of ``macs``, the Attention Residuals depth unit's (its own engine
                                # and softmax lanes, not the shared ones)
    depth_cycles: float = 0.0   # the depth unit's bound (hw/attnres/kept.py depth_cycles_per_token)

    @property
    def mac_cycles(self) -> float:
        """The shared MAC lanes' cycles: every MAC but the depth unit's."""
        return (self.macs - self.depth_macs) / self.lanes

    @property
    def port_cycles(self) -> float:
        return self.weight_bytes / self.port_bytes

    @property
    def bound(self) -> float:
        """Roofline cycles per token: the slowest resource (MAC lanes, weight port, state lanes,
        the depth unit, which does one job at a time for every slot)."""
        return max(roofline_cycles(self.macs - self.depth_macs, self.weight_bytes, self.lanes, self.port_bytes),
                   self.state_cycles, self.depth_cycles)

    @property
    def bound_by(self) -> str:
        worst = max(self.port_cycles, self.mac_cycles, self.state_cycles, self.depth_cycles)
        return ("weight port" if worst == self.port_cycles else
                "MAC lanes" if worst == self.mac_cycles else
                "KDA state lanes" if worst == self.state_cycles else "depth unit")


def roofline_cycles(macs: float, weight_bytes: float, lanes: int, port_bytes: int) -> float:
    if lanes < 1 or port_bytes < 1:
        raise ValueError("lanes and port_bytes must be at least 1")
    return max(macs / lanes, weight_bytes / port_bytes)


def utilisation(bound: float, measured: float) -> float:
    """Fraction of the roofline reached: bound / measured cycles per token."""
    if measured <= 0:
        raise ValueError("measured cycles per token must be positive")
    return bound / measured


def traffic(cfg: Config) -> Traffic:
    from hw.chip.layer import macs_per_token
    from hw.image.memory_map import memory_map, moe_token_regions
    from moekda.config import require_chip_model
    # the chip's bytes and MACs (kda layers): the memory map alone holds mla layers too
    require_chip_model(cfg)
    mm = memory_map(cfg)
    m = cfg.model
    if not m.is_layer_chip:
        return model_traffic(cfg)
    kda = sum(r.nbytes for name, r in mm.regions.items() if name.startswith("kda."))
    moe = sum(mm[n].nbytes for n in moe_token_regions(cfg))
    dense = sum(mm[n].nbytes for n in moe_token_regions(cfg, routed=m.n_experts))
    return Traffic(macs=macs_per_token(cfg), weight_bytes=kda + moe, dense_bytes=kda + dense,
                   lanes=cfg.hw.lanes, port_bytes=cfg.hw.weight_port_bytes, state_cycles=state_cycles(cfg))


def state_cycles(cfg: Config) -> float:
    """The KDA state's bound per token: per KDA layer (an MLA layer has no state), H x d_k x
    d_v entries read and written in the delta rule's two passes (hw/kda/delta.py),
    ``hw.state_lanes`` entries a cycle."""
    from hw.image.memory_map import layer_count, layer_kind
    m = cfg.model
    kda = sum(layer_kind(cfg, l) == "kda" for l in range(layer_count(cfg)))
    return kda * 2 * m.n_heads * m.head_dim * m.head_dim / cfg.hw.state_lanes


def model_traffic(cfg: Config) -> Traffic:
    """A model chip's bytes per token: every layer's KDA (or MLA) matrices and channel mixer
    (router, shared and top_k experts; a dense layer's chunks), its parameter block when the
    layers share the bank (L > 1: hw/chip/model.py fetches each half of a layer's block once
    for the hw.sequences tokens that go through the layer together, so a token's share is
    the halves' beats / sequences), the embedding row and the LM head; with Attention
    Residuals the depth unit's query rows (one a mix, on the weight port), its MACs and its
    bound.  (An MLA layer's cache reads are on their own port, not in these bytes.)
    ``dense_bytes``: the same with every routed expert."""
    from hw.attnres.kept import depth_cycles_per_token, depth_macs_per_token, depth_query_bytes_per_token
    from hw.chip.model import model_macs_per_token
    from hw.image.memory_map import (layer_count, layer_kind, layer_prefix, memory_map, moe_token_regions,
                                     sequence_slots)
    from hw.image.param_map import fetch_halves
    mm = memory_map(cfg)
    m = cfg.model
    L = layer_count(cfg)
    weight = dense = 0
    for l in range(L):
        p = layer_prefix(cfg, l)
        mixer = p + ("mla." if layer_kind(cfg, l) == "mla" else "kda.")
        kda = sum(r.nbytes for name, r in mm.regions.items() if name.startswith(mixer))
        block = (sum(n for _, n in fetch_halves(cfg)) * cfg.hw.weight_port_bytes / sequence_slots(cfg)
                 if L > 1 else 0)
        if m.mixers[l] == "dense":
            mix = sum(r.nbytes for name, r in mm.regions.items() if name.startswith(p + "dense."))
            weight, dense = weight + kda + mix + block, dense + kda + mix + block
        else:
            weight += kda + block + sum(mm[n].nbytes for n in moe_token_regions(cfg, p))
            dense += kda + block + sum(mm[n].nbytes for n in moe_token_regions(cfg, p, routed=m.n_experts))
    emb = mm["embedding"].row_bytes
    head = (mm["lm_head"] if "lm_head" in mm else mm["embedding"]).nbytes
    head += depth_query_bytes_per_token(cfg)      # a query row per mix (0 without AttnRes)
    return Traffic(macs=model_macs_per_token(cfg), weight_bytes=weight + emb + head, dense_bytes=dense + emb + head,
                   lanes=cfg.hw.lanes, port_bytes=cfg.hw.weight_port_bytes, state_cycles=state_cycles(cfg),
                   depth_macs=depth_macs_per_token(cfg), depth_cycles=depth_cycles_per_token(cfg))
