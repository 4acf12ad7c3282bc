"""A trial forked from a warm interpreter against the same trial started fresh
(runtimes/warm.py): the trial policy's whole wall time, its process's, the
throughput, and the timed steps' own page faults and involuntary context switches,
in ABBA rounds on this machine, with the median ratio and its distribution-free
95 % interval (pairs of neighbours in the ABBA order).

    .venv/bin/python tests/benchmarks/warm_start.py --env-json results/envs/upstream.json \\
        --preset quick --experiment bert-tiny --rounds 6
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks import experiment_args  # noqa: E402


def trial(spec: dict, env_json: str, warm: bool, where: Path, n: int) -> dict:
    out, log = where / f"r{n}.json", where / f"r{n}.log"
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "workflow_scripts.trial", "--spec-json", json.dumps(spec),
         "--env-json", env_json, "--out", str(out), "--log", str(log), "--max-retries", "0",
         f"--warm-interpreter={'true' if warm else 'false'}"],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    rec = json.loads(out.read_text())
    assert rec["status"] == "ok", rec.get("error")
    assert rec["provenance"]["started"] == ("warm" if warm else "fresh")
    work = rec.get("other_work") or {}
    steps = max(1, rec["metrics"]["steps_timed"])
    return {
        # the window's own page faults and switches (rank/contention.py), per timed step
        "faults": work.get("minor_faults", float("nan")) / steps / 1000,
        "switches": work.get("involuntary_switches", float("nan")) / steps,
        "wall": wall,
        "process": rec["provenance"]["process_wall_s"],
        "sps": rec["metrics"]["samples_per_s"],
        "median step": rec["metrics"]["step_time_s"]["median"] * 1000,
        "rss": rec["metrics"]["peak_rss_mb"],
    }


def main() -> int:
    args, spec = experiment_args.parse(__doc__.splitlines()[0], "quick", "bert-tiny", 6)
    got: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        trial(spec, args.env_json, True, Path(tmp), -1)  # the server's start, not counted
        n = 0
        for r in range(args.rounds):
            for warm in (True, False, False, True) if r % 2 == 0 else (False, True, True, False):
                got[warm].append(trial(spec, args.env_json, warm, Path(tmp), n))
                x = got[warm][-1]
                print(f"  {n:3d} {'warm ' if warm else 'fresh'} median step "
                      f"{x['median step']:8.1f} ms  {x['faults']:7.1f} K faults/step  "
                      f"{x['switches']:7.1f} involuntary switches/step", flush=True)  # fmt: skip
                n += 1
    print(f"{args.experiment} ({args.preset}), {len(got[True])} trials each, ABBA")
    figures = (("wall", "trial wall (s)"), ("process", "process wall (s)"),
               ("sps", "samples/s"), ("median step", "median step (ms)"),
               ("rss", "peak RSS (MB)"), ("faults", "K faults/step"),
               ("switches", "invol. switches/step"))  # fmt: skip
    experiment_args.print_pairs(got[True], got[False], figures, ("warm", "fresh"), 18)
    return 0


if __name__ == "__main__":
    sys.exit(main())
