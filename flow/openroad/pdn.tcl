# 2_3 power grid, the shape of ORFS's nangate45 grid_strategy-M1-M4-M7:
# metal1 rails on the rows' power pins, vertical metal4 straps, horizontal
# metal7 straps (the block's power pins), vias metal1-4 and metal4-7.
source [file join [file dirname [info script]] common.tcl]
load_design tapcell

set power $::cfg(POWER_NET)
set ground $::cfg(GROUND_NET)
add_global_connection -net $power -inst_pattern {.*} -pin_pattern "^${power}\$" -power
add_global_connection -net $ground -inst_pattern {.*} -pin_pattern "^${ground}\$" -ground
global_connect

set_voltage_domain -name CORE -power $power -ground $ground
define_pdn_grid -name core_grid -voltage_domains {CORE} -pins $::cfg(PDN_PIN_LAYER)

lassign $::cfg(PDN_RAIL) layer width pitch
add_pdn_stripe -grid core_grid -layer $layer -width $width -pitch $pitch -offset 0 -followpins
foreach strap $::cfg(PDN_STRAPS) {
  lassign $strap layer width pitch offset
  add_pdn_stripe -grid core_grid -layer $layer -width $width -pitch $pitch -offset $offset
}
foreach connect $::cfg(PDN_CONNECTS) {
  add_pdn_connect -grid core_grid -layers $connect
}
# the SRAM macros' grid (ORFS's CORE_macro_grid_1): straps over every macro in the
# orientations the placement uses, from its metal4 supply pins up to the core's metal7
if {[llength $::cfg(MACRO_LEFS)]} {
  set halo $::cfg(PDN_MACRO_HALO)
  define_pdn_grid -name macro_grid -voltage_domains {CORE} -macro -default \
    -orient {R0 R180 MX MY} -halo [list $halo $halo $halo $halo]
  foreach strap $::cfg(PDN_MACRO_STRAPS) {
    lassign $strap layer width pitch offset
    add_pdn_stripe -grid macro_grid -layer $layer -width $width -pitch $pitch -offset $offset
  }
  foreach connect $::cfg(PDN_MACRO_CONNECTS) {
    add_pdn_connect -grid macro_grid -layers $connect
  }
}
pdngen

save_design pdn
