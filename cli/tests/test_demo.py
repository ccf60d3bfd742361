"""`moekda demo` (issue 16): the committed trained model through float, integer and RTL.

A short demo (3 held-out examples, one of them on the RTL) must agree token for token
between the chip and the integer model (the command refuses otherwise), score the chip's
own argmax, and refuse bad options with one line, exit code 2."""
import json

import pytest

from cli import main
from sim.cocotb_util import simulator_available


@pytest.mark.verilator
@pytest.mark.skipif(not simulator_available("verilator"), reason="verilator not installed")
def test_demo_scores_the_chip_like_the_integer_model(tmp_path, capsys):
    assert main(["demo", "--run", "train/runs/model-tiny-mqar4", "--examples", "3", "--rtl-examples", "1",
                 "--calib-examples", "4", "-o", str(tmp_path)]) == 0
    rec, = json.loads((tmp_path / "demo.json").read_text())
    s = rec["scores"]
    assert rec["rtl"]["match"] and rec["rtl"]["tokens"] == 64
    assert s["RTL"]["hits"] == s["integer, same tokens"]["hits"] and s["RTL"]["scored"] == 4
    assert s["float"]["scored"] == s["integer"]["scored"] == 12
    assert 0 <= s["integer"]["bits_per_token"] < 10
    assert (tmp_path / "model-tiny-mqar4" / "image.bin").stat().st_size > 0
    assert "| mqar (model-tiny) | RTL | 1 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv,names", [
    (["--run", "no/such/run"], "--run no/such/run: no run.json"),
    (["--run", "train/runs/model-tiny-mqar4", "--rtl-tokens", "65"], "--rtl-tokens 65: allowed range is 1 to 64"),
    (["--run", "train/runs/model-tiny-mqar4", "--examples", "2", "--rtl-examples", "3"], "--rtl-examples 3: allowed range is 0 to --examples (2)"),
    (["--run", "train/runs/model-tiny-mqar4", "--calib-examples", "0"], "--calib-examples 0: allowed range is 1 to"),
    (["-c", "model-small", "--run", "train/runs/model-tiny-mqar4"],
     "-c model-small: the run train/runs/model-tiny-mqar4 is of config model-tiny"),
])
def test_demo_refuses_bad_options(argv, names, capsys):
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and names in err, err


def test_demo_netlist_needs_a_synthesis_first(capsys):
    from flow.paths import BuildPaths
    from moekda.config import load_config
    if BuildPaths.for_config(load_config("model-tiny"), "layer").netlist.is_file():
        pytest.skip("model-tiny is synthesised here: --netlist would run the gate-level simulation")
    assert main(["demo", "--run", "train/runs/model-tiny-mqar4", "--netlist", "--examples", "1"]) == 2
    err = capsys.readouterr().err
    assert "--netlist: no netlist of today's Verilog" in err and "make synth CONFIG=model-tiny" in err
