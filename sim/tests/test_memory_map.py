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
