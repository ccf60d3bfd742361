# 5_3 fill: filler cells in every empty site so the wells and rails run
# unbroken along the rows.
source [file join [file dirname [info script]] common.tcl]
load_design detail_route

filler_placement $::cfg(FILL_CELLS)
check_placement -verbose

save_design fill
