"""Where another machine's results are read from (the config's ``report: machines:``).

Kept apart from :mod:`workflow_scripts.report` (pandas, matplotlib): the report rule's
inputs are computed by every Snakemake process, each job's included.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def result_files(path: str | Path) -> list[Path]:
    """The files a result set is read from: the trial records under ``path``
    (``records/<experiment>/trial<k>.json`` or ``<experiment>/trial<k>.json``), else its
    ``summary.csv``, or ``path`` itself when it is a file."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        return []
    for pattern in ("records/*/trial*.json", "*/trial*.json", "**/records/*/trial*.json"):
        found = sorted(p.glob(pattern))
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
