"""Where another machine's results are read from (the config's ``report: machines:``).

Kept apart from :mod:`workflow_scripts.report` (pandas, matplotlib): the report rule's
inputs are computed by every Snakemake process, each job's included.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: how much of a folder the search for another machine's records looks at: entries
#: listed in all, and folders deep (a results folder holds a few thousand entries,
#: its records three levels down)
WALK_MAX_ENTRIES = 200_000
WALK_MAX_DEPTH = 6


class TooBig(ValueError):
    """A folder too large to search: the message says which and how to point closer."""


def _records_folders(top: Path) -> list[Path]:
    """The ``records`` folders under ``top`` (breadth first, links not followed),
    looking at most :data:`WALK_MAX_ENTRIES` entries and :data:`WALK_MAX_DEPTH` deep."""
    found: list[Path] = []
    seen = 0
    level = [top]
    for _ in range(WALK_MAX_DEPTH):
        below: list[Path] = []
        for folder in level:
            try:
                entries = os.scandir(folder)
            except OSError:
                continue
            with entries:
                for entry in entries:
                    seen += 1
                    if seen > WALK_MAX_ENTRIES:
                        raise TooBig(
                            f"{top}: more than {WALK_MAX_ENTRIES} entries searched for "
                            "records/; give the results folder itself (the one holding "
                            "records/ or summary.csv)"
                        )
                    if entry.is_dir(follow_symlinks=False):
                        (found if entry.name == "records" else below).append(Path(entry.path))
        if found:
            return sorted(found)
        level = below
    return found


def result_files(path: str | Path) -> list[Path]:
    """The files a result set is read from: the trial records under ``path``
    (``records/<experiment>/trial<k>.json`` or ``<experiment>/trial<k>.json``, else those of
    the nearest ``records`` folders below it), else its ``summary.csv``, or ``path``
    itself when it is a file. The search is bounded (:class:`TooBig` beyond it)."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        return []
    for pattern in ("records/*/trial*.json", "*/trial*.json"):
        found = sorted(p.glob(pattern))
        if found:
            return found
    found = sorted(f for records in _records_folders(p) for f in records.glob("*/trial*.json"))
    if found:
        return found
    return [p / "summary.csv"] if (p / "summary.csv").is_file() else []


def machine_files(report_settings: Mapping | None) -> list[str]:
    """The files of the other machines' results (the config's ``report: machines:``), the
    report rule's inputs: the report is rebuilt when they change."""
    files: list[str] = []
    for machine in (report_settings or {}).get("machines") or []:
        files += [str(f) for f in result_files(machine["results"])]
    return files
