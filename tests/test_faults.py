"""Faults and interruptions of a trial, for real: signals to the job process, a SIGKILLed
job, a job whose starter is gone, a run that crashes after writing its result, an
unnamed signal, a failed allocation and the kernel's out-of-memory killer.

The runs are fake backend interpreters (real executables the trial policy starts as it
starts a backend's python; no torch), so these tests are fast. A Snakemake run killed
mid-study, with real training, is in ``test_workflow.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.trials import policy
from workflow_scripts import runtimes
from workflow_scripts.runtimes import measured
from workflow_scripts.runtimes.base import REPO_ROOT

# A run that records its process id and its child's, then works until it is killed.
HANGING = """#!/bin/sh
sleep 600 &
echo "$$ $!" > "{pids}"
echo working >&2
wait
"""


def fake_python(tmp_path: Path, script: str) -> dict:
    folder = tmp_path / "fakeenv"
    folder.mkdir(exist_ok=True)
    python = folder / "python"
    python.write_text(script)
    python.chmod(0o755)
    return {"name": "fake", "prefix": str(folder), "python": str(python)}


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command's name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def run_processes(pids: Path) -> list[tuple[int, str | None]]:
    """The processes a fake run wrote into ``pids``, as the tests follow them: each one's
    pid and start time (a pid the kernel hands to a new process once this one is gone is
    not this one: during the whole suite pids wrap around within seconds)."""
    out = []
    for pid in map(int, pids.read_text().split()):
        fields = _stat(pid)
        out.append((pid, fields[19] if fields else None))
    return out


def alive(proc: tuple[int, str | None]) -> bool:
    pid, start = proc
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    fields = _stat(pid)
    # a zombie (not yet reaped by its adopter) runs nothing any more; another process
    # under the same pid is not this one
    return bool(fields) and fields[0] != "Z" and (start is None or fields[19] == start)


def wait_for(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def trial_cli(spec: dict, env: dict, tmp_path: Path) -> list[str]:
    env_json = tmp_path / "env.json"
    env_json.write_text(json.dumps(env))
    return [
        sys.executable, "-m", "workflow_scripts.trial", f"--spec-json={json.dumps(spec)}",
        f"--env-json={env_json}", f"--out={tmp_path / 'records/t/trial0.json'}",
        f"--log={tmp_path / 'logs/t.log'}",
    ]  # fmt: skip


def start_hanging_trial(make_spec, tmp_path: Path):
    """The trial CLI (as Snakemake's job runs it) on a run that hangs: (process, run pids)."""
    pids = tmp_path / "pids"
    env = fake_python(tmp_path, HANGING.format(pids=pids))
    cmd = trial_cli(make_spec(timeout_s=600), env, tmp_path)
    # (its temporary folders, e.g. the compile cache a SIGKILLed job leaves, in tmp_path)
    tmp = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env=tmp,
    )  # fmt: skip
    assert wait_for(lambda: pids.exists() and pids.read_text().strip()), "the run never started"
    run_pids = run_processes(pids)
    assert all(alive(p) for p in run_pids)
    return proc, run_pids


