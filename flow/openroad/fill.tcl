# 5_3 fill: filler cells in every empty site so the wells and rails run
# unbroken along the rows.
source [file join [file dirname [info script]] common.tcl]
load_design detail_route

filler_placement $::cfg(FILL_CELLS)
# the new cells' supply pins join VDD/VSS by the rules the power-grid stage stored
global_connect
check_placement -verbose

save_design fill
