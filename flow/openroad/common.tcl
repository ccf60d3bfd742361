# Shared by every stage script: the generated settings and the procs all
# stages use.  flow/pnr.py writes the settings (build/<config>/pnr/config.tcl)
# and names the file in MOEKDA_PNR_CONFIG; nothing here knows a number.
source $::env(MOEKDA_PNR_CONFIG)
source [file join [file dirname [info script]] metrics.tcl]

proc report_file {name} {
  return [file join $::cfg(REPORTS_DIR) $name]
}

# The database a stage writes; the next stage reads it (ORFS's 2_1_floorplan.odb ...).
proc stage_odb {stage} {
  return $::cfg(ODB,$stage)
}

# Wire RC for estimates.  repair_design refuses to run before set_wire_rc, so
# every stage sets it right after loading.
proc set_platform_parasitics {} {
  foreach rc $::cfg(LAYER_RC) {
    lassign $rc layer res cap
    set_layer_rc -layer $layer -resistance $res -capacitance $cap
  }
  set_wire_rc -signal -layer $::cfg(WIRE_RC_SIGNAL_LAYER)
  set_wire_rc -clock -layer $::cfg(WIRE_RC_CLOCK_LAYER)
}

# Liberty timing and the SDC are not kept in the ODB: read them in every stage.
proc load_design {previous_stage} {
  foreach lib $::cfg(LIB_FILES) {
    read_liberty $lib
  }
  read_db [stage_odb $previous_stage]
  read_sdc $::cfg(SDC_FILE)
  set_platform_parasitics
  # the tap cell and the cells ORFS keeps out of Nangate45 designs
  set_dont_use $::cfg(DONT_USE_CELLS)
}

proc save_design {stage} {
  write_db [stage_odb $stage]
}

# Global-routing resources, as ORFS's nangate45 fastroute.tcl sets them: the
# lower layers lose capacity to cell pins, so less of them is offered.
proc set_routing_resources {} {
  foreach adjustment $::cfg(GRT_ADJUSTMENTS) {
    lassign $adjustment layers fraction
    set_global_routing_layer_adjustment $layers $fraction
  }
  set_routing_layers \
    -signal $::cfg(MIN_ROUTING_LAYER)-$::cfg(MAX_ROUTING_LAYER) \
    -clock $::cfg(MIN_CLOCK_ROUTING_LAYER)-$::cfg(MAX_ROUTING_LAYER)
}

proc banner {title} {
  puts "\n=========================================================================="
  puts $title
  puts "--------------------------------------------------------------------------"
}

# A stage's report (reports/<name>.rpt, also in the stage log) and its metrics
# (reports/<name>.metrics, "name value" lines with ORFS's metric names).
proc report_stage {name metric_stage {extra {}}} {
  log_begin [report_file $name.rpt]
  banner "report_checks -path_delay max"
  report_checks -path_delay max -fields {slew capacitance input_pin net fanout} -format full_clock_expanded
  banner "report_checks -path_delay min"
  report_checks -path_delay min -fields {slew capacitance input_pin net fanout} -format full_clock_expanded
  banner "report_tns"
  report_tns
  banner "report_wns"
  report_wns
  banner "report_worst_slack"
  report_worst_slack -max
  report_worst_slack -min
  banner "report_check_types -max_slew -max_capacitance -max_fanout -violators"
  report_check_types -max_slew -max_capacitance -max_fanout -violators
  foreach section $extra {
    banner $section
    eval $section
  }
  banner "report_design_area"
  report_design_area
  log_end
  write_metrics [report_file $name.metrics] \
    [dict merge [timing_power_metrics $metric_stage] [physical_metrics $metric_stage $::cfg(FILL_CELLS)]]
}
