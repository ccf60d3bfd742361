"""The area categories of flow/categories.py: every block of the elaborated tiny layer
maps to one (a renamed or new block fails here, not silently in the report), the
pattern rules, and the split of a hierarchy's area into categories that adds up."""
from __future__ import annotations

import pytest

from flow.categories import CATEGORIES, TOP, UNMAPPED, _matches, category_areas, category_of, elaborated_instances
from flow.synth import ModuleStat, SynthStats
from hw.tops import build_top
from moekda.config import load_config


@pytest.fixture(scope="module")
def tiny_instances():
    layer, _ports = build_top("layer", load_config("tiny"))
    return elaborated_instances(layer)


def test_every_block_of_the_tiny_layer_has_a_category(tiny_instances):
    assert len(tiny_instances) > 10   # the walk found the hierarchy
    unmapped = [p for p in [TOP] + tiny_instances if category_of(p) == UNMAPPED]
    assert not unmapped, f"no category in flow/categories.py for: {', '.join(unmapped)}"


def test_every_block_of_the_model_chip_has_a_category():
    """The model chip (model-tiny: a dense layer, the embedding and the head) too."""
    chip, _ports = build_top("layer", load_config("model-tiny"))
    instances = elaborated_instances(chip)
    unmapped = [p for p in [TOP] + instances if category_of(p) == UNMAPPED]
    assert not unmapped, f"no category in flow/categories.py for: {', '.join(unmapped)}"
    assert {"head", "embed", "datapath/moe/activations/silu_sigmoid"} <= set(instances)   # as synthesis names them


def test_each_issue_category_owns_a_block_of_the_tiny_layer(tiny_instances):
    used = {category_of(p) for p in [TOP] + tiny_instances}
    # the head category is the model chip's, the macros one a cell category (no instances)
    assert used == {c.key for c in CATEGORIES if c.patterns and c.key != "head"}


def test_kda_state_is_the_state_memory_alone(tiny_instances):
    state = [p for p in tiny_instances if category_of(p) == "kda_state"]
    # tiny's state in SRAM: the state memory and its macro instances (hw/kda/state.py; synthesis
    # counts the macros' cells as the macros category, the logic around them as KDA state)
    assert state == ["datapath/kda/delta/mem", "datapath/kda/delta/mem/bank0_r0_c0",
                     "datapath/kda/delta/mem/bank1_r0_c0"]
    # in flip-flops: the state memory and its words module (StateWords, one per context)
    chip, _ports = build_top("layer", load_config("tiny-flops"))
    flops = [p for p in elaborated_instances(chip) if category_of(p) == "kda_state"]
    assert flops == ["datapath/kda/delta/mem", "datapath/kda/delta/mem/words"]
    assert category_of("kda/delta") == "kda_datapath"


@pytest.mark.parametrize("pattern,path,hit", [
    ("kda/engine/**", "kda/engine", True),
    ("kda/engine/**", "kda/engine/dot_product", True),
    ("kda/engine/**", "kda/engines", False),
    ("kda", "kda/conv", False),
    ("kda/lut_*/**", "kda/lut_silu_q", True),
    ("kda/lut_*/**", "kda/lut_silu_q/rom", True),
    ("moe/engine*/**", "moe/engine_up/dot_product", True),
    ("norm/**", "kda/norm", False),
])
def test_pattern_rules(pattern, path, hit):
    assert _matches(pattern, path) is hit


def test_unknown_block_is_unmapped_and_repeated_instances_share_a_category():
    assert category_of("kda/renamed_block") == UNMAPPED
    assert category_of("kda/engine#1/accumulator") == category_of("kda/engine/accumulator") == "engine"


def test_category_areas_add_up_to_the_total_without_double_counting():
    cell_area = {"DFF": 4.5, "NAND": 0.8}
    modules = {
        "layer": ModuleStat("layer", {"NAND": 10}, {"layer.kda": 1, "layer.odd": 1}),
        "layer.kda": ModuleStat("layer.kda", {"NAND": 3}, {"layer.kda.delta": 1}),
        "layer.kda.delta": ModuleStat("layer.kda.delta", {"NAND": 5}, {"layer.kda.delta.mem": 1}),
        "layer.kda.delta.mem": ModuleStat("layer.kda.delta.mem", {"DFF": 7}, {}),
        "layer.odd": ModuleStat("layer.odd", {"DFF": 1, "NAND": 2}, {}),
    }
    stats = SynthStats(top="layer", modules=modules, cell_area=cell_area, sequential=frozenset({"DFF"}))
    cats = category_areas(stats)
    assert list(cats)[-1] == UNMAPPED
    assert sum(c.area for c in cats.values()) == pytest.approx(stats.area())
    assert sum(c.cells for c in cats.values()) == stats.count()
    assert cats["kda_state"].area == pytest.approx(7 * 4.5) and cats["kda_state"].sequential == pytest.approx(7 * 4.5)
    assert cats["kda_datapath"].cells == 3 + 5
    assert cats["residual"].instances == [TOP]
    assert cats[UNMAPPED].instances == ["odd"] and cats[UNMAPPED].cells == 3


def test_macro_cells_are_their_own_category():
    """An SRAM macro cell goes to ``macros`` wherever it is instantiated; the logic of the same
    instance stays in the instance's category."""
    cell_area = {"DFF": 4.5, "NAND": 0.8, "fakeram45_32x64": 1000.0}
    modules = {
        "layer": ModuleStat("layer", {"NAND": 1}, {"layer.datapath": 1}),
        "layer.datapath": ModuleStat("layer.datapath", {}, {"layer.datapath.kda": 1}),
        "layer.datapath.kda": ModuleStat("layer.datapath.kda", {}, {"layer.datapath.kda.delta": 1}),
        "layer.datapath.kda.delta": ModuleStat("layer.datapath.kda.delta", {}, {"layer.datapath.kda.delta.mem": 1}),
        "layer.datapath.kda.delta.mem": ModuleStat("layer.datapath.kda.delta.mem",
                                                   {"fakeram45_32x64": 2, "DFF": 10}, {}),
    }
    stats = SynthStats("layer", modules, cell_area, frozenset({"DFF"}), frozenset({"fakeram45_32x64"}))
    areas = category_areas(stats)
    assert areas["macros"].area == 2000.0 and areas["macros"].cells == 2
    assert areas["kda_state"].area == 45.0 and areas["kda_state"].sequential == 45.0
    assert abs(sum(a.area for a in areas.values()) - stats.area()) < 1e-9
