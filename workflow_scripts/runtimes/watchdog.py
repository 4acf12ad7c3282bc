"""The watchdog of a running job process: when the process that started it (the trial
policy, the calibration, the collectives job) is gone, it kills the job's process
group, removes its container and the shared-memory segments its processes left, so
nothing outlives its job, even after a SIGKILL that gave the policy no chance to clean
up. Started by ``run_logged`` in a session of its own, before the job's command, which
it learns from its first line of input (the job's process group): so there is no
moment when the command runs unwatched. Stopped by ``run_logged`` when the job ends
normally. Standard library only, run as a script (no imports of the study but
``workflow_scripts/shm.py``, itself standard library only).

    echo <job process group> | python watchdog.py <policy pid> [<cleanup command as JSON>]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 5.0


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop(pgid: int, cleanup: list[str] | None) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.1)
    if cleanup:  # a container lives on in its engine when its client is killed
        subprocess.run(cleanup, capture_output=True, timeout=120, check=False)
    folder = os.environ.get("STUDY_RUN_PIDS_DIR")
    if folder:  # the shared-memory segments its processes left (workflow_scripts/shm.py)
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import shm

        shm.cleanup(folder)


def main(argv: list[str]) -> int:
    policy = int(argv[0])
    cleanup = json.loads(argv[1]) if len(argv) > 1 and argv[1] else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the policy
    line = sys.stdin.readline().strip()  # the job's process group, once it started
    if not line.isdigit():  # the policy never started it (or is gone before saying)
        return 0
    pgid = int(line)
    while os.getppid() == policy:  # re-parented: the policy is gone
        time.sleep(POLL_S)
    stop(pgid, cleanup)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
