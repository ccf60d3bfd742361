# Power from simulated switching activity (flow/power.py, `moekda power`): the design
# (the routed database with its extracted SPEF, or a synthesised netlist for a pre-layout
# figure), then for each activity run (ACTIVITIES: name and table pairs; a table has one
# line per driving cell pin: path, toggles per second, duty, from the run's SAIF) the
# design's power and each cell's power summed by the cell's parent instance path (the
# report's categories are made of those, flow/categories.py).  The settings come from
# the file named by MOEKDA_POWER_CONFIG (::pwr(NAME)); nothing here knows a number.
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
  foreach lef $::pwr(MACRO_LEFS) {
    read_lef $lef
  }
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

# (26Q3's log_begin leaves its file empty, as common.tcl notes: the report is appended with >>)
close [open $::pwr(REPORT) w]
set cells [get_cells *]
foreach {name table} $::pwr(ACTIVITIES) {
  # each net's activity on the cell pin that drives it; OpenSTA carries it to the loads
  set annotated 0
  set not_found 0
  set stream [open $table]
  while {[gets $stream line] >= 0} {
    lassign [split $line "\t"] path density duty
    set pin [sta::find_pin $path]
    if {$pin eq "NULL" || $pin eq ""} {
      incr not_found
      continue
    }
    sta::set_power_pin_activity $pin $density $duty
    incr annotated
  }
  close $stream
  puts "activity $name: $annotated pins annotated, $not_found not found"
  dict set m power__activity__${name}__annotated_pins $annotated
  dict set m power__activity__${name}__pins_not_found $not_found
  lassign [sta::design_power [metrics_corner]] internal switching leakage total
  foreach part {internal switching leakage total} {
    dict set m power__activity__${name}__$part [set $part]
  }
  set f [open $::pwr(REPORT) a]
  puts $f "== activity run $name ($table)"
  close $f
  report_power >> $::pwr(REPORT)
  # each cell's power by its parent's path (flat names keep the hierarchy as a/b/_12_)
  set sums [dict create]
  foreach cell $cells {
    set path [get_full_name $cell]
    set cut [string last / $path]
    set parent [expr {$cut < 0 ? "" : [string range $path 0 [expr {$cut - 1}]]}]
    set kind [expr {[string match fakeram* [get_property $cell ref_name]] ? "macro" : "cell"}]
    set key "$parent\t$kind"
    set watts [lindex [sta::instance_power $cell [metrics_corner]] 3]
    dict set sums $key [expr {([dict exists $sums $key] ? [dict get $sums $key] : 0.0) + $watts}]
  }
  set f [open $::pwr(BLOCKS_$name) w]
  dict for {key watts} $sums {
    puts $f "$key\t$watts"
  }
  close $f
}
write_metrics $::pwr(METRICS) $m
