# 5_1 global routing: route guides for the detailed router, and a congestion
# report; timing on the global-route parasitics.
source [file join [file dirname [info script]] common.tcl]
load_design cts
set_propagated_clock [all_clocks]

set_routing_resources
global_route -congestion_report_file [report_file 5_global_route_congestion.rpt] -verbose

estimate_parasitics -global_routing
report_stage 5_global_route globalroute {report_clock_skew}
save_design global_route
