"""ORFS's published Nangate45 figures are data in the repository, with their source."""
from __future__ import annotations

import subprocess

import pytest

from flow.orfs_reference import ORFS_DATA, OrfsDesign, orfs_source, read_orfs_data, read_orfs_designs
from moekda.config import REPO_ROOT

# the reference notes the figures were transcribed from, when this machine has them
NOTES = REPO_ROOT.parent / "shared" / "reference" / "orfs-nangate45.md"


def test_the_figures_are_a_tracked_file_of_the_repository():
    assert ORFS_DATA.is_relative_to(REPO_ROOT)
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", str(ORFS_DATA.relative_to(REPO_ROOT))],
                             cwd=REPO_ROOT, capture_output=True, text=True)
    assert tracked.returncode == 0, tracked.stderr


def test_every_design_with_its_source():
    source, designs = read_orfs_data()
    assert source["repository"] == "The-OpenROAD-Project/OpenROAD-flow-scripts"
    assert "flow/designs/nangate45/" in source["files"] and source["version"]
    assert "OpenROAD-flow-scripts" in orfs_source()
    by_name = {d.name: d for d in designs}
    assert set(by_name) == {"gcd", "aes", "ibex", "jpeg", "dynamic_node", "tinyRocket", "swerv", "ariane133"}
    assert by_name["gcd"] == OrfsDesign("gcd", 0.46, 631, 928, 667, 0.86, -0.072, 0.0035)
    assert by_name["jpeg"].wns_ns == 0.017 and by_name["ariane133"].final_cells == 193_821


@pytest.mark.skipif(not NOTES.is_file(), reason="the reference notes are not on this machine")
def test_the_data_equals_the_notes_it_was_transcribed_from():
    """Each row of the notes' table, numbers as printed there, is the data file's."""
    text = NOTES.read_text()
    table = text[text.index("Published results of ORFS designs on Nangate45"):].split("\n## ")[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[1][:1].isdigit():
            num = [float(c.replace(",", "").replace("+", "")) for c in cells[1:]]
            rows[cells[0]] = OrfsDesign(cells[0], *num[:3], int(num[3]), *num[4:])
    assert rows and rows == {d.name: d for d in read_orfs_designs()}


@pytest.mark.parametrize("text, needle", [
    ("not toml [", "cannot read"),
    ('[[design]]\nname = "x"\n', "no [source]"),
    ('[source]\nrepository = "r"\n', "no [[design]] rows"),
    ('[source]\nrepository = "r"\n[[design]]\nname = "x"\nclock_ns = 1\n', "fields must be exactly"),
])
def test_a_damaged_data_file_names_itself(tmp_path, text, needle):
    f = tmp_path / "orfs.toml"
    f.write_text(text)
    with pytest.raises(ValueError) as e:
        read_orfs_data(f)
    assert str(f) in str(e.value) and needle in str(e.value)
