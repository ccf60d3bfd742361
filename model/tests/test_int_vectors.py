"""Exported test vectors reload and agree with the integer model, block by block."""
import numpy as np
import pytest

from moekda.config import load_config
from moekda.formats import formats_for
from model.int_kda import IntKDAState, int_kda_step
from model.int_layer import int_run_layer
from model.int_moe import int_moe_step
from model.int_ops import int_rmsnorm
from model.vectors import export_vectors, load_vectors


@pytest.fixture(scope="module")
def vec(tmp_path_factory):
    d = tmp_path_factory.mktemp("vec")
    export_vectors(load_config("tiny"), 12, d)
    return load_vectors(d)


def test_layer_vectors_replay(vec):
    cfg, qp, L = vec["cfg"], vec["qparams"], vec["layer"]
    assert vec["config_hash"] == load_config("tiny").hash()
    assert L["resets"].sum() == 1 and not L["x"][1].any()       # corner tokens and a reset are there
    assert np.array_equal(int_run_layer(qp, cfg, L["x"], L["resets"]), L["y"])


def test_block_vectors_replay(vec):
    cfg, qp = vec["cfg"], vec["qparams"]
    fm = formats_for(cfg)
    N, K, M = vec["norm"], vec["kda"], vec["moe"]
    for t in range(len(K["xn"])):
        assert np.array_equal(int_rmsnorm(N["attn_x"][t], qp.attn_norm, fm), N["attn_xn"][t])
        assert np.array_equal(int_rmsnorm(N["mlp_h"][t], qp.mlp_norm, fm), N["mlp_hn"][t])
    state = IntKDAState.zeros(cfg)
    for t in range(len(K["xn"])):
        if K["resets"][t]:
            state = IntKDAState.zeros(cfg)
        state, out = int_kda_step(qp.kda, cfg, fm, state, K["xn"][t])
        assert np.array_equal(out, K["kda_out"][t]) and np.array_equal(state.S, K["S"][t])
        out, (idx, w) = int_moe_step(qp.moe, cfg, fm, M["hn"][t])
        assert np.array_equal(out, M["moe_out"][t]) and np.array_equal(idx, M["idx"][t])
        assert np.array_equal(w, M["w"][t])
    assert vec["formats"]["state_bits"] == fm.state_bits


def test_vectors_command(tmp_path, capsys):
    from cli import main
    assert main(["vectors", "-c", "tiny", "-n", "4", "-o", str(tmp_path)]) == 0
    assert load_vectors(tmp_path)["layer"]["x"].shape == (4, load_config("tiny").model.d_model)
    with pytest.raises(FileNotFoundError, match="no params.npz"):
        load_vectors(tmp_path / "nothing")
