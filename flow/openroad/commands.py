"""The OpenROAD commands the stage scripts may call, with the options OpenROAD accepts.

Read from OpenROAD's own argument declarations (``sta::define_cmd_args`` and
``sta::parse_key_args`` in src/<module>/src/*.tcl, and OpenSTA's
tcl/*.tcl), 2025 sources.  The static check (flow/openroad/check.py) turns
this table into stand-in procs for tclsh, so a script that calls a command
missing here, or passes an option its command does not declare, fails the
check.  Only commands the scripts use are listed; add one here when a script
needs it, after reading its declaration.

``reads``/``writes`` name the positional argument or option that is a file,
so the check can insist that every file read exists (or an earlier stage
writes it).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    keys: frozenset[str] = frozenset()     # options that take a value
    flags: frozenset[str] = frozenset()    # options without a value
    positionals: tuple[int, int] = (0, 0)  # allowed count of plain arguments, min and max
    reads: str | None = None               # "positional" or an option: a file that must exist
    writes: tuple[str, ...] = ()           # "positional" and/or options: files written
    returns: str = ""                      # what the stand-in returns (a fake object or value)
    source: str = ""                       # where OpenROAD declares it


def _c(keys="", flags="", positionals=(0, 0), reads=None, writes=(), returns="", source=""):
    return Command(frozenset(keys.split()), frozenset(flags.split()), positionals, reads,
                   tuple(writes), returns, source)


COMMANDS: dict[str, Command] = {
    # ---- database and files (src/OpenRoad.tcl, OpenSTA tcl/Sta.tcl, tcl/Sdc.tcl) ----
    "read_lef": _c(flags="-tech -library", positionals=(1, 1), reads="positional", source="src/OpenRoad.tcl"),
    "read_liberty": _c(keys="-corner", flags="-min -max -infer_latches", positionals=(1, 1),
                       reads="positional", source="OpenSTA tcl/Liberty.tcl"),
    "read_verilog": _c(positionals=(1, 1), reads="positional", source="src/dbSta/src/dbReadVerilog.tcl"),
    "link_design": _c(flags="-hier -omit_filename_prop", positionals=(1, 1), source="src/dbSta"),
    "read_sdc": _c(flags="-echo", positionals=(1, 1), reads="positional", source="OpenSTA tcl/Sdc.tcl"),
    "read_db": _c(flags="-hier", positionals=(1, 1), reads="positional", source="src/OpenRoad.tcl"),
    "write_db": _c(positionals=(1, 1), writes=("positional",), source="src/OpenRoad.tcl"),
    "write_def": _c(keys="-version", positionals=(1, 1), writes=("positional",), source="src/OpenRoad.tcl"),
    "write_verilog": _c(keys="-remove_cells", flags="-include_pwr_gnd -sort", positionals=(1, 1),
                        writes=("positional",), source="src/dbSta/src/dbSta.tcl"),
    "write_sdc": _c(keys="-digits", flags="-map_hpins -no_timestamp", positionals=(1, 1),
                    writes=("positional",), source="OpenSTA tcl/Sdc.tcl"),
    "write_spef": _c(keys="-net_id -nets", flags="-coordinates", positionals=(1, 1),
                     writes=("positional",), source="src/rcx/src/OpenRCX.tcl"),
    "read_spef": _c(keys="-corner -path", flags="-min -max -increment -pin_cap_included -keep_capacitive_coupling",
                    positionals=(1, 1), reads="positional", source="OpenSTA tcl/Parasitics.tcl"),
    "log_begin": _c(positionals=(1, 1), writes=("positional",), source="OpenSTA tcl/Util.tcl"),
    "log_end": _c(source="OpenSTA tcl/Util.tcl"),
    "set_dont_use": _c(positionals=(1, 1), source="src/rsz/src/Resizer.tcl"),
    # ---- floorplan (src/ifp/src/InitFloorplan.tcl) ----
    "initialize_floorplan": _c(keys="-utilization -aspect_ratio -core_space -die_area -core_area -site "
                                    "-additional_sites -row_parity -flip_sites -gap",
                               source="src/ifp/src/InitFloorplan.tcl"),
    "make_tracks": _c(keys="-x_pitch -y_pitch -x_offset -y_offset", positionals=(0, 1),
                      source="src/ifp/src/InitFloorplan.tcl"),
    # ---- tapcell (src/tap/src/tapcell.tcl) ----
    "tapcell": _c(keys="-tapcell_master -endcap_master -distance -halo_width_x -halo_width_y "
                       "-tap_prefix -endcap_prefix", flags="-disallow_one_site_gaps",
                  source="src/tap/src/tapcell.tcl"),
    # ---- power grid (src/pdn/src/pdn.tcl) ----
    "add_global_connection": _c(keys="-net -inst_pattern -pin_pattern -region", flags="-power -ground -defer_connection",
                                source="src/OpenRoad.tcl"),
    "global_connect": _c(source="src/OpenRoad.tcl"),
    "set_voltage_domain": _c(keys="-name -power -ground -region -secondary_power -switched_power",
                             source="src/pdn/src/pdn.tcl"),
    "define_pdn_grid": _c(keys="-name -voltage_domains -pins -starts_with -cells -halo -obstructions -orient "
                               "-power_switch_cell -power_control -power_control_network",
                          flags="-macro -existing -grid_over_pg_pins -grid_over_boundary -default",
                          source="src/pdn/src/pdn.tcl"),
    "add_pdn_stripe": _c(keys="-grid -layer -width -pitch -spacing -offset -starts_with -extend_to -nets "
                              "-number_of_straps",
                         flags="-followpins -extend_to_core_ring -extend_to_boundary -snap_to_grid",
                         source="src/pdn/src/pdn.tcl"),
    "add_pdn_connect": _c(keys="-grid -layers -cut_pitch -fixed_vias -max_rows -max_columns -ongrid "
                               "-split_cuts -dont_use_vias", source="src/pdn/src/pdn.tcl"),
    "pdngen": _c(keys="-failed_via_report", flags="-skip_trim -dont_add_pins -reset -ripup -report_only -verbose",
                 source="src/pdn/src/pdn.tcl"),
    # ---- placement (src/gpl/src/replace.tcl, src/ppl/src/IOPlacer.tcl, src/dpl/src/Opendp.tcl) ----
    "global_placement": _c(keys="-bin_grid_count -density -init_density_penalty -init_wirelength_coef "
                                "-min_phi_coef -max_phi_coef -overflow -reference_hpwl -initial_place_max_iter "
                                "-initial_place_max_fanout -routability_check_overflow -routability_max_density "
                                "-routability_target_rc_metric -routability_inflation_ratio_coef "
                                "-routability_max_inflation_ratio -routability_rc_coefficients "
                                "-timing_driven_net_reweight_overflow -timing_driven_net_weight_max "
                                "-timing_driven_nets_percentage -keep_resize_below_overflow -pad_left -pad_right",
                           flags="-skip_initial_place -skip_nesterov_place -timing_driven -routability_driven "
                                 "-incremental -skip_io -disable_revert_if_diverge",
                           source="src/gpl/src/replace.tcl"),
    "place_pins": _c(keys="-hor_layers -ver_layers -random_seed -corner_avoidance -min_distance "
                          "-exclude -group_pins -write_pin_placement",
                     flags="-random -min_distance_in_tracks -annealing", source="src/ppl/src/IOPlacer.tcl"),
    "detailed_placement": _c(keys="-max_displacement -report_file_name", flags="-disallow_one_site_gaps",
                             source="src/dpl/src/Opendp.tcl"),
    "optimize_mirroring": _c(source="src/dpl/src/Opendp.tcl"),
    "check_placement": _c(keys="-report_file_name", flags="-verbose -disallow_one_site_gaps",
                          source="src/dpl/src/Opendp.tcl"),
    "filler_placement": _c(keys="-prefix", flags="-verbose", positionals=(1, 1), source="src/dpl/src/Opendp.tcl"),
    # ---- parasitics and repair (src/est/src/EstimateParasitics.tcl, src/rsz/src/Resizer.tcl) ----
    "set_layer_rc": _c(keys="-layer -via -resistance -capacitance -corner", source="src/est"),
    "set_wire_rc": _c(keys="-layer -resistance -capacitance -corner -h_resistance -h_capacitance "
                           "-v_resistance -v_capacitance", flags="-signal -clock", source="src/est"),
    "estimate_parasitics": _c(keys="-spef_file", flags="-placement -global_routing",
                              writes=("-spef_file",), source="src/est"),
    "repair_design": _c(keys="-max_wire_length -max_utilization -slew_margin -cap_margin -buffer_gain",
                        flags="-match_cell_footprint -verbose -pre_placement", source="src/rsz/src/Resizer.tcl"),
    "repair_tie_fanout": _c(keys="-separation -max_fanout", flags="-verbose", positionals=(1, 1),
                            source="src/rsz/src/Resizer.tcl"),
    "repair_clock_inverters": _c(source="src/rsz/src/Resizer.tcl"),
    "repair_clock_nets": _c(keys="-max_wire_length", source="src/rsz/src/Resizer.tcl"),
    "repair_timing": _c(keys="-setup_margin -hold_margin -slack_margin -libraries -repair_tns -max_passes "
                             "-max_buffer_percent -max_utilization -recover_power",
                        flags="-setup -hold -allow_setup_violations -skip_pin_swap -skip_gate_cloning "
                              "-skip_buffering -skip_buffer_removal -skip_last_gasp -verbose",
                        source="src/rsz/src/Resizer.tcl"),
    "report_design_area": _c(source="src/rsz/src/Resizer.tcl"),
    # ---- clock tree (src/cts/src/TritonCTS.tcl) ----
    "clock_tree_synthesis": _c(keys="-wire_unit -buf_list -root_buf -clk_nets -tree_buf -distance_between_buffers "
                                    "-branching_point_buffers_distance -clustering_exponent "
                                    "-clustering_unbalance_ratio -sink_clustering_size "
                                    "-sink_clustering_max_diameter",
                               flags="-sink_clustering_enable -balance_levels", source="src/cts/src/TritonCTS.tcl"),
    # ---- routing (src/grt/src/GlobalRouter.tcl, src/drt/src/TritonRoute.tcl, src/rcx) ----
    "set_global_routing_layer_adjustment": _c(positionals=(2, 2), source="src/grt/src/GlobalRouter.tcl"),
    "set_routing_layers": _c(keys="-signal -clock", source="src/grt/src/GlobalRouter.tcl"),
    "global_route": _c(keys="-guide_file -congestion_iterations -congestion_report_file "
                            "-congestion_report_iter_step -grid_origin -critical_nets_percentage "
                            "-skip_large_fanout_nets",
                       flags="-allow_congestion -verbose -start_incremental -end_incremental",
                       writes=("-congestion_report_file", "-guide_file"), source="src/grt/src/GlobalRouter.tcl"),
    "detailed_route": _c(keys="-output_maze -output_drc -output_cmap -output_guide_coverage -drc_report_iter_step "
                              "-db_process_node -droute_end_iter -via_in_pin_bottom_layer -via_in_pin_top_layer "
                              "-or_seed -or_k -bottom_routing_layer -top_routing_layer -verbose "
                              "-min_access_points -repair_pdn_vias",
                         flags="-disable_via_gen -distributed -clean_patches -no_pin_access -save_guide_updates "
                               "-single_step_dr",
                         writes=("-output_drc", "-output_maze"), source="src/drt/src/TritonRoute.tcl"),
    "extract_parasitics": _c(keys="-ext_model_file -corner -corner_cnt -max_res -coupling_threshold "
                                  "-debug_net_id -cc_model -context_depth",
                             flags="-lef_res -lef_rc -no_merge_via_res -skip_over_cell",
                             source="src/rcx/src/OpenRCX.tcl"),
    # ---- timing and power reports (OpenSTA tcl/Search.tcl, tcl/Power.tcl) ----
    "report_checks": _c(keys="-path_delay -fields -format -group_path_count -group_count -endpoint_path_count "
                             "-endpoint_count -digits -from -to -through -slack_max -slack_min -corner",
                        flags="-unconstrained -unique_paths_to_endpoint -no_line_splits -sort_by_slack",
                        source="OpenSTA tcl/Search.tcl"),
    "report_tns": _c(keys="-digits", flags="-min -max", source="OpenSTA tcl/Search.tcl"),
    "report_wns": _c(keys="-digits", flags="-min -max", source="OpenSTA tcl/Search.tcl"),
    "report_worst_slack": _c(keys="-digits", flags="-min -max", source="OpenSTA tcl/Search.tcl"),
    "report_check_types": _c(keys="-digits -net",
                             flags="-violators -verbose -max_delay -min_delay -recovery -removal "
                                   "-clock_gating_setup -clock_gating_hold -max_slew -min_slew -max_fanout "
                                   "-min_fanout -max_capacitance -min_capacitance -min_pulse_width "
                                   "-min_period -max_skew -no_line_splits",
                             source="OpenSTA tcl/Search.tcl"),
    "report_clock_skew": _c(keys="-clock -corner -digits", flags="-setup -hold -include_internal_latency",
                            source="OpenSTA tcl/Search.tcl"),
    "report_power": _c(keys="-instances -corner -digits -format -highest_power_instances",
                       source="OpenSTA tcl/Power.tcl"),
    "set_propagated_clock": _c(positionals=(1, 1), source="OpenSTA tcl/Sdc.tcl"),
    "all_clocks": _c(returns="clk", source="OpenSTA tcl/Sdc.tcl"),
    "get_lib_pins": _c(flags="-regexp -nocase -quiet", positionals=(1, 1), returns="lib_pin",
                       source="OpenSTA tcl/Sdc.tcl"),
    # ---- values for the metrics (OpenSTA tcl/Search.tcl, tcl/Power.tcl; odb) ----
    "sta::worst_slack": _c(keys="-corner -scene", flags="-min -max", returns="0.0", source="OpenSTA tcl/Search.tcl"),
    "sta::total_negative_slack": _c(keys="-corner -scene", flags="-min -max", returns="0.0",
                                    source="OpenSTA tcl/Search.tcl"),
    "sta::design_power": _c(positionals=(1, 1), returns="0.0 0.0 0.0 0.0", source="OpenSTA tcl/Power.tcl"),
    "sta::cmd_corner": _c(returns="corner", source="OpenSTA tcl/Sta.tcl"),
    "ord::get_db_block": _c(returns="block", source="src/OpenRoad.tcl"),
}

# Object methods the metrics procs call on odb objects (dbBlock, dbInst, dbMaster, Rect).
ODB_METHODS: frozenset[str] = frozenset(
    "getDbUnitsPerMicron getInsts getMaster getName getWidth getHeight getCoreArea getDieArea dx dy".split())
