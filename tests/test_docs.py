"""The documentation (issue 46): a README read in five minutes, the rest in docs/, the
tables that restate declarations generated from them, and no link that leads nowhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workflow_scripts import docs_tables

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
#: the generated regions each page must hold
REGIONS = {
    "docs/results.md": ["summary-columns"],
    "docs/configuration.md": ["config-fields", "config-settings"],
    "docs/how-it-works.md": ["code-sides"],
}
#: the "Two commands": running the study and running the tests (what .ci/run runs)
STUDY_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install --require-hashes -r envs/workflow.txt"
    " && .venv/bin/snakemake --cores all"
)
TEST_COMMAND = "bash tests/run.sh"
MAX_README_LINES = 220


# --- generated tables ----------------------------------------------------------------


def test_the_generated_regions_are_where_the_pages_expect_them():
    for page, names in REGIONS.items():
        assert docs_tables.regions((REPO / page).read_text()) == names, page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_generated_table_matches_the_declarations(page):
    text = page.read_text()
    assert docs_tables.regenerate(text) == text, (
        f"{page.relative_to(REPO)} is stale: run .venv/bin/python -m workflow_scripts.docs_tables"
    )


def test_a_stale_table_is_found_and_rewritten(tmp_path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "x.md"
    page.write_text(
        "# x\n\n<!-- BEGIN generated: config-fields -->\n| old |\n"
        "<!-- END generated: config-fields -->\n"
    )
    assert docs_tables.main(["--check", "--root", str(tmp_path)]) == 1
    assert "| old |" in page.read_text()  # --check writes nothing
    assert docs_tables.main(["--root", str(tmp_path)]) == 0
    assert docs_tables.main(["--check", "--root", str(tmp_path)]) == 0
    text = page.read_text()
    assert "| old |" not in text and "| `batch_size` | integer ≥ 1 | `16` |" in text


def test_the_tables_follow_the_declarations():
    from workflow_scripts.spec import fields, settings
    from workflow_scripts.summary import records

    columns = docs_tables.summary_columns()
    rows = [line for line in columns.splitlines()[2:] if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(records.COLUMNS)
    names = [line.split("`")[1] for line in docs_tables.config_fields().splitlines()[2:]]
    assert names == list(fields.FIELDS)
    top = [line.split("`")[1] for line in docs_tables.config_settings().splitlines()[2:]]
    assert [n for n in top if "." not in n] == list(settings.SETTINGS)
    assert "cluster.partition" in top


def test_a_cell_is_one_line_with_its_bars_escaped():
    assert docs_tables.cell("a | b\n  c") == "a \\| b c"
    assert docs_tables.table(["x"], [["1|2"]]) == "| x |\n|---|\n| 1\\|2 |\n"
    assert (
        docs_tables.allowed({"type": ["integer", "null"], "minimum": 1}) == "integer ≥ 1 or `null`"
    )
    assert docs_tables.allowed({"enum": [None, "sgd"]}) == "`null`, `sgd`"


# --- the README ------------------------------------------------------------------------


def section(text: str, heading: str) -> str:
    """The text of a ``## heading`` section, up to the next heading of its level."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section '## {heading}'"
    return match.group(1)


def fenced(text: str) -> list[str]:
    """The lines of the fenced code blocks of a text."""
    return [
        line.strip()
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)
        for line in block.splitlines()
    ]


def test_the_readme_is_short_and_keeps_its_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    commands = fenced(section(text, "Two commands"))
    assert STUDY_COMMAND in commands
    assert TEST_COMMAND in commands
    # CI runs exactly the README's test command
    assert f"exec {TEST_COMMAND}" in (REPO / ".ci" / "run").read_text()


# --- links -----------------------------------------------------------------------------


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped (but '-' and
    '_'), spaces as '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page (a repeated one numbered as GitHub numbers it)."""
    seen: dict[str, int] = {}
    found = set()
    for line in strip_code(page.read_text()).splitlines():
        match = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def strip_code(text: str) -> str:
    """The text without its fenced blocks (whose lines may start with '#')."""
    return re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)


def links(page: Path) -> list[str]:
    """The targets of a page's Markdown links, outside code."""
    text = re.sub(r"`[^`\n]*`", "", strip_code(page.read_text()))
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


def test_the_slug_is_githubs():
    assert slug("Every step is checked: the gradient check") == (
        "every-step-is-checked-the-gradient-check"
    )
    assert slug("The columns of `summary.csv`") == "the-columns-of-summarycsv"
    assert slug("How long will it take here?") == "how-long-will-it-take-here"
    assert slug("Nothing left in `/dev/shm`") == "nothing-left-in-devshm"
    assert slug('What to expect from `compile(backend="ipex")` on a transformer') == (
        "what-to-expect-from-compilebackendipex-on-a-transformer"
    )


def test_the_docs_are_linked_from_the_readme():
    targets = {t.split("#")[0] for t in links(README)}
    missing = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in targets]
    assert missing == []


def broken_links(page: Path) -> list[str]:
    """The relative links of a page that lead to no file, or to no heading of a page."""
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.name}")
    return broken


def test_the_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "b.md").write_text("# B\n\n## Where `x` is\n\n```\n# not a heading\n```\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#where-x-is) [file](c.md) [anchor](b.md#not-a-heading) [self](#a) "
        "`[code](d.md)` [web](https://example.org/x.md)\n\n# A\n"
    )
    assert broken_links(page) == [
        f"c.md: no file {tmp_path / 'c.md'}",
        "b.md#not-a-heading: no heading '#not-a-heading' in b.md",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_somewhere(page):
    assert broken_links(page) == []
