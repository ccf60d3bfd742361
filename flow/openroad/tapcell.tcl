# 2_2 tapcell: well taps along every row, and at both row ends as end caps.
# The kit's tap cell is WELLTAP_X1 (ORFS's LEF calls it TAPCELL_X1): the
# driver takes the name from pdk/kit.py.
source [file join [file dirname [info script]] common.tcl]
load_design floorplan

tapcell \
  -distance $::cfg(TAPCELL_DISTANCE) \
  -tapcell_master $::cfg(TAPCELL) \
  -endcap_master $::cfg(TAPCELL)

save_design tapcell
