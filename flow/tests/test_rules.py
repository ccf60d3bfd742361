"""Metric rules (flow/rules.py, `moekda rules`, the check at the end of `moekda bench`): every
committed record holds its committed rules, a record that regresses is caught, and bad input
is one line, exit code 2.  No simulation, no synthesis: seconds."""
from __future__ import annotations

import json

import pytest

from flow import rules
from studies import bench
from flow.paths import RESULTS_DIR, RULES_DIR
from cli import main
from moekda.config import REPO_ROOT

CONFIGS = REPO_ROOT / "configs"


def _bench_records() -> list[str]:
    """The configs with a `moekda bench` record (bench/results/<config>.json of a config)."""
    return sorted(p.stem for p in RESULTS_DIR.glob("*.json") if (CONFIGS / f"{p.stem}.toml").is_file())


def _ruled() -> list[str]:
    return sorted(p.stem for p in RULES_DIR.glob("*.json"))


# ---- the committed records against the committed rules --------------------------------------

@pytest.mark.parametrize("config", _ruled())
def test_committed_record_holds_its_rules(config):
    """A record that regresses cannot be committed silently: it fails here, metric by metric."""
    path = rules.rules_path(config)
    r = rules.load_rules(path)
    assert r["config"] == config, f"{path} holds the rules of {r['config']}"
    bad = rules.check(rules.load_record(rules.record_path(config)), r, path, rules.record_path(config))
    assert not bad, "; ".join(v.line() for v in bad)


def test_every_bench_record_has_rules_or_a_reason():
    assert "tiny" in _ruled()
    records = _bench_records()
    unruled = [c for c in records if c not in _ruled() and c not in rules.NOT_YET_RULED]
    assert not unruled, (f"bench records without rules: {unruled}; `moekda rules -c CONFIG --update` "
                         "writes them (or say why not in flow/rules.py NOT_YET_RULED)")
    both = [c for c in rules.NOT_YET_RULED if c in _ruled()]
    assert not both, f"{both} have rules now: drop them from flow/rules.py NOT_YET_RULED"
    gone = [c for c in rules.NOT_YET_RULED if c not in records]
    assert not gone, f"{gone} in NOT_YET_RULED have no bench record"
    orphans = [c for c in _ruled() if c not in records]
    assert not orphans, f"rules without a bench record: {orphans}"


# ---- the checker ---------------------------------------------------------------------

def _tiny():
    """tiny's committed record and rules (the record may have been regenerated since the
    rules: the tests below move a metric past its rule, whatever its value today)."""
    return rules.load_record(rules.record_path("tiny")), rules.load_rules(rules.rules_path("tiny"))


def _past(metric: str, rule: dict) -> float:
    """A value just on the wrong side of ``rule``."""
    v = rule["value"]
    return v * 1.001 if rule["compare"] == "<=" else v * 0.999


@pytest.mark.parametrize("metric", ["area_um2", "fmax_mhz", "cycles_per_token", "measured_weight_bytes_per_token",
                                    "energy_per_token_nj_simulated", "sequential_share"])
def test_a_doctored_record_is_caught(metric):
    rec, r = _tiny()
    assert not rules.check(rec, r, rules.rules_path("tiny"))
    bad = rules.check({**rec, metric: _past(metric, r["rules"][metric])}, r, rules.rules_path("tiny"))
    assert [v.metric for v in bad] == [metric]
    assert metric in bad[0].line() and r["rules"][metric]["compare"] in bad[0].line()


def test_ten_percent_loss_of_area_or_fmax_fails():
    """Issue 49: a change that loses 10 % of area or Fmax must not pass."""
    rec, r = _tiny()
    for metric, factor in (("area_um2", 1.10), ("fmax_mhz", 0.90)):
        assert [v.metric for v in rules.check({**rec, metric: rec[metric] * factor}, r, rules.rules_path("tiny"))] \
            == [metric]


