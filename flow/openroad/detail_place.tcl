# 3_5 detailed placement: legal sites, no overlaps, mirrored for shorter wires.
source [file join [file dirname [info script]] common.tcl]
load_design resize

detailed_placement
optimize_mirroring
check_placement -verbose

estimate_parasitics -placement
report_stage 3_detailed_place detailedplace
save_design detail_place
