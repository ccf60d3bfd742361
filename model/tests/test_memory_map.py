"""hw/image/memory_map.py: alignment, no overlap, expert contiguity, image contents."""
import numpy as np
import pytest

from hw.image.memory_map import build_image, memory_map
from moekda.config import config_from_dict, load_config


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_regions_aligned_disjoint_and_ordered(name):
    cfg = load_config(name)
    mm = memory_map(cfg)
    pb = cfg.hw.weight_port_bytes
    regs = sorted(mm.regions.values(), key=lambda r: r.addr)
    assert regs[0].addr == mm.base and mm.base % pb == 0   # after the header and parameters
    for a, b in zip(regs, regs[1:]):
        assert a.end <= b.addr
    for r in regs:
        assert r.addr % pb == 0 and r.row_bytes % pb == 0 and r.row_bytes >= r.cols
        assert r.row_bytes - r.cols < pb  # padding is less than one beat


def test_moe_shapes_and_expert_contiguity():
    cfg = config_from_dict({"name": "t", "model": {"d_model": 12, "d_ff": 20, "n_experts": 3, "top_k": 1,
                                                    "n_shared": 2}, "hw": {"weight_port_bytes": 8, "lanes": 8}})
    mm = memory_map(cfg)
    assert (mm["moe.router"].rows, mm["moe.router"].cols, mm["moe.router"].row_bytes) == (3, 12, 16)
    for p in ["moe.expert0", "moe.expert2", "moe.shared1"]:
        assert (mm[f"{p}.gate"].rows, mm[f"{p}.gate"].cols) == (20, 12)
        assert (mm[f"{p}.down"].rows, mm[f"{p}.down"].cols, mm[f"{p}.down"].row_bytes) == (12, 20, 24)
        addr, nbytes = mm.span([f"{p}.gate", f"{p}.up", f"{p}.down"])
        assert nbytes == 2 * 20 * 16 + 12 * 24
    assert "moe.shared2" + ".gate" not in mm


def test_image_bytes_are_the_tensors_little_endian_rows():
    cfg = load_config("tiny")
    mm = memory_map(cfg)
    rng = np.random.default_rng(1)
    tensors = {n: rng.integers(-128, 128, (r.rows, r.cols)) for n, r in mm.regions.items()}
    img = build_image(cfg, tensors, mm)
    assert len(img) == mm.size
    for n, r in mm.regions.items():
        for row in (0, r.rows - 1):
            a = r.row_addr(row)
            got = np.frombuffer(img[a:a + r.cols], dtype=np.int8)
            assert np.array_equal(got, tensors[n][row])
            assert img[a + r.cols:a + r.row_bytes] == bytes(r.row_bytes - r.cols)


def test_image_rejects_bad_tensors():
    cfg = load_config("tiny")
    mm = memory_map(cfg)
    good = {n: np.zeros((r.rows, r.cols), dtype=np.int64) for n, r in mm.regions.items()}
    with pytest.raises(KeyError, match="moe.router"):
        build_image(cfg, {k: v for k, v in good.items() if k != "moe.router"})
    with pytest.raises(ValueError, match="shape"):
        build_image(cfg, {**good, "moe.router": np.zeros((1, 1))})
    with pytest.raises(ValueError, match="int8"):
        build_image(cfg, {**good, "moe.router": good["moe.router"] + 200})


MLA_REGIONS = ("w_dkv", "w_q", "w_g", "w_uk", "w_uv", "w_o")


def test_mla_layer_regions():
    """An "mla" layer's token mixer is its six matrices, after its channel mixer's, contiguous;
    the KDA layers' regions are where and what they are in the KDA-only model."""
    from model.cases import hybrid_model_config
    cfg = hybrid_model_config(n_heads=2, head_dim=8)
    m = cfg.model
    d, H, dh, r = m.d_model, m.n_heads, m.head_dim, m.kv_rank
    mm = memory_map(cfg)
    l3 = [n for n in mm.regions if n.startswith("layers.3.")]
    mla = [f"layers.3.mla.{t}" for t in MLA_REGIONS]
    assert l3[0] == "layers.3.moe.router" and l3[-6:] == mla and not any(".kda." in n for n in l3)
    assert [(mm[n].rows, mm[n].cols) for n in mla] == [(r, d), (H * dh, d), (H * dh, d), (H * r, dh),
                                                       (H * dh, r), (d, H * dh)]
    addr, nbytes = mm.span(mla)
    assert addr == mm[mla[0]].addr and nbytes == sum(mm[n].nbytes for n in mla)
    mm.span(l3)
    assert mm.regions[l3[-1]].end == mm["embedding"].addr
    # the parameter blocks keep their size, so layers 0-2 are the KDA-only model's, byte for byte
    plain = memory_map(config_from_dict({**cfg.to_dict(), "name": "t",
                                         "model": {**cfg.to_dict()["model"], "layers": ["kda"] * 4, "kv_rank": 0}}))
    assert plain.base == mm.base
    for n, reg in plain.regions.items():
        if not n.startswith("layers.3.") and n != "embedding":
            assert mm[n] == reg, n
    assert [n for n in plain.regions if n.startswith("layers.3.kda.")][0] == "layers.3.kda.w_q"


def test_flat_tensors_round_trip_of_a_hybrid_model():
    """QModel.to_flat() -> regions -> flat names: every matrix back; the per-head W_uk, W_uv
    as rows h*r + i, h*dh + j."""
    from hw.image.memory_map import model_flat_tensors, model_tensors_flat
    from model.cases import hybrid_model_config, quick_model
    cfg = hybrid_model_config(n_heads=2, head_dim=8)
    H, dh, r = cfg.model.n_heads, cfg.model.head_dim, cfg.model.kv_rank
    flat = quick_model(cfg, 2)[1].to_flat()
    mm = memory_map(cfg)
    t = model_flat_tensors(cfg, flat)
    assert set(t) == set(mm.regions)
    for n, reg in mm.regions.items():
        assert t[n].shape == (reg.rows, reg.cols), n
    uk, uv = flat["layers.3.mla.uk.w"], flat["layers.3.mla.uv.w"]
    assert uk.shape == (H, r, dh) and uv.shape == (H, dh, r)
    for h in range(H):
        for i in range(r):
            assert np.array_equal(t["layers.3.mla.w_uk"][h * r + i], uk[h, i])
        for j in range(dh):
            assert np.array_equal(t["layers.3.mla.w_uv"][h * dh + j], uv[h, j])
    assert np.array_equal(t["layers.3.mla.w_dkv"], flat["layers.3.mla.dkv.w"])
    back = model_tensors_flat(cfg, t)
    assert {k for k in back if k.startswith("layers.3.mla.")} == {
        f"layers.3.mla.{f}.w" for f in ("dkv", "q_proj", "g_proj", "uk", "uv", "o_proj")}
    for k, v in back.items():
        assert v.shape == flat[k].shape and np.array_equal(v, flat[k]), k
    bad = {**flat, "layers.3.mla.uk.w": uk.reshape(H * r, dh)}
    with pytest.raises(ValueError, match=r"layers\.3\.mla\.w_uk: source has shape \(16, 8\)"):
        model_flat_tensors(cfg, bad)
