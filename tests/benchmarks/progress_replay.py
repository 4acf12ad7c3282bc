"""A finished run's progress lines against the time it then took, and what the same lines
would have said the other way: with the trials left at their groups' ratios
(``plan.progress.speed_of``) where the line scaled them by one ratio for the whole
run, and at the run's where it scaled them by group (it says "by group").

Each line is printed after a trial's record is written: the line's time is that record's
modification time, and the time then left is the running time from it to the run's end.
A study stopped and resumed is several Snakemake sessions (``.snakemake/log`` beside
``results``: each log's name is its start, its modification time its end); the sessions
in which a record was written are the run, and the time left counts only their time, not
the pauses between them (give each session's output as a log, in order). Without those
logs the run is one session ending at the newest file under ``results``.

A line's own "about X left" is taken from the log; the other way's is that figure plus
the difference the two ways make over the trials that then ran (each at its estimate,
by the study's calibrations, times its ratio), an approximation that leaves the rest of
the line (reports, collectives, rounds, a budget's reserve) as it was.

    .venv/bin/python tests/benchmarks/progress_replay.py results run.log [run2.log ...] \
        [key=value ...]

``key=value``: what the run set on the command line (``runtime=local``; a budget's
planned experiments need not be given: every record of the study's experiments counts).
"""

from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import yaml  # noqa: E402

from workflow_scripts.plan import progress, study_estimate  # noqa: E402
from workflow_scripts.plan.study_estimate import Known, Setup  # noqa: E402
from workflow_scripts.study import load_study  # noqa: E402

UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}


def said(line: str) -> float | None:
    """A progress line's "about X left", in seconds."""
    found = re.search(r"about (\S+) (s|min|h) left", line)
    return float(found.group(1)) * UNITS[found.group(2)] if found else None


def sessions(results: Path, written: list[float]) -> list[tuple[float, float]]:
    """The run's Snakemake sessions, (start, end) in epoch seconds: those of the logs in
    ``.snakemake/log`` beside ``results`` in which a record was written (``written``:
    the records' times); without such a log, one from the first record to the newest
    file under ``results``."""
    found = []
    for log in sorted((results.parent / ".snakemake" / "log").glob("*.snakemake.log")):
        stamp = log.name.split(".snakemake.log")[0]
        try:
            start = datetime.strptime(stamp, "%Y-%m-%dT%H%M%S.%f").timestamp()
        except ValueError:
            continue
        end = log.stat().st_mtime
        inside = [t for t in written if start <= t <= end + 1.0]
        if inside:
            found.append((start, max(end, *inside)))
    if found:
        return found
    last = max(p.stat().st_mtime for p in results.rglob("*") if p.is_file())
    return [(min(written, default=last), last)]


def within(values: list[float]) -> str:
    """How far lines were off: their range of the time then left, and how many of them
    were beyond 1.3x either way."""
    outside = sum(1 for v in values if not 1 / 1.3 <= v <= 1.3)
    return (f"{min(values):.2f}-{max(values):.2f}x of the time then left, {outside} of "
            f"{len(values)} beyond 1.3x")  # fmt: skip


def running_left(t: float, spans: list[tuple[float, float]]) -> float:
    """The running time of ``spans`` after ``t``: the time then left, pauses between
    sessions not counted."""
    return sum(max(0.0, end - max(start, t)) for start, end in spans)


def main(argv: list[str]) -> int:
    paths = [a for a in argv if "=" not in a]
    if len(paths) < 2:
        print(__doc__)
        return 2
    results, logs = Path(paths[0]), [Path(p) for p in paths[1:]]
    cli = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    study = load_study(yaml.safe_load(Path("config.yaml").read_text()), cli=cli)
    machine = study_estimate.study_machine(study, results, measure=False)
    group_of = progress.groups_of(study.experiments)
    records = []
    for path in (results / "records").glob("*/trial*.json"):
        if path.parent.name in group_of and path.stem[5:].isdigit():
            times = progress._wall(path)
            records.append((times.written, path.parent.name, int(path.stem[5:]), times))
    records.sort()
    spans = sessions(results, [r[0] for r in records])
    if len(spans) > 1:
        pauses = sum(b[0] - a[1] for a, b in zip(spans, spans[1:], strict=False))
        print(f"{len(spans)} sessions, {pauses / 60:.0f} min of pauses between them left out")
    failed = {e: t.failed for _, e, _, t in records if t.failed is not None}
    done = [(e, k) for _, e, k, _ in records]
    trials = int(study.settings["trials"])
    per = study_estimate.total(
        study.experiments, trials, machine, Setup(study.envs), Known(done, {}, failed)
    )["experiments"]

    def predicted(e: str, k: int) -> float:
        return per[e]["seconds"] if k == 0 else per[e]["later_seconds"]

    lines = [
        line
        for log in logs
        for line in log.read_text().splitlines()
        if line.startswith("[progress]")
    ]
    if len(lines) != len(records):
        print(f"{len(lines)} progress lines for {len(records)} records: not one run's")
        return 1
    print(f"{'line':>5} {'left s':>8} {'said':>7} {'other way':>9}")
    rows = []
    for i, line in enumerate(lines[:-1]):
        figure = said(line)
        if figure is None:
            continue
        walls = progress.ok_walls({(e, k): t for _, e, k, t in records[: i + 1]})
        speed = progress.speed_of(walls, predicted, group_of)
        rest = [(e, k) for _, e, k, t in records[i + 1 :] if t.failed is None]
        at_run = sum(predicted(e, k) * speed.run for e, k in rest)
        at_groups = sum(predicted(e, k) * speed.of(group_of[e]) for e, k in rest)
        left = running_left(records[i][0], spans)
        # a line scaled by group says so ("by group"): the other way is then the run's
        differ = at_groups - at_run if "by group" not in line else at_run - at_groups
        rows.append((i + 1, left, figure / left, (figure + differ) / left))
        print(f"{i + 1:>5} {left:>8.0f} {rows[-1][2]:>7.2f} {rows[-1][3]:>9.2f}")
    late = [row for row in rows if row[0] >= len(lines) / 10]
    for name, col in (("as said", 2), ("the other way", 3)):
        print(f"{name}: the lines after the first tenth {within([row[col] for row in late])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
