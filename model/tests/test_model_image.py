"""The memory image of a model (issue 14): per-layer parameter blocks and matrices, the head's
parameters, the embedding and an untied LM head; one-layer images unchanged.  Gated MLA layers
(issue 15), LatentMoE mixers and Attention Residuals too."""
import subprocess
import sys

import numpy as np
import pytest

from hw.image.format import ImageError, check_image, image_layout, param_blocks
from hw.image.memory_map import memory_map, model_tensors
from hw.image.param_map import model_param_maps, param_map
from moekda.config import ConfigError, load_config
from model.image import qlayer_image, qmodel_from_image, qmodel_image, with_word
from model.int_model import int_run_model, int_run_stack
from model.params import random_model_params, random_tokens
from model.quantize import quantize_model, quantize_random_layer
from model.cases import hybrid_model_config, model_config, quick_model


@pytest.mark.parametrize("tied", [True, False])
def test_model_image_round_trip(tied):
    cfg = model_config(tie_embedding=tied)
    qm = quick_model(cfg, 2)[1]
    img = qmodel_image(cfg, qm)
    check_image(cfg, img)
    assert len(img) == image_layout(cfg).length
    back = qmodel_from_image(cfg, img)
    a, b = qm.to_flat(), back.to_flat()
    for k, v in a.items():
        if "scales." in k:        # scales are the quantiser's, not the chip's (only the header's are kept)
            continue
        assert k in b and np.array_equal(np.asarray(b[k]), np.asarray(v)), k
    assert np.float32(back.scales["logits"]) == np.float32(qm.scales["logits"])   # the header's Y_SCALE
    toks = random_tokens(cfg, 12, seed=5, model_seed=2)
    assert np.array_equal(int_run_model(back, cfg, toks), int_run_model(qm, cfg, toks))


def test_layer_chip_image_unchanged():
    """A layer config's image: one parameter block with QLayer's names, after the block of the
    short convolutions' taps when they live in SRAM (tiny; tiny-flops has them in the bank)."""
    from hw.image.param_map import tap_map
    cfg = load_config("tiny")
    assert model_param_maps(cfg) == [("", tap_map(cfg)), ("", param_map(cfg))]
    assert model_param_maps(load_config("tiny-flops")) == [("", param_map(load_config("tiny-flops")))]
    q = quantize_random_layer(cfg, 1)
    from model.qparams import QModel
    assert qmodel_image(cfg, QModel([q])) == qlayer_image(cfg, q)
    # 3,368 bytes fewer than before the fixed tables (moekda/tables.py; 9020 and 135328 before):
    # four 256-entry tables of 16, 9, 9 and 16 bits not loaded (7420, 133728), then the four SiLU
    # tables (3 x 16 and 8 bits) replaced by c * sigmoid, 44 loaded bits each
    assert image_layout(cfg).length == 5652 and image_layout(load_config("small")).length == 131952
    assert list(memory_map(cfg).regions)[:2] == ["moe.router", "moe.expert0.gate"]


def test_model_layout():
    cfg = model_config()
    m = cfg.model
    pb = cfg.hw.weight_port_bytes
    blocks = param_blocks(cfg)
    assert [p for p, _, _ in blocks] == ["layers.0.", "layers.1.", "layers.2.", "layers.3.", ""]
    for (_, pm, addr), (_, _, nxt) in zip(blocks, blocks[1:]):
        assert addr % pb == 0 and addr + pm.nbytes == nxt
    names0 = {f.name for f in blocks[0][1].fields}
    names1 = {f.name for f in blocks[1][1].fields}
    assert "dense.silu.t_m" in names0 and "moe.router.m" not in names0 and "moe.router.m" in names1
    assert {f.name for f in blocks[4][1].fields} >= {"head.final_norm.m", "head.norm_w", "head.head_m"}
    mm = memory_map(cfg)
    assert mm.base == blocks[-1][2] + blocks[-1][1].nbytes
    names = [n for n, _, _ in model_tensors(cfg)]
    assert names[0] == "layers.0.dense.chunk0.gate" and "layers.0.dense.chunk2.down" in names
    assert "layers.0.moe.router" not in names and "layers.1.moe.router" in names
    assert names[-1] == "embedding" and "lm_head" not in names           # tied
    emb = mm["embedding"]
    assert (emb.rows, emb.cols) == (m.vocab, m.d_model) and emb.addr % pb == 0
    assert "lm_head" in memory_map(model_config(tie_embedding=False)).regions
    # a layer's matrices are contiguous, in the one-layer order (mixer, then KDA)
    l2 = [n for n in names if n.startswith("layers.2.")]
    mm.span(l2)
    assert l2[0] == "layers.2.moe.router" and l2[-1] == "layers.2.kda.w_o"