def test_the_command_prints_one_line_per_violated_rule(tmp_path, capsys):
    rec, r = _tiny()
    doctored = {**rec, "area_um2": _past("area_um2", r["rules"]["area_um2"]),
                "fmax_mhz": _past("fmax_mhz", r["rules"]["fmax_mhz"])}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(doctored))
    assert main(["rules", "-c", "tiny", "--record", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3, err
    assert err[0].startswith("moekda rules: tiny: area_um2 = ") and "violates rule <= " in err[0]
    assert err[1].startswith("moekda rules: tiny: fmax_mhz = ") and "violates rule >= " in err[1]
    assert "2 of " in err[2] and "--update" in err[2]
    assert main(["rules", "-c", "tiny"]) == 0        # the committed record


def _one_line_error(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert all(w in err[0] for w in words), err[0]
    return err[0]


def test_a_metric_the_record_lacks_is_one_line(tmp_path, capsys):
    rec, _ = _tiny()
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({k: v for k, v in rec.items() if k != "energy_per_token_nj_simulated"}))
    _one_line_error(capsys, ["rules", "-c", "tiny", "--record", str(path)],
                    "has no energy_per_token_nj_simulated", "moekda power -c tiny --synth")
    path.write_text(json.dumps({**rec, "area_um2": None}))
    _one_line_error(capsys, ["rules", "-c", "tiny", "--record", str(path)], "has no area_um2", "--synth")


def test_a_bench_run_notes_a_metric_it_did_not_measure_and_checks_the_rest(tmp_path, capsys):
    rec, ruled = _tiny()
    rules_file = tmp_path / "tiny.json"
    rules_file.write_text(json.dumps(ruled))
    fresh = {k: v for k, v in rec.items() if k != "energy_per_token_nj_simulated"}
    assert rules.report("tiny", fresh, rules_file=rules_file, prog="moekda bench", missing_ok=True) == 0
    out = capsys.readouterr().out
    assert "energy_per_token_nj_simulated not measured by this run" in out and "moekda power -c tiny" in out
    # what it does measure is still checked
    worse = {**fresh, "area_um2": _past("area_um2", ruled["rules"]["area_um2"])}
    assert rules.report("tiny", worse, rules_file=rules_file, prog="moekda bench", missing_ok=True) == 1


def test_a_record_of_another_config_is_refused(tmp_path, capsys):
    rec, _ = _tiny()
    path = tmp_path / "x.json"
    path.write_text(json.dumps({**rec, "config": "small"}))
    _one_line_error(capsys, ["rules", "-c", "tiny", "--record", str(path)], "rules of config 'tiny'", "'small'")


GOOD = {"config": "tiny", "from": {"commit": None, "date": None},
        "rules": {"area_um2": {"value": 1.0, "compare": "<="}}}


@pytest.mark.parametrize("text, words", [
    ("{not json", ["not a JSON rules file"]),
    ("[1, 2]", ["a rules file is a JSON object"]),
    (json.dumps({**GOOD, "tolerance": 0.1}), ["top-level keys", "config, from, rules"]),
    (json.dumps({**GOOD, "rules": {}}), ["rules must be a non-empty object"]),
    (json.dumps({**GOOD, "rules": {"area": {"value": 1, "compare": "<="}}}),
     ["rules.area: unknown metric", "allowed: area_um2", "fmax_mhz"]),
    (json.dumps({**GOOD, "rules": {"fmax_mhz": {"value": 1, "compare": "<="}}}),
     ["rules.fmax_mhz.compare = '<='", "allowed '>='"]),
    (json.dumps({**GOOD, "rules": {"area_um2": {"value": "big", "compare": "<="}}}),
     ["rules.area_um2.value = 'big'", "finite number"]),
    (json.dumps({**GOOD, "rules": {"area_um2": {"value": 1, "compare": "<=", "tol": 2}}}),
     ["rules.area_um2", "exactly value and compare"]),
    (json.dumps({**GOOD, "rules": {"energy_per_token_nj": {"value": 1, "compare": "<="},
                                   "energy_per_token_nj_simulated": {"value": 1, "compare": "<="}}}),
     ["both energy_per_token_nj_simulated and energy_per_token_nj"]),
    (json.dumps({**GOOD, "config": 3}), ["config = 3"]),
])
def test_a_bad_rules_file_is_one_line(tmp_path, capsys, text, words):
    path = tmp_path / "tiny.json"
    path.write_text(text)
    line = _one_line_error(capsys, ["rules", "-c", "tiny", "--rules", str(path)], *words)
    assert str(path) in line


def test_no_rules_file_says_how_to_write_one(tmp_path, capsys):
    _one_line_error(capsys, ["rules", "-c", "tiny", "--rules", str(tmp_path / "none.json")],
                    "no rules file", "--update")


# ---- generating --------------------------------------------------------------------

def test_lenient_rounding_keeps_the_record_passing():
    assert rules.lenient_round(267_214.1, "<=") == 267_220.0
    assert rules.lenient_round(854.667, ">=") == 854.66
    assert rules.lenient_round(0.505213, "<=") == 0.50522
    assert rules.lenient_round(100.0, "<=") == 100.0


def test_rules_are_the_record_with_its_tolerances(tmp_path):
    rec, _ = _tiny()
    new = rules.generate(rec, rules.record_path("tiny"))
    assert new["config"] == "tiny" and new["from"] == {"commit": rec["commit"], "date": rec["date"]}
    assert list(new["rules"]) == [m for m in rules.METRICS if m != rules.ESTIMATED_ENERGY]   # simulated energy
    for m, rule in new["rules"].items():
        tol = rules.METRICS[m].tolerance
        if rule["compare"] == "<=":
            assert rec[m] * (1 + tol) <= rule["value"] <= rec[m] * (1 + tol) * 1.0001
        else:
            assert rec[m] * (1 - tol) * 0.9999 <= rule["value"] <= rec[m] * (1 - tol)
    assert not rules.check(rec, new, tmp_path / "r.json")
    # without the simulated figure: the estimate
    est = rules.generate({**rec, "energy_per_token_nj_simulated": None}, rules.record_path("tiny"))
    assert "energy_per_token_nj" in est["rules"] and "energy_per_token_nj_simulated" not in est["rules"]


def test_a_record_without_synthesis_makes_no_rules(tmp_path, capsys):
    rec, _ = _tiny()
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({**rec, "area_um2": None, "fmax_mhz": None}))
    _one_line_error(capsys, ["rules", "-c", "tiny", "--record", str(path), "--rules", str(tmp_path / "r.json"),
                             "--update"], "has no area_um2, fmax_mhz", "--synth")


def test_update_and_tighten(tmp_path, capsys):
    rec, _ = _tiny()
    rpath, out = tmp_path / "rec.json", tmp_path / "rules.json"
    rpath.write_text(json.dumps(rec))
    assert main(["rules", "-c", "tiny", "--record", str(rpath), "--rules", str(out), "--update"]) == 0
    first = rules.load_rules(out)
    # a better area and a worse Fmax: --tighten takes the one, keeps the other rule
    rpath.write_text(json.dumps({**rec, "area_um2": rec["area_um2"] * 0.9, "fmax_mhz": rec["fmax_mhz"] * 0.99}))
    assert main(["rules", "-c", "tiny", "--record", str(rpath), "--rules", str(out), "--tighten"]) == 0
    tight = rules.load_rules(out)
    assert tight["rules"]["area_um2"]["value"] < first["rules"]["area_um2"]["value"]
    assert tight["rules"]["fmax_mhz"] == first["rules"]["fmax_mhz"]
    assert "area_um2: <= " in capsys.readouterr().out


# ---- `moekda bench` checks its record --------------------------------------------------

def _fake_bench(monkeypatch, area_factor: float):
    """`moekda bench -c tiny` with the committed record's figures standing in for the
    simulation and the synthesis, the area scaled by ``area_factor``."""
    rec, _ = _tiny()

    def fake_simulate(config, tokens, simulator, seed=0):
        return {"simulator": simulator, "tokens": tokens, "cycles_per_token": rec["cycles_per_token"],
                "weight_bytes": rec["measured_weight_bytes_per_token"] * tokens, "load_bytes": 0,
                "tokens_counted": tokens, "run_s": 1.0, "build_s": 1.0, "sim_cycles": 1, "sim_s": 1.0,
                "cycles_per_s": 1.0, "token_cycles_at": {str(p): None for p in bench.CONTEXTS}}
    synth = {"fmax": rec["fmax_mhz"], "synth__design__instance__area": rec["area_um2"] * area_factor,
             "synth__design__instance__area__sequential": rec["sequential_area_um2"],
             "power__total": rec["power_w"],
             "synth__power__activity__energy_per_token__j": rec["energy_per_token_nj_simulated"] * 1e-9}
    monkeypatch.setattr(bench, "simulate", fake_simulate)
    monkeypatch.setattr(bench, "synth_metrics", lambda cfg: (synth, ""))


def test_bench_passes_a_record_within_its_rules(tmp_path, monkeypatch, capsys):
    _fake_bench(monkeypatch, 1.0)
    assert main(["bench", "-c", "tiny", "--tokens", "16", "--speed-tokens", "0", "--out", str(tmp_path)]) == 0
    assert "metric rules of bench/rules/tiny.json hold" in capsys.readouterr().out


def test_bench_fails_loudly_on_a_regression(tmp_path, monkeypatch, capsys):
    _fake_bench(monkeypatch, 1.10)      # 10 % more area (the sequential share falls with it)
    assert main(["bench", "-c", "tiny", "--tokens", "16", "--speed-tokens", "0", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("moekda bench: tiny: area_um2 = ") and "violates rule <=" in err[0]
    assert len(err) == 2 and "1 of " in err[1]
    assert (tmp_path / "tiny.json").is_file()        # the record is written, to be looked at
    assert main(["bench", "-c", "tiny", "--tokens", "16", "--speed-tokens", "0", "--out", str(tmp_path),
                 "--no-rules"]) == 0
