# Shared by every stage script: the generated settings and the procs all
# stages use.  flow/pnr.py writes the settings (build/<config>/pnr/config.tcl)
# and names the file in MOEKDA_PNR_CONFIG; nothing here knows a number.
source $::env(MOEKDA_PNR_CONFIG)
source [file join [file dirname [info script]] metrics.tcl]
source [file join [file dirname [info script]] diodes.tcl]

proc report_file {name} {
  return [file join $::cfg(REPORTS_DIR) $name]
}

# The database a stage writes; the next stage reads it (ORFS's 2_1_floorplan.odb ...).
proc stage_odb {stage} {
  return $::cfg(ODB,$stage)
}

# Wire RC for estimates: the platform's own setRC.tcl (per-layer R and C, signal
# wires on metal3, clock on metal5), as ORFS sources it.  repair_design refuses to
# run before set_wire_rc, so every stage sets it right after loading.
proc set_platform_parasitics {} {
  source $::cfg(SET_RC_TCL)
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
  puts [banner_text $title]
}

# A stage's report (reports/<name>.rpt, also in the stage log) and its metrics
# (reports/<name>.metrics, "name value" lines with ORFS's metric names).
# (OpenROAD 26Q3's log_begin leaves the file empty, so every report is appended with
# >> as ORFS's report_metrics does; the same text goes to the stage log.)
proc report_stage {name metric_stage {extra {}}} {
  set file [report_file $name.rpt]
  close [open $file w]
  set sections [concat [list \
    "report_checks -path_delay max -fields {slew capacitance input_pin net fanout} -format full_clock_expanded" \
    "report_checks -path_delay min -fields {slew capacitance input_pin net fanout} -format full_clock_expanded" \
    "report_tns" "report_wns" "report_worst_slack -max" "report_worst_slack -min" \
    "report_check_types -max_slew -max_capacitance -max_fanout -violators"] $extra]
  foreach section $sections {
    banner $section
    report_append $file [banner_text $section]
    eval $section
    eval "$section >> {$file}"
  }
  set metrics [dict merge [timing_power_metrics $metric_stage] [physical_metrics $metric_stage $::cfg(FILL_CELLS)]]
  report_append $file [banner_text "design area and cells"]
  foreach key [lsort [dict keys $metrics]] {
    report_append $file "$key [dict get $metrics $key]"
  }
  write_metrics [report_file $name.metrics] $metrics
}

proc banner_text {title} {
  return "\n==========================================================================\n$title\n--------------------------------------------------------------------------"
}

proc report_append {file text} {
  set stream [open $file a]
  puts $stream $text
  close $stream
}
