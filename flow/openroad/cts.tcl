# 4_1 clock tree synthesis, then repair_timing for setup and hold on the
# real (propagated) clock, re-legalising after each change.
source [file join [file dirname [info script]] common.tcl]
load_design detail_place

repair_clock_inverters
clock_tree_synthesis -root_buf $::cfg(CTS_BUFFER) -buf_list $::cfg(CTS_BUFFER)
set_propagated_clock [all_clocks]

estimate_parasitics -placement
repair_clock_nets
detailed_placement

estimate_parasitics -placement
repair_timing -setup
repair_timing -hold
detailed_placement
check_placement -verbose

estimate_parasitics -placement
report_stage 4_cts cts {report_clock_skew}
save_design cts
