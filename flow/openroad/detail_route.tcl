# 5_2 detailed routing on the global route's guides (kept in the database);
# every remaining design-rule violation is listed in 5_route_drc.rpt.  The
# layers come from set_routing_layers: OpenROAD 26Q3 rejects detailed_route's
# own -bottom/-top_routing_layer (DRT-0509).  Antennas left by the route are
# repaired with diodes and the changed nets routed again, as ORFS does.
source [file join [file dirname [info script]] common.tcl]
load_design global_route
set_propagated_clock [all_clocks]
set_routing_resources

# the pass limit is the mode's (flow/pnr.py PNR_MODES): OpenROAD's default 64 for
# sign-off; the fast mode stops earlier with what violations remain
set route_args [list -output_drc [report_file 5_route_drc.rpt] -drc_report_iter_step 5 \
                     -droute_end_iter $::cfg(DETAILED_ROUTE_END_ITERATION) -save_guide_updates -verbose 1]
detailed_route {*}$route_args

set iterations 0
while {[check_antennas] && $iterations < 5} {
  repair_antennas
  detailed_route {*}$route_args
  incr iterations
}
check_antennas -report_file [report_file 5_route_antennas.rpt]
write_metrics [report_file 5_route_antennas.metrics] \
  [dict create detailedroute__antenna__violating__nets [check_antennas] \
               detailedroute__antenna__repair__iterations $iterations]

save_design detail_route
