"""Small helpers shared by the command-line entry points."""

from __future__ import annotations

from pathlib import Path


def announce(line: str, log: Path | None = None) -> None:
    """Print a job's result line (Snakemake shows it) and append it to the job's log."""
    print(line, flush=True)
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as fh:
            print(line, file=fh)
