# 3_5 detailed placement: legal sites, no overlaps, mirrored for shorter wires.
source [file join [file dirname [info script]] common.tcl]
load_design resize

detailed_placement
# ORFS's detailed-placement optimisation: 10 % less wire after placement on the
# matvec block, 6-7 % less routed wire (docs/orfs.md)
improve_placement -max_displacement {5 1}
optimize_mirroring
check_placement -verbose

estimate_parasitics -placement
report_stage 3_detailed_place detailedplace
save_design detail_place
