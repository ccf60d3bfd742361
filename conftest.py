"""Settings every test run needs."""
import sys

# the parameter bank is one signal of ~30 000 bits (hw/image/param_map.py): Amaranth's Python
# simulator writes such values as integer literals longer than Python's default limit
sys.set_int_max_str_digits(0)
