# 5_1 global routing, then ORFS's repair on the global route's parasitics:
# repair_design and repair_timing (setup and hold) with incremental global
# routing and re-legalisation after each, a last setup pass that may reroute,
# antenna repair; route guides for the detailed router.
source [file join [file dirname [info script]] common.tcl]
load_design cts
set_propagated_clock [all_clocks]

# an antenna diode on each net the layout gives no n-diffusion (the block's input ports,
# the SRAM macros' outputs: diodes.tcl says why), placed beside the net's first gate and
# legalised, before the router's pin access and first route see the cells
set diodes [place_antenna_diodes {*}$::cfg(ANTENNA_DIODE) $::cfg(ANTENNA_DIODE_PORTS) \
              $::cfg(ANTENNA_DIODE_MACROS)]
puts "antenna diodes on nets without n-diffusion: $diodes"
write_metrics [report_file 5_antenna_net_diodes.metrics] \
  [dict create globalroute__antenna__net_diodes $diodes]
if {$diodes > 0} {
  # their supply pins join VDD/VSS by the rules the power-grid stage stored
  global_connect
  detailed_placement
  check_placement -verbose
}

set_routing_resources
pin_access
# -allow_congestion: the tiny layer's first route ended with 167 overflowing edges of
# 4.3 million (GRT-0116, an error without it); the detailed router clears an overflow
# that small, and its DRC count (which must be 0) is the judge.  The overflow left is
# recorded (globalroute__congestion__overflow, from the log).
global_route -congestion_report_file [report_file 5_global_route_congestion.rpt] \
  -congestion_iterations 30 -allow_congestion -verbose
estimate_parasitics -global_routing
report_stage 5_global_route_pre_repair globalroute_pre_repair

# the placement parasitics CTS was repaired on are not the global route's (the fast
# mode, SKIP_INCREMENTAL_REPAIR, keeps CTS's repair and goes on to the antennas).  Every
# global_route call sets the congestion rule anew from its own flags (26Q3's
# GlobalRouter.tcl), so the incremental ones repeat -allow_congestion: without it the
# tiny layer's re-route after repair_design stopped with GRT-0232 at 328 overflowing edges
if {!$::cfg(SKIP_INCREMENTAL_REPAIR)} {
  repair_design -verbose
  global_route -start_incremental -allow_congestion
  detailed_placement
  global_route -end_incremental -allow_congestion \
    -congestion_report_file [report_file 5_congestion_post_repair_design.rpt]

  estimate_parasitics -global_routing
  repair_timing -setup -hold -repair_tns 100 -verbose
  global_route -start_incremental -allow_congestion
  detailed_placement
  check_placement -verbose
  global_route -end_incremental -allow_congestion \
    -congestion_report_file [report_file 5_congestion_post_repair_timing.rpt]

  estimate_parasitics -global_routing
  repair_timing -setup -sequence "reroute" -skip_last_gasp -repair_tns 0 -verbose
}

# repair_antennas resets the congestion rule from its own flags too: without it the
# estimate below found no usable routes (EST-0005) on the congested tiny layer
repair_antennas -iterations 5 -allow_congestion
check_placement -verbose
check_antennas -report_file [report_file 5_global_route_antennas.rpt]

estimate_parasitics -global_routing
report_stage 5_global_route globalroute {report_clock_skew}
save_design global_route
