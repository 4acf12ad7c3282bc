"""Where a finished study's trials spent their time, part by part (the report's "Where
the trials' time went", ``report.timing.time_parts``), summed over every trial record
under one or more ``results/records`` folders; with two folders, side by side (before
and after a change).

    .venv/bin/python tests/benchmarks/trial_costs.py results/records [other/records]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workflow_scripts.report.timing import time_parts_frame  # noqa: E402


def records(folder: Path) -> list[dict]:
    """The trial records under ``folder`` (``<experiment>/trial<k>.json``; not the files
    a trial keeps beside its record, e.g. ``trial0.int8-calibration.json``)."""
    out = []
    for path in sorted(folder.glob("*/trial*.json")):
        if not re.fullmatch(r"trial\d+\.json", path.name):
            continue
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    tables = []
    for folder in argv:
        found = records(Path(folder))
        frame = time_parts_frame(found).set_index("part")
        wall = sum(r.get("trial_wall_s") or 0 for r in found)
        tables.append((folder, len(found), wall, frame))
    head = f"{'part':<26}" + "".join(f"{'s':>10} {'share':>7}" for _ in tables)
    print(head)
    for part in tables[0][3].index:
        row = f"{part:<26}"
        for _, _, _, frame in tables:
            row += f"{frame.loc[part, 'seconds']:>10.1f} {100 * frame.loc[part, 'share']:>6.1f}%"
        print(row)
    for folder, n, wall, _ in tables:
        print(f"{folder}: {n} trials, {wall:.0f} s of trial wall time")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
