"""Stream pieces every block shares, below the chip: the weight port's signature and
request helpers (weight_port.py) and the stream register slice (skid.py).  A block (KDA,
MLA, MoE, AttnRes) imports them from here without importing the chip (hw/chip/)."""
