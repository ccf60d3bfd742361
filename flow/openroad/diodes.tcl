# Antenna diodes on the nets that have no n-diffusion of their own (sourced by
# common.tcl; called by global_route.tcl before the first global route).
#
# The platform's KLayout deck (drc/FreePDK45.lydrc) sums each metal layer's area
# over a whole net, all layers connected at once, against the net's gate area,
# and skips every net that reaches n-diffusion through a contact.  A net driven
# by a cell has the driver's NMOS drain and is skipped; a net driven from where
# the GDS has no layout is not: the block's input ports, and the SRAM macros'
# outputs (fakeram45 is a LEF abstract).  OpenROAD's own checker follows the
# order of manufacture and can pass such a net the deck fails (matvec's clk:
# 0.48 against the deck's 314 on metal5).  One ANTENNA_X1 on each such net puts
# diffusion on it, so the deck skips it whatever the metal (OpenLane's
# DIODE_ON_PORTS "in"; ORFS has no such step).
#
# 26Q3 has no command for it: the odb API creates and connects the cells
# (place_inst creates an instance of a cell at a location), and the caller
# legalises them with detailed_placement.

# The nets that get a diode: with $ports every signal or clock net of a block input
# port, with $macros every output of a block (macro) instance.  Each entry is
# {net source_rect}: where the net enters the core.
proc antenna_diode_nets {block ports macros} {
  set nets {}
  set seen [dict create]
  foreach bterm [expr {$ports ? [$block getBTerms] : {}}] {
    if {[$bterm getIoType] ni {INPUT INOUT}} { continue }
    set net [$bterm getNet]
    if {$net eq "NULL" || [$net getSigType] ni {SIGNAL CLOCK}} { continue }
    if {[dict exists $seen [$net getName]]} { continue }
    dict set seen [$net getName] 1
    lappend nets [list $net [$bterm getBBox]]
  }
  if {$macros} {
    foreach inst [$block getInsts] {
      if {![[$inst getMaster] isBlock]} { continue }
      foreach iterm [$inst getITerms] {
        if {[$iterm getIoType] ne "OUTPUT"} { continue }
        set net [$iterm getNet]
        if {$net eq "NULL" || [$net getSigType] ni {SIGNAL CLOCK}} { continue }
        if {[dict exists $seen [$net getName]]} { continue }
        dict set seen [$net getName] 1
        lappend nets [list $net [$iterm getBBox]]
      }
    }
  }
  return $nets
}

proc rect_centre {rect} {
  return [list [expr {([$rect xMin] + [$rect xMax]) / 2}] [expr {([$rect yMin] + [$rect yMax]) / 2}]]
}

# Where a net's diode goes (dbu): beside the net's input pin of a standard cell nearest
# to where the net enters (the first gate the wire reaches: for a port, the buffer
# buffer_ports put there; for clk, the clock tree's root), else at the entry point
# pulled into the core.
proc antenna_diode_location {net source core} {
  lassign [rect_centre $source] sx sy
  set best {}
  set best_d {}
  foreach iterm [$net getITerms] {
    if {[$iterm getIoType] ne "INPUT" || [[[$iterm getInst] getMaster] isBlock]} { continue }
    lassign [rect_centre [$iterm getBBox]] x y
    set d [expr {abs($x - $sx) + abs($y - $sy)}]
    if {$best_d eq "" || $d < $best_d} {
      set best [list $x $y]
      set best_d $d
    }
  }
  if {$best ne ""} { return $best }
  set x [expr {min(max($sx, [$core xMin]), [$core xMax])}]
  set y [expr {min(max($sy, [$core yMin]), [$core yMax])}]
  return [list $x $y]
}

# Put one $cell (its pin $pin) on each net antenna_diode_nets names; returns how many.
# The cells are PLACED, not legal: the caller runs detailed_placement.
proc place_antenna_diodes {cell pin ports macros} {
  set block [ord::get_db_block]
  set core [$block getCoreArea]
  set dbu [$block getDbUnitsPerMicron]
  set count 0
  foreach entry [antenna_diode_nets $block $ports $macros] {
    lassign $entry net source
    lassign [antenna_diode_location $net $source $core] x y
    # (place_inst creates the instance when -cell names a master and the name is new)
    set name "antenna_net_diode_$count"
    place_inst -name $name -cell $cell -location [list [expr {double($x) / $dbu}] [expr {double($y) / $dbu}]] \
      -status PLACED
    [[$block findInst $name] findITerm $pin] connect $net
    incr count
  }
  return $count
}
