"""The parameter region (hw/image/param_map.py): packing, ranges, and the bank layout."""
import numpy as np
import pytest
from amaranth import Const
from amaranth.lib import data

from hw.image.param_map import (conv_taps_in_sram, fixed_value_differs, model_param_maps, param_fields, param_layout,
                                param_map, region_value, structural, tap_words)
from moekda.config import load_config
from moekda.formats import formats_for
from moekda.tables import fixed_table
from model.quantize import quantize_random_layer


@pytest.fixture(scope="module", params=["tiny", "small", "tiny_latent"])
def case(request):
    if request.param == "tiny_latent":      # LatentMoE: lat_down, lat_up, lat_m, lat_s too
        from moekda.config import with_settings
        cfg = with_settings(load_config("tiny"), ["model.moe_latent=8"])
    else:
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
    st = structural(cfg)
    names = {f.name for _, pm in model_param_maps(cfg) for f in pm.fields}      # the taps' block too
    for k, v in flat.items():
        if k.startswith("scales.") or k.endswith("_w") or (k.endswith(".w") and not k.startswith("kda.conv")):
            continue
        assert k in names or k in st, f"{k} is neither loaded nor fixed by the config"
        if k in st:
            assert not fixed_value_differs(v, st[k]), f"quantiser gives {k} = {v}, the config fixes {st[k]}"


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
    assert int(view.silu_v.t_m) == int(flat["kda.silu_v.t_m"]) and int(view.silu_v.s) == int(flat["kda.silu_v.s"])
    if conv_taps_in_sram(cfg):
        assert not hasattr(view.conv_v, "w")
    else:
        assert int(view.conv_v.w[1][2]) == int(flat["kda.conv_v.w"][1, 2])
    assert isinstance(Const(val, kda.size), Const)


