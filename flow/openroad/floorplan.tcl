# 2_1 floorplan: netlist and constraints in, core and die sized from the
# config's utilisation and aspect ratio, rows on the Nangate45 site, tracks.
source [file join [file dirname [info script]] common.tcl]

read_lef $::cfg(TECH_LEF)
read_lef $::cfg(CELL_LEF)
# the SRAM macros' abstracts (flow/macros.py), none on a chip without them
foreach lef $::cfg(MACRO_LEFS) {
  read_lef $lef
}
foreach lib $::cfg(LIB_FILES) {
  read_liberty $lib
}
read_verilog $::cfg(NETLIST)
link_design $::cfg(DESIGN_NAME)
read_sdc $::cfg(SDC_FILE)
set_platform_parasitics
set_dont_use $::cfg(DONT_USE_CELLS)

# -utilization is in percent (CORE_UTILIZATION); the driver converts the config's fraction
initialize_floorplan \
  -utilization $::cfg(CORE_UTILIZATION) \
  -aspect_ratio $::cfg(CORE_ASPECT_RATIO) \
  -core_space $::cfg(CORE_MARGIN) \
  -site $::cfg(PLACE_SITE)

# initialize_floorplan leaves no tracks; the pitches and offsets are the platform's
foreach track $::cfg(TRACKS) {
  lassign $track layer x_offset x_pitch y_offset y_pitch
  make_tracks $layer -x_offset $x_offset -x_pitch $x_pitch -y_offset $y_offset -y_pitch $y_pitch
}

# As ORFS's floorplan.tcl: one tie cell per load (a shared tie makes a long net),
# then a setup repair that may only unbuffer, size up and swap pins (the
# netlist's ports now sit on the die edge, so I/O paths are judged right).
foreach tie [list $::cfg(TIE_LO) $::cfg(TIE_HI)] {
  lassign $tie cell port
  repair_tie_fanout [get_lib_pins */$cell/$port]
}
set_routing_resources
repair_timing -setup -skip_last_gasp -sequence "unbuffer,sizeup,swap" -verbose

# the SRAM macros, before the taps cut the rows under them and the power grid covers them
# (ORFS's macro_place step): a generated or committed place_macro list, or OpenROAD's
# macro placer; either leaves them LOCKED, so no later step moves them
if {$::cfg(MACRO_PLACEMENT) eq "auto"} {
  rtl_macro_placer -halo_width $::cfg(MACRO_HALO) -halo_height $::cfg(MACRO_HALO) \
    -target_util $::cfg(PLACE_DENSITY)
} elseif {$::cfg(MACRO_PLACEMENT) ne ""} {
  source $::cfg(MACRO_PLACEMENT)
}

report_stage 2_floorplan floorplan
save_design floorplan
