"""A finished run's progress lines made again by today's code from the study's files as
they stood at each line's time, against the time the run then took to finish.

Each line is printed after a trial's record is written: the line's time is that record's
modification time. The files under ``results`` as they stood then are those written by
that time (a file written again later, a provisional report, counts from its last
write); they are hard-linked into a folder beside ``results`` that grows line by line,
and ``plan.progress.line`` is asked for the time left there, ``now`` being the line's
time. The time then left is the run's running time from that moment to its end, the
pauses between sittings left out (``progress_replay.sessions``: the Snakemake logs in
``.snakemake/log`` beside ``results``).

    .venv/bin/python tests/benchmarks/progress_states.py STUDY [--every N] [key=value ...]

``STUDY``: the study's folder (``results``, ``logs`` and ``.snakemake`` in it);
``--every N``: every Nth line after the first tenth (1: all); ``key=value``: what the run
set on the command line (``runtime=local``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import yaml  # noqa: E402

from tests.benchmarks.progress_replay import running_left, said, sessions, within  # noqa: E402
from workflow_scripts.plan import progress, study_estimate  # noqa: E402
from workflow_scripts.study import load_study  # noqa: E402


def main(argv: list[str]) -> int:
    args = [a for a in argv if "=" not in a]
    every = 5
    if "--every" in args:
        at = args.index("--every")
        every = int(args[at + 1])
        del args[at : at + 2]
    if len(args) != 1:
        print(__doc__)
        return 2
    base = Path(args[0]).resolve()
    results = base / "results"
    cli = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    study = load_study(yaml.safe_load(Path("config.yaml").read_text()), cli=cli)
    group_of = progress.groups_of(study.experiments)
    written = []
    for path in (results / "records").glob("*/trial*.json"):
        if path.parent.name in group_of and path.stem[5:].isdigit():
            written.append(path.stat().st_mtime)
    written.sort()
    spans = sessions(results, written)
    files = sorted((p.stat().st_mtime, p) for p in results.rglob("*") if p.is_file())
    state = base / ".progress-states" / "results"
    shutil.rmtree(state.parent, ignore_errors=True)
    state.mkdir(parents=True)
    machine = study_estimate.study_machine(study, results, measure=False)
    linked = 0
    rows = []
    try:
        print(f"{'line':>5} {'left s':>8} {'said s':>8} {'ratio':>6}")
        for i, t in enumerate(written):
            while linked < len(files) and files[linked][0] <= t + 0.5:
                source = files[linked][1]
                target = state / source.relative_to(results)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(source, target)
                linked += 1
            if (i + 1) < len(written) / 10 or i + 1 == len(written) or i % every:
                continue
            text = progress.line(study, state, started=spans[0][0], now=t, machine=machine,
                                 logs=base / "logs")  # fmt: skip
            figure, left = said(text), running_left(t, spans)
            if figure is None or left <= 0:
                continue
            rows.append((i + 1, left, figure, figure / left))
            print(f"{i + 1:>5} {left:>8.0f} {figure:>8.0f} {figure / left:>6.2f}", flush=True)
    finally:
        shutil.rmtree(state.parent, ignore_errors=True)
    print(f"the lines after the first tenth: {within([row[3] for row in rows])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
