# 5_2 detailed routing on the global route's guides (kept in the database);
# every remaining design-rule violation is listed in 5_route_drc.rpt.
source [file join [file dirname [info script]] common.tcl]
load_design global_route
set_propagated_clock [all_clocks]

detailed_route \
  -output_drc [report_file 5_route_drc.rpt] \
  -bottom_routing_layer $::cfg(MIN_ROUTING_LAYER) \
  -top_routing_layer $::cfg(MAX_ROUTING_LAYER) \
  -verbose 1

save_design detail_route