def test_stack_without_vocab_image():
    cfg = model_config("tiny", n_layers=2)
    qm = quantize_model(random_model_params(cfg, 0), cfg, model_seed=0)
    img = qmodel_image(cfg, qm)
    back = qmodel_from_image(cfg, img)
    assert back.head is None and "embedding" not in memory_map(cfg).regions
    xs = np.random.default_rng(0).integers(-3000, 3000, size=(6, 16))
    assert np.array_equal(int_run_stack(back, cfg, xs), int_run_stack(qm, cfg, xs))


def test_bad_model_images_refused():
    cfg = model_config()
    qm = quick_model(cfg, 3)[1]
    img = qmodel_image(cfg, qm)
    with pytest.raises(ImageError, match="made for config hash"):
        check_image(model_config(tie_embedding=False), img)
    with pytest.raises(ImageError, match="bad checksum"):
        check_image(cfg, with_word(img, len(img) // 2 & ~3, 0x12345678))
    flat = qm.to_flat()
    flat["layers.2.kda.f_q"] = np.int64(99)
    from hw.image.format import pack_image
    from hw.image.memory_map import model_flat_tensors
    with pytest.raises(ValueError, match=r"parameter layers\.2\.kda\.f_q = 99: allowed range is 0 to 11"):
        pack_image(cfg, flat, model_flat_tensors(cfg, flat))


def test_cli_model_image(tmp_path):
    out = tmp_path / "m.img"
    r = subprocess.run([sys.executable, "-m", "cli", "image", "-c", "model-tiny", "--seed", "1", "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "4 layers" in r.stdout and out.stat().st_size == image_layout(load_config("model-tiny")).length
    r = subprocess.run([sys.executable, "-m", "cli", "image", "-c", "model-tiny", "--check", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "good image for model-tiny" in r.stdout
    r = subprocess.run([sys.executable, "-m", "cli", "image", "-c", "model-small", "--check", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "made for config hash" in r.stderr and "\n" not in r.stderr.strip()


def assert_image_round_trip(cfg, qm, img):
    """Every integer of ``qm`` (not its scales: only the header's are kept) comes back from its
    image, and the integer model on the image's model runs the same tokens.  Returns it."""
    back = qmodel_from_image(cfg, img)
    a, b = qm.to_flat(), back.to_flat()
    assert {k for k in a if "scales." not in k} == {k for k in b if "scales." not in k}
    for k, v in a.items():
        if "scales." not in k:
            assert np.array_equal(np.asarray(b[k]), np.asarray(v)), k
    toks = random_tokens(cfg, 12, seed=5, model_seed=2)
    assert np.array_equal(int_run_model(back, cfg, toks), int_run_model(qm, cfg, toks))
    return back


@pytest.mark.parametrize("latent", [0, 8], ids=["moe", "latent_moe"])
def test_hybrid_model_image_round_trip(latent):
    """A model whose last layer is a Gated MLA one (layers kda, kda, kda, mla), its MoE layers
    plain or LatentMoE ones (model.moe_latent 8: lat_down, lat_up and the routed experts at
    width 8 in the map, lat_m/lat_s and the projections' (m, s) in each MoE block): its image
    holds every integer, and the integer model on the image's model runs the same tokens."""
    cfg = hybrid_model_config(n_heads=2, head_dim=8, moe_latent=latent)
    qm = quick_model(cfg, 2)[1]
    assert [q.kind for q in qm.layers] == ["kda", "kda", "kda", "mla"]
    img = qmodel_image(cfg, qm)
    check_image(cfg, img)
    assert len(img) == image_layout(cfg).length
    back = assert_image_round_trip(cfg, qm, img)
    assert [q.kind for q in back.layers] == ["kda", "kda", "kda", "mla"]
    a = qm.to_flat()
    # the MLA layer's block: its values, its padding zeros, then res1 as a KDA layer's
    _, pm, addr = param_blocks(cfg)[3]
    assert pm.unpack(img[addr:addr + pm.nbytes])["mla.u_m"] == a["layers.3.mla.u_m"]


def test_bad_hybrid_values_refused_naming_the_field():
    from hw.image.format import pack_image
    from hw.image.memory_map import model_flat_tensors
    cfg = hybrid_model_config()
    flat = quick_model(cfg, 3)[1].to_flat()
    tensors = model_flat_tensors(cfg, flat)
    with pytest.raises(ValueError, match=r"parameter layers\.3\.mla\.kv_norm\.s = 32: allowed range is 0 to 31"):
        pack_image(cfg, {**flat, "layers.3.mla.kv_norm.s": np.int64(32)}, tensors)
    with pytest.raises(ValueError, match=r"parameter layers\.3\.mla\.dkv\.out_bits = 8: this config fixes it to 16"):
        pack_image(cfg, {**flat, "layers.3.mla.dkv.out_bits": np.int64(8)}, tensors)


@pytest.mark.parametrize("mode", ["full", "block"])
def test_attn_res_model_image_round_trip(mode):
    """Attention Residuals (issue 15): the queries are a matrix after the layers', the logit
    requantisers, the key normaliser and x_0's requantiser are in the model's block after the
    head's, and each sub-layer's output requantiser is its layer's residual add with m_a = 0
    (what the chip's add computes then is v_n).  The integer model on the image's model runs
    the same tokens; every integer comes back."""
    cfg = hybrid_model_config(attn_res=mode, moe_latent=8)
    m, N = cfg.model, 2 * cfg.model.n_layers
    qm = quick_model(cfg, 2)[1]
    img = qmodel_image(cfg, qm)
    check_image(cfg, img)
    names = [n for n, _, _ in model_tensors(cfg)]
    assert names.index("attn_res.queries") == names.index("embedding") - 1
    q = memory_map(cfg)["attn_res.queries"]
    assert (q.rows, q.cols) == (N + 1, m.d_model)
    (prefix, pm, addr), = [b for b in param_blocks(cfg) if not b[0].startswith("layers.")]
    fields = [f.name for f in pm.fields]
    assert fields[0] == "head.final_norm.eps_int" and fields[-1] == "attn_res.emb_s" and "attn_res.u_m" in fields
    assert pm["attn_res.u_m"].shape == (N + 1,)
    block = pm.unpack(img[addr:addr + pm.nbytes])
    ar = qm.attn_res
    assert np.array_equal(block["attn_res.u_s"], ar.u_s) and int(block["attn_res.key_norm.m"]) == ar.key_norm.m
    for n in range(N):
        _, lpm, laddr = param_blocks(cfg)[n // 2]
        res = {k: int(v) for k, v in lpm.unpack(img[laddr:laddr + lpm.nbytes]).items() if k.startswith(f"res{n % 2 + 1}.")}
        assert res == {f"res{n % 2 + 1}.m_a": 0, f"res{n % 2 + 1}.m_b": ar.out_m[n], f"res{n % 2 + 1}.s": ar.out_s[n]}
    assert_image_round_trip(cfg, qm, img)


def test_a_residual_add_with_m_a_0_is_the_depth_requantiser():
    """Why the image keeps out_m, out_s as the residual adds: the add's arithmetic (one rounding
    of a m_a + b m_b) with m_a = 0 is requantize(b, m_b, s), for every shift a field holds and
    both branch widths (int8 token mixer, resid_bits channel mixer), saturation included."""
    from moekda.formats import formats_for
    from moekda.numerics import requantize
    from model.int_ops import int_residual_add
    from model.qparams import QResidual
    fm = formats_for(hybrid_model_config(attn_res="full"))
    rng = np.random.default_rng(3)
    for s in range(64):
        for bits in (fm.act_bits, fm.resid_bits):
            b = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=200)
            b[:2] = [-(1 << (bits - 1)), (1 << (bits - 1)) - 1]
            a = rng.integers(-(1 << 15), 1 << 15, size=200)
            mb = int(rng.integers(1, 1 << fm.mult_bits))
            assert np.array_equal(int_residual_add(a, b, QResidual(0, mb, s), fm),
                                  requantize(b, mb, s, fm.resid_bits)), (s, bits)


def test_attn_res_image_needs_its_values():
    from hw.image.format import pack_image
    from hw.image.memory_map import model_flat_tensors
    cfg = hybrid_model_config(attn_res="block")
    flat = quick_model(cfg, 3)[1].to_flat()
    tensors = model_flat_tensors(cfg, flat)
    with pytest.raises(ValueError, match=r"parameter attn_res\.u_s = 64: allowed range is 0 to 63"):
        pack_image(cfg, {**flat, "attn_res.u_s": np.full(9, 64)}, tensors)
    with pytest.raises(ValueError, match=r'parameter attn_res\.out_s: missing \(model\.attn_res = "block"\)'):
        pack_image(cfg, {k: v for k, v in flat.items() if k != "attn_res.out_s"}, tensors)


def test_k3_model_image_round_trip():
    """configs/model-tiny-k3.toml (issue 47): each MoE layer's block holds the LatentMoE exit
    norm's (eps_int, m, s) after lat_m/lat_s; the integer model on the image's model runs the
    same tokens, and every integer of the norm comes back."""
    cfg = load_config("model-tiny-k3")
    qm = quick_model(cfg, 2)[1]
    img = qmodel_image(cfg, qm)
    check_image(cfg, img)
    back = assert_image_round_trip(cfg, qm, img)
    for l, (q, b) in enumerate(zip(qm.layers, back.layers)):
        if cfg.model.mixers[l] == "moe":
            assert q.moe.lat_norm is not None and b.moe.lat_norm == q.moe.lat_norm
    _, pm, addr = param_blocks(cfg)[1]
    names = [f.name for f in pm.fields]
    assert names.index("moe.lat_norm.eps_int") == names.index("moe.lat_s") + 1
