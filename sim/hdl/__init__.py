"""Simulation-only hardware (never part of the chip): models the testbench keeps in the HDL for speed."""
