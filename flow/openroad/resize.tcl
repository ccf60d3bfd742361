# 3_4 repair_design: buffer long wires and fix slew, capacitance and fanout
# limits on placement parasitics (tie cells were split at floorplan).  Hold is left for
# after clock tree synthesis, when clock arrival times are known.
source [file join [file dirname [info script]] common.tcl]
load_design global_place

estimate_parasitics -placement
repair_design -verbose

save_design resize
