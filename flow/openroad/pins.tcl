# 3_1 + 3_2 pin placement: a quick placement that ignores the pins tells the
# pin placer where each port's logic sits; then the pins go on the die edge,
# horizontal-edge and vertical-edge layers from the platform.
source [file join [file dirname [info script]] common.tcl]
load_design pdn

global_placement -skip_io -density $::cfg(PLACE_DENSITY)
place_pins -hor_layers $::cfg(PIN_LAYER_H) -ver_layers $::cfg(PIN_LAYER_V)

save_design pins
