# 6 final: parasitics of the routed wires (SPEF), post-route STA and power,
# the final reports and metrics, and the outputs: ODB, DEF, netlist, SDC.
source [file join [file dirname [info script]] common.tcl]
load_design fill
set_propagated_clock [all_clocks]

# The kit has no OpenRCX rules file: extract the routed wires with the LEF's
# per-layer R and C.  An OpenROAD without -lef_rc falls back to the estimate
# from the global route, and failing that from placement; the metric
# finish__parasitics__extracted says which (1 extracted, 0 estimated).
set extracted 1
if {[catch {extract_parasitics -lef_rc} message]} {
  set extracted 0
  puts "moekda: extract_parasitics -lef_rc failed ($message); estimating from the global route"
  if {[catch {estimate_parasitics -global_routing -spef_file $::cfg(FINAL_SPEF)} message]} {
    puts "moekda: no global route in the database ($message); estimating from placement"
    estimate_parasitics -placement -spef_file $::cfg(FINAL_SPEF)
  }
} else {
  write_spef $::cfg(FINAL_SPEF)
}
read_spef $::cfg(FINAL_SPEF)

report_stage 6_finish finish {report_clock_skew report_power}
write_metrics [report_file 6_parasitics.metrics] [dict create finish__parasitics__extracted $extracted]

write_db $::cfg(FINAL_ODB)
write_def $::cfg(FINAL_DEF)
# the netlist of the logic: fill and tap cells are physical only
write_verilog -remove_cells [concat $::cfg(FILL_CELLS) [list $::cfg(TAPCELL)]] $::cfg(FINAL_NETLIST)
write_sdc $::cfg(FINAL_SDC)
