# 4_1 clock tree synthesis, then repair_timing for setup and hold on the
# real (propagated) clock, re-legalising after each change.
source [file join [file dirname [info script]] common.tcl]
load_design detail_place

repair_clock_inverters
# CTS picks its buffers (CLKBUF_X3 here): forcing BUF_X4 cost 21 % more clock power
# on the matvec block than ORFS's run of it (docs/orfs.md)
# sink clustering is off with SRAM macros (flow/pnr.py macro_settings says why)
if {$::cfg(CTS_SINK_CLUSTERING)} {
  clock_tree_synthesis -sink_clustering_enable -repair_clock_nets
} else {
  clock_tree_synthesis -repair_clock_nets
}
set_propagated_clock [all_clocks]

estimate_parasitics -placement
detailed_placement

estimate_parasitics -placement
repair_timing -setup
repair_timing -hold
detailed_placement
check_placement -verbose

estimate_parasitics -placement
report_stage 4_cts cts {report_clock_skew}
save_design cts
