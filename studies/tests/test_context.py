"""The context sweep (studies/context.py, `moekda context`): each layer kind's cost from its
parameter shapes, tied to the integer model it stands for (the weights it multiplies and the
bytes it keeps between tokens), and the command's one-line errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from studies import context
from cli import main
from moekda.config import load_config

HYB = "model-tiny-hybrid"


@pytest.fixture(scope="module")
def cfg():
    return load_config(HYB)


def test_kda_is_flat_and_mla_grows_by_its_cache(cfg):
    m = cfg.model
    k16, k4k = context.kind_cost(cfg, "kda", 16), context.kind_cost(cfg, "kda", 4096)
    assert {k: v for k, v in k16.items() if k != "context"} == {k: v for k, v in k4k.items() if k != "context"}
    a, b = context.kind_cost(cfg, "mla", 256), context.kind_cost(cfg, "mla", 1024)
    # every cached token costs 2 H r MACs (score and weighted sum) and r int8 bytes read
    assert b["macs"] - a["macs"] == 2 * m.n_heads * m.kv_rank * (1024 - 256)
    assert b["port_bytes"] - a["port_bytes"] == m.kv_rank * (1024 - 256)
    assert b["weight_bytes"] == a["weight_bytes"] and b["bound_cycles"] > a["bound_cycles"]


def test_the_weights_counted_are_the_integer_models(cfg):
    """The cost model's weight MACs of each token mixer are the elements of the integer
    model's matrices (the short convolutions' taps among them) that one token multiplies."""
    from model.qparams import QLinear
    from model.quantize import quantize_random_model
    qm = quantize_random_model(cfg, seed=3)

    def linears(obj):
        return [v for v in vars(obj).values() if isinstance(v, QLinear)]
    for q, kind in zip(qm.layers, cfg.model.layers):
        mixer = q.mla if kind == "mla" else q.kda
        assert sum(l.w.size for l in linears(mixer)) == context.kind_cost(cfg, kind, 16)["weight_macs"], kind


def test_the_kept_bytes_are_what_the_integer_model_carries(cfg):
    from model.params import random_tokens
    toks = random_tokens(cfg, 20, seed=5)
    run = context.run_integer(cfg, toks, seed=2, with_float=True)
    kept = run["kept_bytes"][16]
    assert kept == [context.kind_cost(cfg, kind, 16)["kept_bytes"] for kind in cfg.model.layers]
    assert 0.9 < run["cosine"][16] <= 1.0
    assert sum(kept) == context.model_cost(cfg, 16)["kept_bytes"]


def test_all_mla_keeps_the_shape(cfg):
    ref = context.all_mla(cfg)
    assert ref.model.layers == ("mla",) * cfg.model.n_layers
    assert (ref.model.d_model, ref.model.kv_rank, ref.model.mixers) == (cfg.model.d_model, cfg.model.kv_rank,
                                                                       cfg.model.mixers)


def test_the_record_reports_the_saving(cfg, tmp_path):
    rec = context.sweep(cfg, tokens=256, rtl=False)
    s = rec["cache_saving"]
    L, r, n_mla = cfg.model.n_layers, cfg.model.kv_rank, cfg.model.layers.count("mla")
    assert s["all_mla_bytes"] == L * 256 * r and 0 < s["saving"] < 1
    # per token of context only the MLA layers grow: 1 of 4 layers keeps a quarter
    assert s["saving_per_token"] == pytest.approx(1 - n_mla / L)
    rec |= {"command": "test", "commit": "0" * 40}
    j, md, png = context.write(rec, tmp_path)
    assert json.loads(j.read_text())["cache_saving"]["context"] == 256
    assert "all MLA" in md.read_text() and png.stat().st_size > 1000


def test_the_mla_unit_measured_grows_by_its_score_beats(cfg):
    """The MLA unit's RTL at two contexts, its cache restored: each cached token costs the
    H row_beats score beats of the engine (the softmax's rescales add a little), and every
    output is bit-exact (the bench raises otherwise)."""
    from sim.cocotb_util import simulator_available
    if not simulator_available("icarus"):
        pytest.skip("icarus not installed")
    got = context.measure_mla_unit(cfg, (16, 112), seed=1)
    assert got["config"].endswith("model-tiny-hybrid-mixers.toml")
    c = got["token_cycles"]
    rb = -(-cfg.model.kv_rank // cfg.hw.weight_port_bytes)
    slope = (c["112"] - c["16"]) / 96
    assert cfg.model.n_heads * rb <= slope <= cfg.model.n_heads * rb + 0.5, c


@pytest.mark.parametrize("argv, words", [
    (["context", "-c", "tiny"], ["model.vocab = 0"]),
    (["context", "-c", HYB, "--tokens", "8"], ["--tokens = 8", "16 to"]),
    (["context", "-c", HYB, "--seed", "-1"], ["--seed = -1"]),
])
def test_bad_arguments_are_one_line(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert all(w in err[0] for w in words), err[0]
