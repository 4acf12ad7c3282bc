"""What Snakemake's own process costs while jobs wait for a core: its scheduler as it
is, against the study's one-timer fix (workflow_scripts/snakemake_timers.py, installed by
rules/common.smk), measured in the same run, alternated.

A workflow of ``--jobs`` local jobs that each sleep ``--sleep`` seconds in a ``run:``
block (threads of Snakemake's own process), one at a time, with Snakemake's default job
rate limit (``--max-jobs-per-timespan 100/1s``): the jobs use no CPU, so the CPU time
Snakemake's process takes is its own scheduling. As it is, every scheduling pass that
leaves jobs waiting starts a timer that runs another pass a second later, and every job
that starts or ends starts one more such chain: the passes per second grow with the jobs
done (in the default study, after ~400 jobs its process took a whole CPU of two, beside
the trials). Prints, per setting and round: the wall time, Snakemake's CPU time, its CPU
time per wall second over the last third of the jobs, and the most timer threads seen.

    .venv/bin/python tests/benchmarks/scheduler_cpu.py
    .venv/bin/python tests/benchmarks/scheduler_cpu.py --jobs 400 --sleep 0.3 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.runs import timers_seen, waiting_jobs_workflow  # noqa: E402

SETTINGS = {"Snakemake as it is": False, "one pending timer": True}


def cpu_seconds(pid: int) -> float | None:
    """A process's user + system CPU time so far (``/proc/<pid>/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(jobs: int, sleep: float, install: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "Snakefile").write_text(waiting_jobs_workflow(jobs, sleep))
        cmd = [sys.executable, "-m", "snakemake", "--cores", "1", "--force-use-threads",
               "--workflow-profile", "none", "--quiet", "all",
               "--config", f"install={install}"]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        samples: list[tuple[float, float]] = []

        def watch():
            while proc.poll() is None:
                cpu = cpu_seconds(proc.pid)
                if cpu is not None:
                    samples.append((time.monotonic() - started, cpu))
                time.sleep(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        _, err = proc.communicate()
        watcher.join()
        wall = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(err.decode()[-2000:])
        timers = max(timers_seen(Path(tmp), jobs))
    last = [s for s in samples if s[0] >= 2 * wall / 3]
    rate = (last[-1][1] - last[0][1]) / (last[-1][0] - last[0][0]) if len(last) > 1 else None
    return {
        "wall": wall,
        "cpu": samples[-1][1] if samples else None,
        "rate": rate,
        "timers": timers,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--sleep", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"{args.jobs} jobs of {args.sleep} s each, one at a time")
    print(f"{'setting':20} {'wall s':>8} {'CPU s':>7} {'CPU/wall, last 3rd':>19} {'timers':>7}")
    order = list(SETTINGS.items())
    for k in range(args.rounds):
        for name, install in order if k % 2 == 0 else order[::-1]:
            got = run_once(args.jobs, args.sleep, install)
            rate = f"{got['rate']:.2f}" if got["rate"] is not None else "n/a"
            print(f"{name:20} {got['wall']:8.1f} {got['cpu']:7.1f} {rate:>19} {got['timers']:>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
