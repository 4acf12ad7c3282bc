"""The warm interpreter (runtimes/warm.py): real trials forked from a server that has
imported torch, against the same trials started fresh, in the real upstream
environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trials import assert_ok, run
from workflow_scripts import sysinfo
from workflow_scripts.runtimes import warm
from workflow_scripts.runtimes.base import REPO_ROOT, Lifeline

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def processes() -> dict[int, list[str]]:
    """Every live process's command line, by PID."""
    found = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                found[int(proc.name)] = cmd
    return found


def servers(owner: str = "") -> dict[int, str]:
    """The warm servers alive on this machine (of ``owner``, PID:start time): PID ->
    their arguments."""
    return {
        pid: " ".join(cmd[4:])
        for pid, cmd in processes().items()
        if len(cmd) > 4 and cmd[3] == warm.SERVER and cmd[5].startswith(owner)
    }


def test_a_warm_trial_trains_as_a_fresh_one_in_a_process_of_its_own(
    upstream_env, make_spec, tmp_path
):
    """Two trials forked from one server and one started fresh: the same losses step
    for step, the same threads, each its own process (another PID, a session of its
    own), no import paid by the forked ones, and the record says how each started."""
    spec = make_spec(steps=4)
    # the owner of this process's servers, as run_logged's ("-": none above pytest, as
    # where its parent has exited, e.g. started with nohup from a shell that ended)
    watched = Lifeline().watched
    owner = f"{watched[-1][0]}:{watched[-1][1]}" if watched else "-"
    cold = assert_ok(run(spec, upstream_env, tmp_path / "cold"))  # fresh: the default
    warm_env = {**upstream_env, "warm_interpreter": True}
    first = assert_ok(run(spec, warm_env, tmp_path / "w1"))
    serving = {pid for pid, cmd in servers(owner).items() if "torchvision" in cmd}
    second = assert_ok(run(spec, warm_env, tmp_path / "w2"))
    assert serving and serving == set(servers(owner)), "the second trial started a server"
    assert cold["provenance"]["started"] == "fresh"
    assert first["provenance"]["started"] == second["provenance"]["started"] == "warm"
    for rec in (first, second):
        assert rec["losses"] == cold["losses"]
        assert rec["provenance"]["torch_num_threads"] == cold["provenance"]["torch_num_threads"]
        assert rec["provenance"]["env"]["OMP_NUM_THREADS"] is None  # as the run was given
    assert cold["metrics"]["import_s"] > 0.2
    assert second["metrics"]["import_s"] < 0.05  # torch was imported by the server
    # ... and the model's library: its import time, timed within the setup, is gone too
    assert 0 <= second["metrics"]["libraries_s"] < 0.05
    assert cold["metrics"]["libraries_s"] <= cold["metrics"]["setup_s"]
    pids = {rec["provenance"]["pid"] for rec in (cold, first, second)}
    assert len(pids) == 3 and not pids & serving  # each run a process of its own
    log = (tmp_path / "w2" / "logs" / f"{spec['id']}.log").read_text()
    assert "[warm] started fresh" not in log and "step 4/" in log


def test_a_warm_run_past_its_time_limit_is_killed_with_its_process_group(
    upstream_env, make_spec, tmp_path
):
    """The time limit holds for a forked run: it is killed (its whole session), recorded
    as a timeout, and the server lives on for the next run."""
    spec = make_spec(steps=100000, warmup_steps=1, time_budget_s=None, timeout_s=8)
    warm_env = {**upstream_env, "warm_interpreter": True}
    rec = run(spec, warm_env, tmp_path / "slow")
    assert rec["status"] == "timeout", rec.get("error")
    assert rec["provenance"]["started"] == "warm"
    out = str(tmp_path / "slow" / "records")
    assert not [c for c in processes().values() if out in " ".join(c)], "the run outlived its limit"
    after = assert_ok(run(make_spec(), warm_env, tmp_path / "next"))
    assert after["provenance"]["started"] == "warm"


def test_a_server_ends_with_its_owner_and_with_a_newer_one_of_the_same_owner(
    upstream_env, tmp_path
):
    """A server exits once the process that owns it (the study's Snakemake) is gone; a
    study keeps ``SERVERS`` (2) at most: a third retires the one it used least lately
    (the first, though started first, was used after the second: the second goes).
    Each run is a session of its own."""
    owner = subprocess.Popen(["sleep", "600"])
    try:
        mark = (owner.pid, sysinfo.start_time(owner.pid))
        mine = f"{mark[0]}:{mark[1]}"
        python = upstream_env["python"]
        log = tmp_path / "log"
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        env.pop("OMP_NUM_THREADS", None)
        script = tmp_path / "hello.py"
        script.write_text("import os, sys\nprint('pid', os.getpid(), 'sid', os.getsid(0))\n")

        def one(modules: tuple[str, ...]) -> set[int]:
            before = set(servers(mine))
            with open(log, "ab") as fh:
                proc = warm.start(python, modules, [python, "-u", str(script)], env,
                                  str(tmp_path), fh.fileno(), owner=mark)  # fmt: skip
                assert not isinstance(proc, str), proc
                assert proc.wait(60) == 0
            return set(servers(mine)) - before

        first = one(("torch",))
        second = one(("torch", "json"))
        assert len(first) == len(second) == 1 and len(servers(mine)) == 2
        time.sleep(1.1)  # (the files' times tell the order)
        assert one(("torch",)) == set()  # the first, reused
        third = one(("torch", "math"))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and second & set(servers(mine)):
            time.sleep(0.2)
        assert set(servers(mine)) == first | third, "not the server used least lately retired"
        printed = log.read_text().split()
        assert printed.count("pid") == 4
        assert all(printed[i + 1] == printed[i + 3] for i in range(0, 16, 4))  # own sessions
        owner.send_signal(signal.SIGTERM)
        owner.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and servers(mine):
            time.sleep(0.2)
        assert not servers(mine), "a server outlived its owner"
    finally:
        owner.kill()


def test_a_script_standing_in_for_python_is_never_forked(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\n")
    fake.chmod(0o755)
    why = warm.eligible([str(fake), "-u", "x.py"], {})
    assert why and "not an interpreter" in why
    assert warm.eligible([sys.executable, "-u", "x.py"], {}) is None
    assert warm.eligible([sys.executable, "-u", "x.py"], {"LD_PRELOAD": "x"}) == "LD_PRELOAD is set"
