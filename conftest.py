"""Settings every test run needs."""
import sys

import pytest

# the parameter bank is one signal of ~30 000 bits (hw/image/param_map.py): Amaranth's Python
# simulator writes such values as integer literals longer than Python's default limit
sys.set_int_max_str_digits(0)

# A test marked slow (long sequences, big configs: `make sim CONFIG=small`) may take up to an
# hour; the default suite's tests get pyproject.toml's `timeout` (pytest-timeout).  A test
# with its own @pytest.mark.timeout keeps it.
SLOW_TIMEOUT = 3600


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
