"""README.md's printed main-job output has the main job's exact format: its header is
tvjax.cli.header for the true TV of the paper's block instance, and each row is tvjax.cli.format_row
of the values it shows (the block is regenerated from a real run by scripts/readme_output.py)."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tvjax.cli import ACCESS_ROWS, format_row, header
from tvjax.core.instances import exact_tv, paper_block_pair

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"<!-- main-job-output:start -->\n```\n(.*?)\n```\n<!-- main-job-output:end -->", re.DOTALL)
ROW = re.compile(r"^(?P<label>.+?)\s+(?P<value>[-\d.]+)\s+\[(?P<low>[-\d.]+), (?P<high>[-\d.]+)\]\s+(?P<stderr>[-\d.]+)\s+"
                 r"(?P<bias>[-\d.]+)\s+(?P<queries>[-+\d.e]+)\s+(?P<error>[-\d.]+)\s+(?P<seconds>[\d.]+)s$")


def readme_table(text):
    found = BLOCK.findall(text)
    assert len(found) == 1, "README.md needs one fenced main-job block between its markers"
    return found[0].splitlines()


def parsed_row(line):
    match = ROW.match(line)
    assert match, f"not a main-job row: {line!r}"
    g = {k: (v if k == "label" else float(v)) for k, v in match.groupdict().items()}
    result = SimpleNamespace(value=g["value"], ci_low=g["low"], ci_high=g["high"], stderr=g["stderr"], bias=g["bias"],
                             queries=g["queries"])
    return g, result


def check_table(lines, truth):
    assert lines[:4] == header(truth, 0.1).splitlines()
    rows = lines[4:]
    assert [parsed_row(line)[0]["label"] for line in rows] == [label.format(sigma=0.1) for _, label in ACCESS_ROWS]
    for line in rows:
        g, result = parsed_row(line)
        assert abs(g["error"] - abs(g["value"] - truth)) <= 1e-4 + 1e-12  # |error| of the shown estimate
        assert g["low"] <= g["value"] <= g["high"] and g["stderr"] > 0
        again = format_row(g["label"], result, truth, g["seconds"])
        assert again[:-17] == line[:-17] and again[-7:] == line[-7:]  # all but the |error| column, byte for byte


@pytest.fixture(scope="module")
def truth():
    return exact_tv(*paper_block_pair())


def test_readme_shows_the_main_jobs_output_in_its_format(truth):
    check_table(readme_table(README.read_text()), truth)


def test_the_check_catches_a_stale_or_hand_typed_table(truth):
    lines = readme_table(README.read_text())
    stale_truth = [lines[0], "true TV = 0.4", *lines[2:]]
    moved_column = lines[:4] + [lines[4].replace("  0.", " 0.", 1)] + lines[5:]
    wrong_error = lines[:4] + [re.sub(r"(\S+)(\s+\S+s)$", lambda m: "0.9999" + m.group(2), lines[4])] + lines[5:]
    for broken in (stale_truth, moved_column, wrong_error, lines[:-1]):
        with pytest.raises(AssertionError):
            check_table(broken, truth)
