# 3_4 repair_design: buffer long wires and fix slew, capacitance and fanout
# limits on placement parasitics; one tie cell per load.  Hold is left for
# after clock tree synthesis, when clock arrival times are known.
source [file join [file dirname [info script]] common.tcl]
load_design global_place

estimate_parasitics -placement
repair_design

# a single tie cell driving loads across the die makes a long net: give each load its own
foreach tie [list $::cfg(TIE_LO) $::cfg(TIE_HI)] {
  lassign $tie cell port
  repair_tie_fanout [get_lib_pins */$cell/$port]
}

save_design resize
