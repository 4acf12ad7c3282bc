"""Adaptive rounds: another trial only where a comparison is still undecided.

Trials run in rounds (trial 0 of every experiment, then trial 1, ...). Every experiment
runs ``trials`` of them (the minimum). After that, round k runs only the experiments
that a comparison still undecided after round k-1 names, on either side: the round
report of round k-1 (``results/rounds/<k-1>/comparisons.csv``, a Snakemake checkpoint)
decides, with the report's own intervals and verdicts (``report/uncertainty.py``).
A decided comparison (faster, slower or the same within the margin) needs no more
trials; one whose side failed has no figure and is no comparison. The rounds end at
``max_trials`` or when nothing is undecided. What a figure rests on is in the
report's comparisons (trials on each side) and its summary (one row per trial).

Stopping on the data this way (optional stopping) makes the 95 % intervals somewhat
optimistic; the cap bounds it, and the verdict's margin (±3 %) keeps "the same"
from being declared on a wide interval.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from pathlib import Path

#: the verdict that asks for another round
UNDECIDED = "undecided"


def cap(settings: Mapping) -> int:
    """How many trials an experiment may run: ``max_trials`` when it is above
    ``trials``, else ``trials`` (no adaptive rounds)."""
    low = int(settings["trials"])
    high = settings.get("max_trials")
    return max(low, int(high)) if high is not None else low


def adaptive(settings: Mapping) -> bool:
    return cap(settings) > int(settings["trials"])


def undecided_pairs(comparisons_csv: Path | str) -> list[tuple[str, str]]:
    """The (baseline, experiment) pairs of a comparisons.csv still undecided."""
    with open(comparisons_csv, newline="", encoding="utf-8") as f:
        return [
            (row["baseline"], row["experiment"])
            for row in csv.DictReader(f)
            if row.get("verdict") == UNDECIDED
        ]


def going_on(comparisons_csv: Path | str, ran: Iterable[str]) -> list[str]:
    """The experiments of ``ran`` (those with a trial in the round just ended) that
    an undecided comparison of that round's ``comparisons.csv`` names, in ``ran``'s
    order."""
    named = {e for pair in undecided_pairs(comparisons_csv) for e in pair}
    return [e for e in ran if e in named]


def trial_range(settings: Mapping, experiments: int) -> tuple[int, int]:
    """The fewest and the most trials the study may run."""
    return experiments * int(settings["trials"]), experiments * cap(settings)
