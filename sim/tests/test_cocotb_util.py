"""The one cocotb runner (sim/cocotb_util.py) fails a run in which no test ran."""
import pytest

from sim.cocotb_util import run_cocotb, simulator_available


@pytest.mark.skipif(not simulator_available("icarus"), reason="icarus not installed")
def test_a_run_with_no_test_is_a_failure():
    with pytest.raises(AssertionError, match="no cocotb test ran"):
        run_cocotb("matvec", "tiny", "sim.cocotb.tb_matvec", simulator="icarus",
                   test_name="no_such_test", testcase="no_such_test")
