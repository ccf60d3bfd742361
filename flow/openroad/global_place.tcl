# 3_3 global placement, timing- and routability-driven as ORFS runs it;
# the target density comes from the config (pnr.place_density).
source [file join [file dirname [info script]] common.tcl]
load_design pins

# routability mode asks the global router for congestion: it needs the layers
set_routing_resources
# as ORFS does for a block (not a padded chip): a buffer on every port, so the
# block's pins drive and load one known cell whatever the outside wire is
buffer_ports
global_placement -density $::cfg(PLACE_DENSITY) -timing_driven -routability_driven

estimate_parasitics -placement
report_stage 3_global_place globalplace
save_design global_place
