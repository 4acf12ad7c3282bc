"""The report's sections for a study of any single experiment (tests/test_report_sections.py
has the fast tests of workflow_scripts/report/sections.py): one report a study, each
of the fixture machine's experiments alone."""

from __future__ import annotations

import copy
import re

import pytest

from tests.fixture_records import PRICES, build_page, machine_a, section, write
from workflow_scripts import report
from workflow_scripts.report import quality
from workflow_scripts.summary import records as rec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    return build_page(tmp_path_factory.mktemp("sections"))


def section_ids(text):
    return re.findall(r'<section id="([^"]+)">', text)


@pytest.mark.parametrize("group", [None, "mine"])
def test_the_report_builds_for_any_single_experiment(tmp_path, page, group):
    """A study of one experiment (any of them, in its own group or in a group of its own
    with no baseline and no fp32 eager reference) gives every section of the full report;
    a section without its reference says so instead of failing."""
    full = section_ids(page[3])
    for exp in dict.fromkeys(r["experiment"] for r in machine_a()):
        records = [copy.deepcopy(r) for r in machine_a() if r["experiment"] == exp]
        for r in records:
            if group:
                r["spec"]["group"] = group
        folder = tmp_path / f"{exp}-{group}"
        loaded = rec.load_records(write(folder, records))
        out = report.build_report(
            loaded,
            report.Outputs(
                folder / "summary.csv", folder / "report" / "index.html", folder / "report"
            ),
            report.Options(prices=PRICES),
        )
        text = (folder / "report" / "index.html").read_text()
        assert out["trials"] == len(records), exp
        missing = set(full) - set(section_ids(text)) - {"machines"}
        assert not missing, (exp, group, missing)
        start = section(text, "startup")
        spec = records[0]["spec"]
        plain = spec.get("backend", "eager") == "eager" and spec.get("precision", "fp32") == "fp32"
        plain = plain and not spec.get("channels_last") and spec.get("compile", "none") == "none"
        if group == "mine" and "<table" in start and not plain:
            assert quality.NO_REFERENCE in start, (exp, start[-3000:])