def assert_nothing_left(tmp_path: Path, run_pids: list[tuple[int, str | None]]) -> None:
    assert wait_for(lambda: not any(alive(p) for p in run_pids), 20), "the run outlived its job"
    assert not (tmp_path / "records/t/trial0.json").exists(), "an interrupted trial wrote a record"
    assert not list((tmp_path / "records").rglob("*.json"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_job_stops_the_run_and_writes_nothing(sig, make_spec, tmp_path):
    proc, run_pids = start_hanging_trial(make_spec, tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert f"interrupted by {sig.name}" in err and "no record written" in err
    assert_nothing_left(tmp_path, run_pids)
    assert (
        f"[launch] interrupted by {sig.name}: stopping the run"
        in (tmp_path / "logs/t.log").read_text()
    )


def test_a_sigkilled_job_leaves_no_run_behind(make_spec, tmp_path):
    """SIGKILL gives the job no chance to clean up: its watchdog stops the run."""
    proc, run_pids = start_hanging_trial(make_spec, tmp_path)
    proc.kill()
    proc.wait(timeout=30)
    assert_nothing_left(tmp_path, run_pids)


# A job process that starts the hanging run, then is held up (descheduled) before it tells
# its watchdog the run's process group: it is SIGKILLed in that moment.
HELD_UP_JOB = """
import sys, time
from pathlib import Path
from workflow_scripts.runtimes import base
base._watch = lambda watchdog, pgid: time.sleep(600)
wrapped = base.Wrapped(cmd=[sys.argv[1]], env={"PATH": "/usr/bin:/bin"})
base.run_logged(wrapped, Path(sys.argv[2]), timeout_s=600)
"""


def test_a_job_killed_before_it_told_its_watchdog_leaves_no_run_behind(tmp_path):
    """The watchdog learns the run's process group from the run's own start (before its
    program), not only from the job process after Popen returned."""
    pids = tmp_path / "pids"
    env = fake_python(tmp_path, HANGING.format(pids=pids))
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_UP_JOB, env["python"], str(tmp_path / "job.log")],
        cwd=REPO_ROOT, start_new_session=True,
    )  # fmt: skip
    assert wait_for(lambda: pids.exists() and pids.read_text().strip()), "the run never started"
    run_pids = run_processes(pids)
    proc.kill()
    proc.wait(timeout=30)
    assert wait_for(lambda: not any(alive(p) for p in run_pids), 20), "the run outlived its job"


def test_a_job_whose_starter_is_gone_stops(make_spec, tmp_path):
    """Snakemake SIGKILLed: its job's shell lives on, the job notices Snakemake is gone.
    Here: starter (python) -> shell -> the trial job; the starter is killed."""
    starter = "import subprocess, sys; subprocess.run(['sh', '-c', sys.argv[1] + '; echo end'])"
    pids = tmp_path / "pids"
    env = fake_python(tmp_path, HANGING.format(pids=pids))
    cmd = trial_cli(make_spec(timeout_s=600), env, tmp_path)
    shell_cmd = " ".join("'" + c.replace("'", "'\\''") + "'" for c in cmd)
    proc = subprocess.Popen(
        [sys.executable, "-c", starter, shell_cmd], cwd=REPO_ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert wait_for(lambda: pids.exists() and pids.read_text().strip())
    run_pids = run_processes(pids)
    proc.kill()
    proc.wait(timeout=30)
    assert_nothing_left(tmp_path, run_pids)
    # the job writes its line as it stops the run: on a busy machine just after
    log = tmp_path / "logs/t.log"
    assert wait_for(lambda: "is gone: stopping the run" in log.read_text()), log.read_text()


def run_fake(make_spec, tmp_path: Path, script: str, **spec_fields) -> dict:
    env = fake_python(tmp_path, script)
    out = tmp_path / "records" / "t" / "trial0.json"
    return policy(make_spec(**spec_fields), env, out, tmp_path / "logs" / "t.log")


def test_a_run_killed_by_sigterm_from_outside_is_interrupted_not_crashed(make_spec, tmp_path):
    with pytest.raises(runtimes.Interrupted, match="interrupted by SIGTERM"):
        run_fake(make_spec, tmp_path, "#!/bin/sh\nkill -TERM $$\n")
    assert not list(tmp_path.glob("records/**/*.json"))


OK_RESULT = """
import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
json.dump({"status": "ok", "error": None, "metrics": {
    "samples_per_s": 10.0, "step_time_s": {"median": 0.1}, "time_to_first_step_s": 0.2,
    "peak_rss_mb": 100.0}}, open(out, "w"))
"""


def test_a_result_then_a_crash_is_not_ok(make_spec, tmp_path):
    crash = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
    script = f"#!{sys.executable}\n{OK_RESULT}\n{crash}"
    rec = run_fake(make_spec, tmp_path, script)
    assert rec["status"] == "crashed"
    assert rec["error"]["type"] == "CrashedAfterResult"
    assert rec["error"]["message"] == "the run wrote its result, then killed by signal 11 (SIGSEGV)"
    assert rec["metrics"]["samples_per_s"] == 10.0  # kept for a look, never in a median


def test_an_unnamed_signal_is_reported_by_number(make_spec, tmp_path):
    rec = run_fake(make_spec, tmp_path, "#!/bin/sh\nkill -s 40 $$\n")
    assert rec["status"] == "crashed"
    assert "killed by signal 40 (signal 40) without writing a result" in rec["error"]["message"]


def test_container_exit_codes_are_read_as_signals():
    assert measured.killed_by(137, container=True) == signal.SIGKILL
    assert measured.killed_by(139, container=True) == signal.SIGSEGV
    assert measured.killed_by(143, container=True) == signal.SIGTERM
    assert measured.killed_by(137, container=False) is None  # a local process's own exit code
    assert measured.killed_by(-9) == signal.SIGKILL and measured.killed_by(1) is None
    assert measured.how_it_ended(139, container=True) == "killed by signal 11 (SIGSEGV)"


def test_a_failed_allocation_is_oom(make_spec, tmp_path):
    """A real MemoryError under an address-space limit, recorded as the harness does."""
    script = f"""#!{sys.executable}
import json, resource, sys, traceback
out = sys.argv[sys.argv.index("--out") + 1]
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
try:
    blob = bytearray(4 << 30)
except MemoryError as exc:
    json.dump({{"status": "failed", "metrics": {{}}, "error": {{"type": "MemoryError",
              "message": str(exc), "tail": traceback.format_exc()}}}}, open(out, "w"))
"""
    rec = run_fake(make_spec, tmp_path, script)
    assert rec["status"] == "oom", rec["error"]
    assert rec["error"]["type"] == "MemoryError"


def memory_cgroup(name: str, limit_mb: int) -> Path | None:
    """A child of this process's memory cgroup with a limit and no swap (v1 or v2)."""
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory", path.lstrip("/"))
            limits = {"memory.limit_in_bytes": limit_mb << 20, "memory.swappiness": 0}
        elif hierarchy == "0" and not controllers and v2:
            base = Path("/sys/fs/cgroup", path.lstrip("/"))
            limits = {"memory.max": limit_mb << 20, "memory.swap.max": 0}
        else:
            continue
        child = base / name
        try:
            child.mkdir(exist_ok=True)
            for file, value in limits.items():
                if (child / file).exists():
                    (child / file).write_text(str(value))
            return child
        except OSError:
            continue
    return None


def test_the_out_of_memory_killer_is_oom(make_spec, tmp_path):
    """The trial job in a memory cgroup of 200 MB; its run allocates far more and the
    kernel's out-of-memory killer ends it."""
    group = memory_cgroup(f"study-oom-test-{os.getpid()}", 200)
    assert group is not None, (
        "no writable memory cgroup here: this test needs to make one with a limit (as root, "
        "as CI runs, or with a delegated cgroup)"
    )
    script = f"""#!{sys.executable}
blocks = []
while True:
    blocks.append(bytearray(32 << 20))
    for i in range(0, len(blocks[-1]), 4096):
        blocks[-1][i] = 1
"""
    env = fake_python(tmp_path, script)
    cmd = trial_cli(make_spec(timeout_s=120), env, tmp_path)
    starter = f"echo $$ > {group}/cgroup.procs && exec " + " ".join(f"'{c}'" for c in cmd)
    try:
        proc = subprocess.run(["sh", "-c", starter], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        rec = json.loads((tmp_path / "records/t/trial0.json").read_text())
        assert rec["status"] == "oom", rec["error"]
        assert rec["error"]["type"] == "OutOfMemory"
        assert "out-of-memory killer" in rec["error"]["message"]
        assert "SIGKILL" in rec["error"]["message"]
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 30)
        group.rmdir()


def test_an_interrupted_calibration_writes_no_reference(tmp_path):
    """The calibration's probe hangs; SIGTERM to the job: no reference (an empty one
    would switch the noise reruns off for good), the probe stopped."""
    pids = tmp_path / "pids"
    env = fake_python(tmp_path, HANGING.format(pids=pids))
    env_json = tmp_path / "env.json"
    env_json.write_text(json.dumps(env))
    out = tmp_path / "calibration" / "fake.json"
    cmd = [sys.executable, "-m", "workflow_scripts.calibration", f"--env-json={env_json}",
           f"--out={out}", f"--log={tmp_path / 'calibrate.log'}"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    assert wait_for(lambda: pids.exists() and pids.read_text().strip())
    run_pids = run_processes(pids)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "no reference written" in err
    assert wait_for(lambda: not any(alive(p) for p in run_pids), 20)
    assert not out.exists() and not list(out.parent.glob("*"))


def test_a_failed_environment_build_names_itself_and_is_never_trusted(tmp_path):
    """A lock whose hash does not match: the build fails naming the environment and its
    log, writes no environment record, and leaves no environment marked complete (the
    next build starts over)."""
    lock = tmp_path / "bad.txt"
    lock.write_text("six==1.16.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    root, out, log = tmp_path / "envs", tmp_path / "bad.json", tmp_path / "bad.log"
    cmd = [sys.executable, "-m", "workflow_scripts.envs", "--name=bad", f"--requirements={lock}",
           f"--root={root}", f"--out={out}", f"--log={log}"]  # fmt: skip
    for _attempt in range(2):
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode != 0
        assert "building environment 'bad' failed" in proc.stderr and f"see {log}" in proc.stderr
        assert not out.exists()
        assert not list(root.glob("*/.complete.json"))
    assert "removing incomplete environment" in log.read_text()  # the second one started over


def test_a_machine_that_cannot_give_the_cpus_runs_nothing(make_spec, tmp_path):
    """Checked again where the trial runs (a cluster node may have fewer CPUs than the
    submit host): a failed record naming the field, and the run never started."""
    pids = tmp_path / "pids"
    spec = make_spec(threads=1)
    spec = spec | {"threads": 4096}  # as if planned on a bigger machine
    env = fake_python(tmp_path, HANGING.format(pids=pids))
    out = tmp_path / "records" / "big" / "trial0.json"
    rec = policy(spec, env, out, tmp_path / "logs" / "big.log")
    assert rec["status"] == "failed" and rec["error"]["type"] == "MachineMismatch"
    assert "experiment t.threads: 4096 is more than the" in rec["error"]["message"]
    assert json.loads(out.read_text())["status"] == "failed"
    assert not pids.exists(), "the run started"
    # nor its data (a data_dir that the submit host has and the node does not)
    spec = make_spec(data="image_folder", data_dir=str(tmp_path))
    rec = policy(spec, env, out, tmp_path / "logs" / "big.log", data_path=str(tmp_path / "no"))
    assert rec["error"]["type"] == "MachineMismatch"
    assert "does not exist on this machine" in rec["error"]["message"]
    assert not pids.exists(), "the run started"


def test_only_a_runs_own_gone_processes_lose_their_shm_segments(tmp_path):
    from workflow_scripts import shm

    root = tmp_path / "shm"
    root.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine_gone, mine_alive, others = dead.pid, os.getpid(), dead.pid + 1
    for name in (f"{mine_gone}:0:0", f"{mine_gone}:0:1", f"{mine_alive}:0:0", f"{others}:0:0",
                 f"{mine_gone}-not-a-segment", "libpod_lock"):  # fmt: skip
        (root / name).write_text("")
    folder = shm.make_folder()
    os.environ[shm.PIDS_VAR] = folder
    try:
        shm.register(mine_gone)
        shm.register()  # this process, still running
    finally:
        del os.environ[shm.PIDS_VAR]
    assert shm.registered(folder) == {mine_gone, mine_alive}
    assert shm.cleanup(folder, root) == [f"{mine_gone}:0:0", f"{mine_gone}:0:1"]
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [f"{mine_alive}:0:0", f"{others}:0:0", f"{mine_gone}-not-a-segment", "libpod_lock"]
    )
    assert not os.path.exists(folder)
    shm.register()  # outside a run: nothing to do
    assert shm.cleanup(None, root) == []


def test_only_this_hosts_gone_checks_lose_their_first_step_gradients(tmp_path, monkeypatch):
    """A rank killed before its gradient check's verdict leaves the first step's
    gradients in the temporary folder: the next sweep removes those of this host's
    processes that are gone, and nothing else (a running check's, another node's in a
    folder the nodes share, what is not a check's)."""
    from workflow_scripts import shm
    from workflow_scripts.rank import gradcheck

    dead = subprocess.Popen(["true"])
    dead.wait()
    host = shm.host().replace("-", "_")
    names = {
        "gone": f"gradcheck-{host}-{dead.pid}-abc",
        "running": f"gradcheck-{host}-{os.getpid()}-abc",
        "other node": f"gradcheck-another_node-{dead.pid}-abc",
        "no pid": f"gradcheck-{host}-x{dead.pid}-abc",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "first-step.pt").write_bytes(b"0" * 1024)
    (tmp_path / f"gradcheck-{host}-{dead.pid}-file").write_text("")  # not a folder
    assert shm.sweep_scratch(tmp_path) == [names["gone"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*(v for k, v in names.items() if k != "gone"), f"gradcheck-{host}-{dead.pid}-file"]
    )
    # a new check's folder is named so, and made after a sweep of the same folder
    (tmp_path / names["gone"]).mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = Path(gradcheck.make_folder())
    assert made.parent == tmp_path and made.name.startswith(f"gradcheck-{host}-{os.getpid()}-")
    assert not (tmp_path / names["gone"]).exists()
    assert shm.sweep_scratch(tmp_path / "missing") == []


def test_each_host_removes_its_own_part_of_a_runs_segments(tmp_path):
    """A pid means something only on its host: registrations go under the host's name,
    a host's cleanup takes only its own part, and the folder goes with the last part.
    Another node runs its part as a script (what the job's cleanup step runs there)."""
    from workflow_scripts import shm

    dead = subprocess.Popen(["true"])
    dead.wait()
    folder = Path(shm.make_folder())
    os.environ[shm.PIDS_VAR] = str(folder)
    try:
        shm.register(dead.pid)
    finally:
        del os.environ[shm.PIDS_VAR]
    assert (folder / shm.host() / str(dead.pid)).exists()
    # another node's registration of the same pid number (its own process, its own shm)
    (folder / "another-node").mkdir()
    (folder / "another-node" / str(dead.pid)).touch()
    segment = shm.SHM / f"{dead.pid}:0:0"
    segment.write_bytes(b"")
    try:
        part = [sys.executable, str(REPO_ROOT / "workflow_scripts" / "shm.py"), str(folder)]
        script = subprocess.run(part, capture_output=True, text=True, timeout=60)
    finally:
        leftover = segment.exists()
        segment.unlink(missing_ok=True)
    assert script.returncode == 0, script.stderr
    assert script.stdout.split() == [shm.host(), segment.name] and not leftover
    # this host's part is gone, the other node's is not, nor the folder that holds it
    assert sorted(p.name for p in folder.iterdir()) == ["another-node"]
    assert shm.job_nodes({"SLURM_JOB_NUM_NODES": "2"}) == 2 and shm.job_nodes({}) == 1
    assert shm.spread_command(folder, 2)[:5] == [
        "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--overlap"]  # fmt: skip
    shutil.rmtree(folder / "another-node")
    assert shm.cleanup(folder) == [] and not folder.exists()  # the last part: the folder too


def test_a_cleanup_step_that_fails_is_said_and_this_nodes_part_is_still_done(tmp_path, monkeypatch):
    """In a job of several nodes the cleanup runs as an srun step; when that step fails
    (a stand-in srun that refuses, as srun does in a job SLURM is ending), the run's log
    gets the reason, and this node's own part is done all the same."""
    from workflow_scripts import shm

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        "#!/bin/sh\necho 'srun: error: job 7 is completing' >&2\nexit 1\n"
    )
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    dead = subprocess.Popen(["true"])
    dead.wait()
    folder = Path(shm.make_folder())
    (folder / shm.host()).mkdir()
    (folder / shm.host() / str(dead.pid)).touch()
    root = tmp_path / "shm"
    root.mkdir()
    (root / f"{dead.pid}:0:0").write_text("")
    problems: list[str] = []
    assert shm.cleanup(folder, root, problems) == [f"{dead.pid}:0:0"]
    assert not folder.exists() and not list(root.iterdir())
    assert problems == []  # (another /dev/shm than the node's: no step for it)
    folder = Path(shm.make_folder())
    assert shm.cleanup(folder, problems=problems) == [] and not folder.exists()
    assert problems == ["the cleanup step on the job's 2 nodes failed (1): srun: error: job 7 "
                        "is completing"]  # fmt: skip


def slurm_job_here(tmp_path, monkeypatch, job_id: str) -> Path:
    """This process as if in SLURM job job_id, on a machine without SLURM: in a SLURM job
    a single-process run is a job step of its own, so a stand-in srun (first on PATH, in
    the folder returned) runs the command after its options."""
    monkeypatch.setenv("SLURM_JOB_ID", job_id)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\n'
                                  'exec "$@"\n')  # fmt: skip
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


def test_a_trial_whose_earlier_job_was_lost_gets_slurms_record(make_spec, tmp_path, monkeypatch):
    """In a SLURM job, a marker of another job left beside the record means that job was
    lost whole: the next attempt writes the record from the accounting (here a stand-in
    sacct on PATH; the real one in test_slurm) and does not run the trial."""
    from workflow_scripts.trial import lost

    bin_dir = slurm_job_here(tmp_path, monkeypatch, "40")
    sacct = bin_dir / "sacct"
    sacct.write_text(
        "#!/bin/sh\necho '31|NODE_FAIL|0:0|n7|00:03:10|01:00:00|2026-11-25T20:13:44'\n"
    )
    sacct.chmod(0o755)
    pids = tmp_path / "pids"
    env = fake_python(tmp_path, HANGING.format(pids=pids))
    out = tmp_path / "records" / "t" / "trial0.json"
    out.parent.mkdir(parents=True)
    lost.marker(out).write_text('{"slurm_job_id": "31"}')
    rec = policy(make_spec(), env, out, tmp_path / "logs" / "t.log")
    assert rec["status"] == "node_fail" and rec["error"]["type"] == "SlurmNodeFailure"
    assert rec["error"]["message"] == (
        "the trial's earlier job was lost whole: SLURM's accounting: job 31 NODE_FAIL on n7 "
        "after 00:03:10 (time limit 01:00:00, exit code 0:0, ended 2026-11-25T20:13:44)"
    )
    assert json.loads(out.read_text())["status"] == "node_fail"
    assert not pids.exists(), "the trial ran"
    assert not lost.marker(out).exists()
    # a trial that ends (here a crash) leaves no marker behind: nothing was lost
    crash = fake_python(tmp_path, "#!/bin/sh\nexit 3\n")
    rec = policy(make_spec(), crash, out, tmp_path / "logs" / "t.log")
    assert rec["status"] == "crashed" and not lost.marker(out).exists()


def test_an_interrupted_trial_in_a_slurm_job_says_so_for_its_next_attempt(
    make_spec, tmp_path, monkeypatch
):
    """SIGTERM to a trial in a SLURM job (SLURM's time limit signals first, and so does a
    user's scancel): no record, and the marker says it was interrupted, so that its next
    attempt records only SLURM's own ends from the accounting."""
    from workflow_scripts.trial import lost

    slurm_job_here(tmp_path, monkeypatch, "77")
    proc, run_pids = start_hanging_trial(make_spec, tmp_path)
    out = tmp_path / "records/t/trial0.json"
    assert json.loads(lost.marker(out).read_text()) == {"slurm_job_id": "77"}
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert_nothing_left(tmp_path, run_pids)
    assert json.loads(lost.marker(out).read_text()) == {"slurm_job_id": "77", "interrupted": True}


def test_an_exited_process_not_yet_reaped_is_gone_for_the_cleanup(tmp_path):
    """A rank that has exited but that its parent (slurmstepd, here this test) has not
    reaped yet is a zombie: its segments are removed like any gone process's, and a
    cleanup waits a little for a registered process that is still exiting."""
    import time

    from workflow_scripts import shm

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert shm.alive(child.pid)
    root = tmp_path / "shm"
    root.mkdir()
    (root / f"{child.pid}:0:0").write_text("")
    folder = shm.make_folder()
    os.environ[shm.PIDS_VAR] = folder
    try:
        shm.register(child.pid)
    finally:
        del os.environ[shm.PIDS_VAR]
    started = time.monotonic()
    # still running when the cleanup starts: it waits for the exit, then removes
    assert shm.cleanup(folder, root) == [f"{child.pid}:0:0"]
    assert time.monotonic() - started < shm.EXIT_WAIT_S
    assert not shm.alive(child.pid)  # exited, not reaped: a zombie is gone
    child.wait()


def test_waiting_for_a_run_does_not_wake_every_few_milliseconds(tmp_path):
    """The job process waits for its run whole (a pidfd), waking only for its lifeline
    checks (every ``POLL_S``): each wake-up would take a CPU from the run's threads.
    Popen's own wait with a timeout sleeps 1-50 ms at a time (about 30 a second)."""
    import resource

    from workflow_scripts.runtimes import base

    wrapped = base.Wrapped(cmd=["sleep", "2"], env={"PATH": "/usr/bin:/bin"})
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    finished = base.run_logged(wrapped, tmp_path / "run.log", timeout_s=60)
    switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before
    assert finished.returncode == 0 and not finished.timed_out and finished.wall_s >= 2
    # 4 lifeline checks in 2 s, the watchdog's start and stop: a few; polling: 60 or more
    assert switches <= 2 * 2 / base.POLL_S + 12, switches
    # and the time limit still stops a run that outlasts it
    wrapped = base.Wrapped(cmd=["sleep", "30"], env={"PATH": "/usr/bin:/bin"})
    finished = base.run_logged(wrapped, tmp_path / "slow.log", timeout_s=1.5)
    assert finished.timed_out and 1.5 <= finished.wall_s < 15
