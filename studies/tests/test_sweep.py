"""The sweep's logic without running a point: grid expansion, the cache, the
Pareto front (checked against the definition by brute force), the reports and
the command's answer when Ray is missing."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from studies import sweep
from moekda.config import ConfigError
from flow.fingerprint import generator_record, synthesis_fingerprint, verilog_digest


def _grid(tmp_path, text):
    p = tmp_path / "grid.toml"
    p.write_text(text)
    return sweep.load_grid(p)


def test_grid_expands_every_combination(tmp_path):
    g = _grid(tmp_path, 'base = "tiny"\n[grid]\n"lanes+weight_port_bytes" = [[2, 2], [4, 4]]\n'
                        'top_k = [1, 2, 3]\n')
    cfgs, skipped = g.points()
    assert not skipped
    assert sorted((c.hw.lanes, c.hw.weight_port_bytes, c.model.top_k) for c in cfgs) == \
        sorted((l, l, k) for l in (2, 4) for k in (1, 2, 3))
    assert len({c.name for c in cfgs}) == 6                       # one cache key per point
    assert all(c.model.d_model == 16 for c in cfgs)               # the rest is tiny's


def test_grid_names_are_stable_and_value_based(tmp_path):
    a = _grid(tmp_path, '[grid]\n"lanes+weight_port_bytes" = [[2, 2]]\n').points()[0][0]
    b = _grid(tmp_path, '[grid]\n"lanes+weight_port_bytes" = [[2, 2]]\nn_shared = [1]\n').points()[0][0]   # tiny's own value
    assert a.name == b.name


def test_grid_refuses_invalid_points_with_the_config_message(tmp_path):
    cfgs, skipped = _grid(tmp_path, '[grid]\nn_experts = [1, 4]\ntop_k = [2]\n').points()
    assert [c.model.n_experts for c in cfgs] == [4]
    assert len(skipped) == 1 and "model.top_k" in skipped[0]


@pytest.mark.parametrize("text, word", [
    ('[grid]\nwidth = [1]\n', "width"),
    ('[grid]\nlanes = []\n', "non-empty"),
    ('[grid]\n"lanes+weight_port_bytes" = [4]\n', "list of 2"),
    ('tokens = 2\n[grid]\nlanes = [2]\n', "tokens"),
    ('colour = 1\n[grid]\nlanes = [2]\n', "colour"),
])
def test_bad_grids_are_one_line_errors(tmp_path, text, word):
    with pytest.raises(ConfigError, match=word):
        _grid(tmp_path, text)


def test_cache_hit_only_for_the_same_values(tmp_path, monkeypatch):
    from studies import bench
    from pdk.kit import find_kit
    cfg, other = _grid(tmp_path, '[grid]\n"lanes+weight_port_bytes" = [[2, 2], [4, 4]]\n').points()[0]
    assert sweep.cached(cfg, tmp_path) is None
    d = sweep.point_dir(cfg, tmp_path)
    d.mkdir(parents=True)
    kit = find_kit()
    verilog = "module layer();\nendmodule\n"
    digest = verilog_digest(verilog)
    rtl = {"rtl__fingerprint": synthesis_fingerprint(digest, cfg.hash(), kit), "rtl__verilog_digest": digest,
           "rtl__generator": generator_record()}
    (d / sweep.RESULT_FILE).write_text(json.dumps({"config_hash": cfg.name, "config": cfg.to_dict(), **rtl}))
    assert sweep.cached(cfg, tmp_path)["config_hash"] == cfg.name
    assert sweep.cached(other, tmp_path) is None
    # a result left by other values under this name is not taken
    (d / sweep.RESULT_FILE).write_text(json.dumps({"config_hash": cfg.name, "config": other.to_dict(), **rtl}))
    assert sweep.cached(cfg, tmp_path) is None
    # nor one of other Verilog (or made before fingerprints were recorded)
    for stale in ({**rtl, "rtl__fingerprint": "0" * 16}, {}):
        (d / sweep.RESULT_FILE).write_text(json.dumps({"config_hash": cfg.name, "config": cfg.to_dict(), **stale}))
        assert sweep.cached(cfg, tmp_path) is None
    # the generator's sources changed since: today's Verilog decides (generated, here faked)
    moved = {**rtl, "rtl__generator": {**rtl["rtl__generator"], "hash": "changed"}}
    (d / sweep.RESULT_FILE).write_text(json.dumps({"config_hash": cfg.name, "config": cfg.to_dict(), **moved}))
    monkeypatch.setattr(bench, "chip_verilog", lambda c: verilog)
    assert sweep.cached(cfg, tmp_path) is not None            # same Verilog: the point is kept
    monkeypatch.setattr(bench, "chip_verilog", lambda c: verilog + "wire w;\n")
    assert sweep.cached(cfg, tmp_path) is None                # other Verilog: recomputed


def test_pareto_small_example():
    pts = [{"config_hash": n, "area_um2": a, "tokens_per_s": t}
           for n, a, t in [("a", 1, 10), ("b", 2, 20), ("c", 2, 15), ("d", 3, 20), ("e", 4, 30), ("f", 5, None)]]
    assert [p["config_hash"] for p in sweep.pareto(pts)] == ["a", "b", "e"]


def test_pareto_matches_the_definition_on_random_points():
    rng = random.Random(7)
    for _ in range(50):
        pts = [{"config_hash": str(i), "area_um2": rng.randint(1, 8), "tokens_per_s": rng.randint(1, 8)}
               for i in range(rng.randint(1, 12))]
        front = sweep.pareto(pts)

        def beats(q, p):
            return (q["area_um2"] <= p["area_um2"] and q["tokens_per_s"] >= p["tokens_per_s"]
                    and (q["area_um2"], q["tokens_per_s"]) != (p["area_um2"], p["tokens_per_s"]))
        names = {p["config_hash"] for p in front}
        for p in pts:
            assert (p["config_hash"] in names) == (not any(beats(q, p) for q in pts))


def test_reports_table_and_plot(tmp_path):
    pts = [{"config_hash": f"h{i}", "lanes": 2 ** i, "weight_port_bytes": 2 ** i, "n_experts": 4, "top_k": 2,
            "d_model": 16, "clock_period_ns": 1.25, "area_um2": 1e5 * (i + 1), "fmax_mhz": 500.0,
            "cycles_per_token": 1000.0 / (i + 1), "roofline_bound": 900.0 / (i + 1), "utilisation": 0.9,
            "tokens_per_s": 5e5 * (i + 1) if i != 1 else 1e5, "energy_per_token_nj": 1.0} for i in range(3)]
    md, png = sweep.write_reports(pts, ["lanes=3: refused"], [], tmp_path, "moekda sweep --local",
                                  pending=["abc123"])
    text = md.read_text()
    assert "not measured yet" in text and "- abc123" in text
    front_part = text.split("## All points")[0]
    assert "| h0 |" in front_part and "| h2 |" in front_part and "| h1 |" not in front_part
    assert "lanes=3: refused" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_without_ray_says_how_to_get_it(tmp_path):
    """Ray hidden (a ray module that fails to import, first on the path), as on a fresh set-up."""
    (tmp_path / "ray.py").write_text("raise ImportError('no ray here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "cli", "sweep"], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install -e '.[sweep]'" in lines[0] and "--local" in lines[0]


def test_point_config_file_round_trips(tmp_path):
    """A point's config.toml (what the simulation bench reloads) gives back the same values."""
    from moekda.config import load_config
    cfg = _grid(tmp_path, '[grid]\n"lanes+weight_port_bytes" = [[2, 2]]\nrouted_scaling = [1.5]\n').points()[0][0]
    f = tmp_path / "point.toml"
    f.write_text(sweep.to_toml(cfg.to_dict() | {"name": cfg.name}))
    back = load_config(f)
    assert back.to_dict() == cfg.to_dict() and back.name == cfg.name
