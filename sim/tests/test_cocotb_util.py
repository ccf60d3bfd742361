"""The one cocotb runner (sim/cocotb_util.py) fails a run in which no test ran."""
import pytest

from sim.cocotb_util import run_cocotb, simulator_available


@pytest.mark.skipif(not simulator_available("icarus"), reason="icarus not installed")
def test_a_run_with_no_test_is_a_failure():
    with pytest.raises(AssertionError, match="no cocotb test ran"):
        run_cocotb("matvec", "tiny", "sim.cocotb.tb_matvec", simulator="icarus",
                   test_name="no_such_test", testcase="no_such_test")


@pytest.mark.skipif(not simulator_available("icarus"), reason="icarus not installed")
def test_a_run_of_a_missing_bench_is_a_failure():
    """A misspelt test module: the simulator starts, cocotb cannot import it, no results file."""
    with pytest.raises(AssertionError, match="simulation did not finish|no cocotb test ran"):
        run_cocotb("matvec", "tiny", "sim.cocotb.no_such_bench", simulator="icarus", test_name="no_such_bench")
