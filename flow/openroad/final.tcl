# 6 final: parasitics of the routed wires extracted by OpenRCX with the
# platform's rules (rcx_patterns.rules), post-route STA and power, the final
# reports and metrics, and the outputs: ODB, DEF, netlist, SDC, SPEF.
# There is no fallback to an estimate: a post-route number must come from the
# routes.  flow/pnr.py fails the run if the SPEF holds no nets.
source [file join [file dirname [info script]] common.tcl]
load_design fill
set_propagated_clock [all_clocks]

define_process_corner -ext_model_index 0 X
extract_parasitics -ext_model_file $::cfg(RCX_RULES)
write_spef $::cfg(FINAL_SPEF)
read_spef $::cfg(FINAL_SPEF)

report_stage 6_finish finish {report_clock_skew report_power}

write_db $::cfg(FINAL_ODB)
write_def $::cfg(FINAL_DEF)
# the netlist of the logic: fill and tap cells are physical only
write_verilog -remove_cells [concat $::cfg(FILL_CELLS) [list $::cfg(TAPCELL)]] $::cfg(FINAL_NETLIST)
write_sdc $::cfg(FINAL_SDC)
