"""The memory image (hw/image/format.py, model/image.py, `moekda image`)."""
import numpy as np
import pytest

from hw.image.format import ImageError, check_image, image_layout, word_sum
from cli import main
from moekda.config import load_config
from model.image import qlayer_from_image, qlayer_image, random_layer_image, with_word
from model.quantize import quantize_random_layer


@pytest.fixture(scope="module")
def tiny():
    return random_layer_image("tiny", 4)


def test_round_trip_keeps_every_integer(tiny):
    cfg, q, img = tiny
    lay = image_layout(cfg)
    assert len(img) == lay.length and lay.length % 4 == 0 and lay.length % cfg.hw.weight_port_bytes == 0
    assert word_sum(img) == 0
    back = qlayer_from_image(cfg, img).to_flat()
    for k, v in q.to_flat().items():
        if not k.startswith("scales."):
            assert np.array_equal(back[k], v), k
    for k in ("scales.x", "scales.y"):          # the host's conversion, float32 in the header
        assert back[k] == pytest.approx(q.to_flat()[k], rel=1e-7)


@pytest.mark.parametrize("damage,message", [
    (lambda img: with_word(img, 0, 0x12345678), "magic 0x12345678 is not a moekda image"),
    (lambda img: with_word(img, 4, 9), "format version 9"),
    (lambda img: with_word(img, 8, 0xDEADBEEF), "made for config hash deadbeef"),
    (lambda img: img[:-4], "header says"),
    (lambda img: img[:40], "header says"),
    (lambda img: img[:7], "shorter than the 32-byte header"),
    (lambda img: img[:100] + bytes([img[100] ^ 1]) + img[101:], "bad checksum"),
    (lambda img: img[:-1] + bytes([img[-1] ^ 0x80]), "bad checksum"),
])
def test_damaged_image_is_refused_in_one_line(tiny, damage, message):
    cfg, _, img = tiny
    with pytest.raises(ImageError, match=message) as e:
        check_image(cfg, damage(img))
    assert "\n" not in str(e.value)


def test_image_of_another_config_is_refused(tiny):
    _, _, img = tiny
    with pytest.raises(ImageError, match=r"this config \(small\)"):
        check_image(load_config("small"), img)


def test_two_models_differ_only_after_the_fixed_fields(tiny):
    cfg, _, img = tiny
    other = qlayer_image(cfg, quantize_random_layer(cfg, 5))
    assert len(other) == len(img) and other[:16] == img[:16] and other != img


def test_image_command(tmp_path, capsys):
    out = tmp_path / "m.img"
    assert main(["image", "-c", "tiny", "--seed", "2", "-o", str(out)]) == 0
    assert main(["image", "-c", "tiny", "--check", str(out)]) == 0
    assert "good image for tiny" in capsys.readouterr().out
    assert main(["image", "-c", "small", "--check", str(out)]) == 2
    assert "made for config hash" in capsys.readouterr().err
    (tmp_path / "cut.img").write_bytes(out.read_bytes()[:64])
    assert main(["image", "-c", "tiny", "--check", str(tmp_path / "cut.img")]) == 2
    assert "header says" in capsys.readouterr().err
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not a zip")
    assert main(["image", "-c", "tiny", "--params", str(tmp_path / "bad.npz"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "bad.npz" in err and "Traceback" not in err and err.count("\n") == 1
    assert main(["image", "-c", "tiny", "--check", str(tmp_path / "missing.img")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_integer_params_file_gives_the_same_image(tmp_path):
    cfg = load_config("tiny")
    q = quantize_random_layer(cfg, 6)
    np.savez(tmp_path / "q.npz", **q.to_flat())
    out = tmp_path / "q.img"
    assert main(["image", "-c", "tiny", "--params", str(tmp_path / "q.npz"), "-o", str(out)]) == 0
    assert out.read_bytes() == qlayer_image(cfg, q)


def test_every_damage_kind_is_refused_by_the_tools(tiny):
    """The damaged images the chip's LOAD tests use are refused by the tools too."""
    from model.image import DAMAGE_KINDS, damaged_image
    cfg, _, img = tiny
    for kind in DAMAGE_KINDS:
        bad, bits = damaged_image(img, kind)
        assert bits and len(bad) == len(img)
        with pytest.raises(ImageError):
            check_image(cfg, bad)
