# Power from simulated switching activity (flow/power.py, `moekda power`): the
# design (the routed database with its extracted SPEF, or a synthesised netlist
# for a pre-layout figure), the VCD of a gate-level run over a window of whole
# tokens, and report_power.  The settings come from the file named by
# MOEKDA_POWER_CONFIG (::pwr(NAME)); nothing here knows a number.
source $::env(MOEKDA_POWER_CONFIG)
source [file join [file dirname [info script]] metrics.tcl]

foreach lib $::pwr(LIB_FILES) {
  read_liberty $lib
}
if {$::pwr(DESIGN_KIND) eq "odb"} {
  read_db $::pwr(DESIGN)
} else {
  read_lef $::pwr(TECH_LEF)
  read_lef $::pwr(CELL_LEF)
  read_verilog $::pwr(DESIGN)
  link_design $::pwr(TOP)
}
read_sdc $::pwr(SDC_FILE)
if {$::pwr(SPEF) ne ""} {
  set_propagated_clock [all_clocks]
  read_spef $::pwr(SPEF)
}

# what the flow reports without a simulation, for comparison: activity on the inputs
set_power_activity -input -activity $::pwr(DEFAULT_ACTIVITY)
lassign [sta::design_power [metrics_corner]] internal switching leakage total
set m [dict create power__default__total $total]

read_vcd -scope $::pwr(SCOPE) -begin_time $::pwr(BEGIN) -end_time $::pwr(END) $::pwr(VCD)
# (26Q3's log_begin leaves its file empty, as common.tcl notes: the report is appended with >>)
close [open $::pwr(REPORT) w]
report_power
report_power >> $::pwr(REPORT)
lassign [sta::design_power [metrics_corner]] internal switching leakage total
dict set m power__vcd__internal__total $internal
dict set m power__vcd__switching__total $switching
dict set m power__vcd__leakage__total $leakage
dict set m power__vcd__total $total
write_metrics $::pwr(METRICS) $m
