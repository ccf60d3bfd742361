"""The parameter region (hw/image/param_map.py): packing, ranges, and the bank layout."""
import numpy as np
import pytest
from amaranth import Const
from amaranth.lib import data

from hw.image.param_map import param_layout, param_map, region_value, structural
from moekda.config import load_config
from sim.models.quantize import quantize_random_layer


@pytest.fixture(scope="module", params=["tiny", "small"])
def case(request):
    cfg = load_config(request.param)
    return cfg, quantize_random_layer(cfg, 3).to_flat()


def test_pack_unpack_round_trip(case):
    cfg, flat = case
    pm = param_map(cfg)
    region = pm.pack(flat)
    assert len(region) == pm.nbytes and pm.nbytes % cfg.hw.weight_port_bytes == 0
    back = pm.unpack(region)
    for f in pm.fields:
        assert np.array_equal(back[f.name], flat[f.name]), f.name


def test_every_integer_of_the_layer_is_a_parameter_a_matrix_or_structural(case):
    cfg, flat = case
    pm, st = param_map(cfg), structural(cfg)
    names = {f.name for f in pm.fields}
    for k, v in flat.items():
        if k.startswith("scales.") or k.endswith("_w") or (k.endswith(".w") and not k.startswith("kda.conv")):
            continue
        assert k in names or k in st, f"{k} is neither loaded nor fixed by the config"
        if k in st:
            assert int(v) == st[k], f"quantiser gives {k} = {int(v)}, the config fixes {st[k]}"


def test_out_of_range_value_names_the_field(case):
    cfg, flat = case
    pm = param_map(cfg)
    bad = dict(flat)
    bad["kda.q_proj.s"] = np.int64(1 << 6)
    with pytest.raises(ValueError, match=r"kda\.q_proj\.s = 64: allowed range is 0 to 63"):
        pm.pack(bad)
    bad = dict(flat)
    bad["moe.bias"] = np.zeros(cfg.model.n_experts + 1, dtype=np.int64)
    with pytest.raises(ValueError, match="moe.bias: shape"):
        pm.pack(bad)


def test_layout_bits_are_the_region_bits(case):
    """A view of the region's bits through the Amaranth layout reads every field back:
    the bank register and the image agree bit for bit."""
    cfg, flat = case
    pm = param_map(cfg)
    layout = param_layout(cfg)
    assert layout.size == pm.bits
    offsets = pm.offsets()
    # walk the nested layout: each leaf's offset equals the packer's offset
    def leaves(lay, prefix, base):
        for name, member in lay:
            full = f"{prefix}{name}"
            if isinstance(member.shape, data.StructLayout):
                yield from leaves(member.shape, full + ".", base + member.offset)
            else:
                yield full, base + member.offset
    for name, off in leaves(layout, "", 0):
        assert offsets[name] == off, name
    # a block's sub-layout is a contiguous slice whose value region_value gives
    kda = param_layout(cfg, "kda")
    val = region_value(cfg, flat, "kda")
    view = data.Const(kda, val)
    assert int(view.q_proj.m) == int(flat["kda.q_proj.m"])
    assert int(view.f_up.bias[3]) == int(flat["kda.f_up.bias"][3])
    assert int(view.silu_q.table[0]) == int(flat["kda.silu_q.table"][0])
    assert int(view.conv_v.w[1][2]) == int(flat["kda.conv_v.w"][1, 2])
    assert isinstance(Const(val, kda.size), Const)
