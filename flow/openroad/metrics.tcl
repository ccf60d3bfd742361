# Metric values of the loaded design under ORFS's names
# (<stage>__timing__setup__ws, <stage>__power__total, ...), written one
# "name value" line each; flow/pnr.py merges them into metrics.json.
# The timing and power part uses OpenSTA only, so plain `sta` runs it too
# (flow/tests/test_pnr_sta.py does, on a small netlist).

# OpenSTA renamed corners to scenes in 2025; accept either.
proc metrics_corner {} {
  if {[llength [info commands sta::cmd_scene]]} {
    return [sta::cmd_scene]
  }
  return [sta::cmd_corner]
}

# Slacks in the liberty time unit (ns), power in W.
proc timing_power_metrics {stage} {
  set m [dict create]
  dict set m ${stage}__timing__setup__ws [sta::worst_slack -max]
  dict set m ${stage}__timing__setup__tns [sta::total_negative_slack -max]
  dict set m ${stage}__timing__hold__ws [sta::worst_slack -min]
  dict set m ${stage}__timing__hold__tns [sta::total_negative_slack -min]
  # ORFS's timing__fmax (Hz): the clock's period less the worst setup slack is the
  # shortest period this placement meets (IO paths included, at their SDC delays)
  set clocks [all_clocks]
  if {[llength $clocks] == 1} {
    set min_period [expr {[get_property [lindex $clocks 0] period] - [sta::worst_slack -max]}]
    if {$min_period > 0} {
      dict set m ${stage}__timing__fmax [expr {1e9 / $min_period}]
    }
  }
  lassign [sta::design_power [metrics_corner]] internal switching leakage total
  dict set m ${stage}__power__internal__total $internal
  dict set m ${stage}__power__switching__total $switching
  dict set m ${stage}__power__leakage__total $leakage
  dict set m ${stage}__power__total $total
  return $m
}

# Cell area and count from the placed database (OpenROAD only).  Fill cells
# are not design: they are left out of area and count, as in ORFS.  They are
# known by name: the kit's LEF gives them CLASS CORE, not CORE SPACER.
proc physical_metrics {stage fill_cells} {
  set block [ord::get_db_block]
  set dbu [$block getDbUnitsPerMicron]
  set area 0.0
  set count 0
  foreach inst [$block getInsts] {
    set master [$inst getMaster]
    if {[lsearch -exact $fill_cells [$master getName]] >= 0} {
      continue
    }
    incr count
    set area [expr {$area + double([$master getWidth]) * [$master getHeight]}]
  }
  set area [expr {$area / ($dbu * $dbu)}]
  set core [$block getCoreArea]
  set core_area [expr {double([$core dx]) * [$core dy] / ($dbu * $dbu)}]
  set die [$block getDieArea]
  set die_area [expr {double([$die dx]) * [$die dy] / ($dbu * $dbu)}]
  set m [dict create]
  dict set m ${stage}__design__instance__count $count
  dict set m ${stage}__design__instance__area $area
  dict set m ${stage}__design__core__area $core_area
  dict set m ${stage}__design__die__area $die_area
  if {$core_area > 0} {
    dict set m ${stage}__design__instance__utilization [expr {$area / $core_area}]
  }
  return $m
}

proc write_metrics {path metrics} {
  set stream [open $path w]
  dict for {name value} $metrics {
    puts $stream "$name $value"
  }
  close $stream
}
