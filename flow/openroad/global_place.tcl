# 3_3 global placement, timing- and routability-driven as ORFS runs it (each
# a setting of the run's mode, flow/pnr.py PNR_MODES: the fast mode places
# without timing); the target density comes from the config (pnr.place_density).
source [file join [file dirname [info script]] common.tcl]
load_design pins

# routability mode asks the global router for congestion: it needs the layers
set_routing_resources
# as ORFS does for a block (not a padded chip): a buffer on every port, so the
# block's pins drive and load one known cell whatever the outside wire is
buffer_ports
set gpl_args [list -density $::cfg(PLACE_DENSITY)]
if {$::cfg(GPL_TIMING_DRIVEN)} { lappend gpl_args -timing_driven }
if {$::cfg(GPL_ROUTABILITY_DRIVEN)} { lappend gpl_args -routability_driven }
global_placement {*}$gpl_args

estimate_parasitics -placement
report_stage 3_global_place globalplace
save_design global_place