@pytest.mark.parametrize("name", ["tiny", "tiny-flops", "small-sram", "model-tiny-sram", "model-tiny-k3"])
def test_taps_in_sram_lead_the_region_as_the_memory_words(name):
    """With the taps in SRAM (conv_taps_in_sram) the parameter region starts with every KDA
    layer's taps, in layer order, and word n of the tap memory (a port beat) holds channel
    c's K taps (oldest first) at byte (c K) mod W of word c K / W; the bank has no taps."""
    cfg = load_config(name)
    W, K = cfg.hw.weight_port_bytes, cfg.model.conv_kernel
    blocks = model_param_maps(cfg)
    taps = [(p, pm) for p, pm in blocks if pm.memory == "taps"]
    if not conv_taps_in_sram(cfg):
        assert not taps and tap_words(cfg) == 0 and "kda.conv_q.w" in {f.name for f in param_map(cfg).fields}
        return
    kda_layers = [l for l, k in enumerate(cfg.model.layers) if k == "kda"]
    assert blocks[:len(taps)] == taps and len(taps) == len(kda_layers)
    assert [p for p, _ in taps] == ([""] if cfg.model.is_layer_chip else [f"layers.{l}." for l in kda_layers])
    assert "kda.conv_q.w" not in {f.name for f in param_map(cfg).fields}
    rng = np.random.default_rng(5)
    hk = cfg.model.n_heads * cfg.model.head_dim
    flat = {f"kda.{c}.w": rng.integers(-128, 128, (hk, K)) for c in ("conv_q", "conv_k", "conv_v")}
    region = taps[0][1].pack(flat)
    assert len(region) == W * tap_words(cfg) // len(taps)
    chans = np.concatenate([flat[f"kda.{c}.w"] for c in ("conv_q", "conv_k", "conv_v")])
    for c in (0, 1, hk, 3 * hk - 1):
        at = c * K
        word = region[at // W * W:at // W * W + W]
        assert list(np.frombuffer(word[at % W:at % W + K], dtype=np.int8)) == list(chans[c]), c


# ---- a Gated MLA layer's block (kind "mla") ------------------------------------------

MLA_FIELDS = ["attn_norm.eps_int", "attn_norm.m", "attn_norm.s",
              "mla.dkv.m", "mla.dkv.s", "mla.q_proj.m", "mla.q_proj.s", "mla.g_proj.m", "mla.g_proj.s",
              "mla.uk.m", "mla.uk.s", "mla.uv.m", "mla.uv.s", "mla.o_proj.m", "mla.o_proj.s",
              "mla.kv_norm.eps_int", "mla.kv_norm.m", "mla.kv_norm.s", "mla.u_m", "mla.u_s",  # mla.gate: fixed (moekda/tables.py)
              "token_pad", "res1.m_a", "res1.m_b", "res1.s", "mlp_norm.eps_int"]


@pytest.fixture(scope="module")
def mla_case():
    """A hybrid model-tiny (layers kda, kda, kda, mla; two heads) and its MLA layer's flat values."""
    from model.cases import hybrid_model_config, quick_model
    cfg = hybrid_model_config(n_heads=2, head_dim=8)
    qm = quick_model(cfg, 3)[1]
    assert qm.layers[3].kind == "mla" and cfg.model.mixers[3] == "moe"
    return cfg, qm.layers[3].to_flat()


def test_mla_block_packs_and_unpacks(mla_case):
    from hw.image.param_map import mla_norm_ss_bits, model_param_maps, token_pad_bits
    cfg, flat = mla_case
    fm = formats_for(cfg)
    pm = param_map(cfg, "moe", kind="mla")
    assert [f.name for f in pm.fields][:len(MLA_FIELDS)] == MLA_FIELDS
    kda_channel = [f.name for f in param_map(cfg).fields if not f.name.startswith(("attn_norm", "kda.", "res1"))]
    assert [f.name for f in pm.fields][len(MLA_FIELDS) - 1:] == kda_channel
    assert pm["mla.dkv.m"].bits == fm.mult_bits and pm["mla.o_proj.s"].bits == 6 and pm["mla.u_s"].bits == 6
    assert pm["mla.kv_norm.eps_int"].bits == mla_norm_ss_bits(cfg) == 2 * 15 + 4 + 1 and pm["mla.kv_norm.s"].bits == 5
    assert "mla.gate.table" not in [f.name for f in pm.fields]    # the config's (moekda/tables.py)
    assert pm["token_pad"].bits == token_pad_bits(cfg, "mla") > 0 and token_pad_bits(cfg, "kda") == 0
    assert model_param_maps(cfg)[3][1].fields == pm.fields
    region = pm.pack(flat)
    back = pm.unpack(region)
    assert "token_pad" not in back
    for f in pm.fields:
        if not f.pad:
            assert np.array_equal(back[f.name], flat[f.name]), f.name
    off = pm.offsets()["token_pad"]
    assert (int.from_bytes(region, "little") >> off) & ((1 << pm["token_pad"].bits) - 1) == 0


def test_every_integer_of_the_mla_layer_is_a_parameter_a_matrix_or_structural(mla_case):
    cfg, flat = mla_case
    fm = formats_for(cfg)
    names, st = {f.name for f in param_fields(cfg, "moe", kind="mla")}, structural(cfg, "moe", kind="mla")
    for k, v in flat.items():
        if k.startswith("scales.") or k.endswith("_w") or k.endswith(".w"):
            continue
        assert k in names or k in st, f"{k} is neither loaded nor fixed by the config"
        if k in st:
            assert not fixed_value_differs(v, st[k]), f"quantiser gives {k} = {v}, the config fixes {st[k]}"
    assert np.array_equal(st.pop("mla.gate.table"), fixed_table(cfg, "mla.gate"))
    assert {k: st[k] for k in st if k.startswith("mla.")} == {
        "mla.dkv.out_bits": fm.resid_bits, "mla.q_proj.out_bits": fm.act_bits, "mla.g_proj.out_bits": fm.lut_in_bits,
        "mla.uk.out_bits": fm.act_bits, "mla.uv.out_bits": fm.act_bits, "mla.o_proj.out_bits": fm.act_bits,
        "mla.gate.in_bits": fm.lut_in_bits}
    assert not any(k.startswith("kda.") for k in list(names) + list(st))


def test_mla_out_of_range_value_names_the_field(mla_case):
    cfg, flat = mla_case
    pm = param_map(cfg, "moe", kind="mla")
    with pytest.raises(ValueError, match=r"mla\.u_s = 64: allowed range is 0 to 63"):
        pm.pack({**flat, "mla.u_s": np.int64(64)})
    with pytest.raises(ValueError, match=r"mla\.kv_norm\.m = 65536: allowed range is 0 to 65535"):
        pm.pack({**flat, "mla.kv_norm.m": np.int64(1 << 16)})
    with pytest.raises(ValueError, match=r"mla\.kv_norm\.eps_int: missing"):
        pm.pack({k: v for k, v in flat.items() if k != "mla.kv_norm.eps_int"})


def test_mixer_split_is_the_same_bit_for_kda_and_mla_layers(mla_case):
    """Every (kind, mixer) block: the same size, the channel mixer's half (and res1) at the same
    bit, which is the KDA-only config's: the chip fetches any layer's halves into one bank."""
    from hw.image.param_map import layer_block_bytes, layer_pairs, mixer_split_bit, model_param_maps
    cfg, _ = mla_case
    assert layer_pairs(cfg) == [("kda", "dense"), ("kda", "moe"), ("mla", "moe")]
    split = mixer_split_bit(cfg)
    res1 = set()
    for kind in ("kda", "mla"):
        for mx in ("moe", "dense"):
            offs = param_map(cfg, mx, kind).offsets()
            assert offs["mlp_norm.eps_int"] == split, (kind, mx)
            res1.add(offs["res1.m_a"])
    assert len(res1) == 1
    blocks = model_param_maps(cfg)[:4]
    assert {pm.nbytes for _, pm in blocks} == {layer_block_bytes(cfg)}
    from model.cases import model_config
    plain = model_config(n_heads=2, head_dim=8)            # the same model, every layer kda
    assert split == mixer_split_bit(plain) and layer_block_bytes(cfg) == layer_block_bytes(plain)
    assert not any(f.pad for _, pm in model_param_maps(plain) for f in pm.fields)


def test_mla_layout_bits_are_the_region_bits(mla_case):
    cfg, flat = mla_case
    pm = param_map(cfg, "moe", kind="mla")
    layout = param_layout(cfg, kind="mla")
    assert layout.size == pm.bits
    offsets = pm.offsets()

    def leaves(lay, prefix, base):
        for name, member in lay:
            full = f"{prefix}{name}"
            if isinstance(member.shape, data.StructLayout):
                yield from leaves(member.shape, full + ".", base + member.offset)
            else:
                yield full, base + member.offset
    got = dict(leaves(layout, "", 0))
    assert got == offsets
    # the unit's port: param_layout(cfg, "mla", kind="mla"), the mla.* fields in packed order
    mla = param_layout(cfg, "mla", kind="mla")
    first = offsets["mla.dkv.m"]
    for name, off in leaves(mla, "mla.", 0):
        assert offsets[name] - first == off, name
    assert mla.size == offsets["token_pad"] - first
    view = data.Const(mla, region_value(cfg, flat, "mla", kind="mla"))
    assert int(view.dkv.m) == int(flat["mla.dkv.m"]) and int(view.o_proj.s) == int(flat["mla.o_proj.s"])
    assert int(view.kv_norm.eps_int) == int(flat["mla.kv_norm.eps_int"]) and int(view.u_s) == int(flat["mla.u_s"])
    assert int(view.u_m) == int(flat["mla.u_m"])
    assert param_layout(cfg, "mla.kv_norm", kind="mla").size == sum(
        pm[f"mla.kv_norm.{n}"].total_bits for n in ("eps_int", "m", "s"))
