"""A result's fingerprint follows what decides it: the Verilog, the config, the cell library.

Today's failure modes it closes (issue 18, item 6): a hand-kept list of "generator sources"
counted a measurement script (hw/arith/delay_probes.py: editing it discarded good
syntheses) and missed files the result depended on (a stale synthesis reused).
"""
from __future__ import annotations

import shutil
import sys

import pytest

from moekda.config import load_config
from flow.fingerprint import (REPO_ROOT, generator_record, generator_unchanged, kit_fingerprint,
                                stale_reason, synthesis_fingerprint, verilog_digest)

VERILOG = "module layer(input clk);\nendmodule\n"


@pytest.fixture
def liberty(tmp_path):
    lib = tmp_path / "cells.lib"
    lib.write_text("library (cells) { }\n")
    return lib


def test_the_fingerprint_moves_with_verilog_config_and_library_only(liberty):
    cfg, other = load_config("tiny"), load_config("small")
    fp = synthesis_fingerprint(verilog_digest(VERILOG), cfg.hash(), liberty)
    assert fp == synthesis_fingerprint(verilog_digest(VERILOG), cfg.hash(), liberty)
    assert fp != synthesis_fingerprint(verilog_digest(VERILOG + "// x\n"), cfg.hash(), liberty)
    assert fp != synthesis_fingerprint(verilog_digest(VERILOG), other.hash(), liberty)
    assert verilog_digest(["ab", "c"]) != verilog_digest(["a", "bc"])     # file boundaries count
    before = kit_fingerprint(liberty)
    liberty.write_text("library (cells) { cell (X) { } }\n")
    assert kit_fingerprint(liberty) != before
    assert synthesis_fingerprint(verilog_digest(VERILOG), cfg.hash(), liberty) != fp


def _copy_record(record, dst):
    for rel in record["files"]:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, dst / rel)


def test_the_record_holds_what_the_generator_loaded_and_not_a_measurement_script():
    """After generating a block's Verilog, the record names the generator's modules (found,
    not listed) and leaves out what it never imports: the delay-probe measurement script, the
    float model, the tests."""
    from hw.tops import top_verilog
    top_verilog("matvec", load_config("tiny"))
    files = generator_record()["files"]
    assert "hw/arith/matvec.py" in files and "moekda/config.py" in files and "hw/tops.py" in files
    if "hw.arith.delay_probes" not in sys.modules:     # unless this process imported it itself
        assert "hw/arith/delay_probes.py" not in files
    assert not [f for f in files if "/tests/" in f or f.startswith(".venv")]


def test_stale_only_when_the_verilog_changes(tmp_path, liberty):
    """A source edit makes the check regenerate the Verilog: the same text keeps the result
    (never discard a good one), another text drops it (never reuse a stale one)."""
    from hw.tops import top_verilog
    top_verilog("matvec", load_config("tiny"))
    record = generator_record()
    _copy_record(record, tmp_path)
    cfg = load_config("tiny")
    digest = verilog_digest(VERILOG)
    stored = {"rtl__fingerprint": synthesis_fingerprint(digest, cfg.hash(), liberty),
              "rtl__verilog_digest": digest, "rtl__generator": record}
    calls = []

    def generate(text):
        return lambda: calls.append(text) or text

    # sources as recorded: the stored digest is trusted, nothing is generated
    assert stale_reason(stored, cfg.hash(), liberty, generate("never"), root=tmp_path) is None
    assert not calls
    # a comment in a generator file: regenerated, same Verilog, kept
    with open(tmp_path / "hw/arith/matvec.py", "a") as f:
        f.write("# a comment\n")
    assert not generator_unchanged(record, tmp_path)
    assert stale_reason(stored, cfg.hash(), liberty, generate(VERILOG), root=tmp_path) is None
    # a change that alters the Verilog: stale
    assert stale_reason(stored, cfg.hash(), liberty, generate(VERILOG + "wire w;\n"), root=tmp_path)
    # another config, or no fingerprint at all (a result from before they were recorded)
    assert stale_reason(stored, load_config("small").hash(), liberty, generate(VERILOG), root=tmp_path)
    assert "no RTL fingerprint" in stale_reason({}, cfg.hash(), liberty, generate(VERILOG))


def test_a_new_package_version_is_a_source_change(tmp_path, monkeypatch):
    from flow import fingerprint
    record = generator_record()
    assert generator_unchanged(record)
    real = fingerprint._versions
    monkeypatch.setattr(fingerprint, "_versions", lambda: real() | {"amaranth": "0.0.0"})
    assert not generator_unchanged(record)


def test_bench_keeps_a_synthesis_of_todays_verilog_and_drops_another(tmp_path, monkeypatch):
    import json

    from studies import bench
    from flow.paths import BuildPaths
    from pdk.kit import find_kit
    cfg = load_config("tiny")
    kit = find_kit()
    digest = verilog_digest(VERILOG)
    metrics = BuildPaths.for_config(cfg, "layer", build_root=tmp_path).make_dirs().metrics
    metrics.write_text(json.dumps({"design__name": "layer", "config__hash": cfg.hash(), "rtl__verilog_digest": digest,
                                   "rtl__fingerprint": synthesis_fingerprint(digest, cfg.hash(), kit)}))
    monkeypatch.setattr(bench, "chip_verilog", lambda c: VERILOG)       # today's chip, faked
    m, note = bench.synth_metrics(cfg, build_root=tmp_path)
    assert m is not None and note == ""
    monkeypatch.setattr(bench, "chip_verilog", lambda c: VERILOG + "wire w;\n")
    m, note = bench.synth_metrics(cfg, build_root=tmp_path)
    assert m is None and "stale" in note


def test_an_sram_macro_library_is_part_of_the_kit(tmp_path):
    """An SRAM config's netlist maps to the macros' Liberty too: a change there is a new kit."""
    import dataclasses

    from pdk.kit import find_kit
    kit = find_kit()
    if not kit.macros:
        pytest.skip("this kit has no SRAM macros")
    lib = tmp_path / "macro.lib"
    lib.write_bytes(kit.macros[0].liberty.read_bytes())
    mine = dataclasses.replace(kit, macros=(dataclasses.replace(kit.macros[0], liberty=lib), *kit.macros[1:]))
    assert kit_fingerprint(mine) == kit_fingerprint(kit)
    with open(lib, "a") as f:
        f.write("\n/* edited */\n")
    assert kit_fingerprint(mine) != kit_fingerprint(kit)
