"""The one way a measured process runs (runtimes.measured.run_measured): real processes
in the local runtime, their results read and removed, an interruption from outside
raised with nothing left to read, and the container limits on every measured job's
command line."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from workflow_scripts import calibration, collectives, trial
from workflow_scripts.cluster import sizing
from workflow_scripts.runtimes import Interrupted, LocalRuntime, measured

WRITER = """
import json, sys
for i, path in enumerate(sys.argv[1:]):
    open(path, "w").write(json.dumps({"status": "ok", "rank": i}))
"""


def local() -> LocalRuntime:
    return LocalRuntime({"prefix": sys.prefix, "python": sys.executable, "name": "here"})


def run(tmp_path: Path, code: str, results: list[Path], timeout_s: float = 60):
    rt = local()
    cmd = [sys.executable, "-c", code, *map(str, results)]
    return measured.run_measured(
        rt, measured.Process(cmd, rt.environment(), "t"), log=tmp_path / "log" / "run.log",
        timeout_s=timeout_s, results=results,
    )  # fmt: skip


def test_each_process_result_is_read_and_removed(tmp_path):
    paths = [tmp_path / "r0.json", tmp_path / "r1.json"]
    paths[1].write_text('{"status": "stale"}')  # what an earlier run left is never read
    ran = run(tmp_path, WRITER, paths)
    assert ran.clean and not ran.oom and ran.unreadable is None and ran.problem() is None
    assert ran.results == [{"status": "ok", "rank": 0}, {"status": "ok", "rank": 1}]
    assert not any(p.exists() for p in paths)
    assert ran.cmd[:2] == [sys.executable, "-c"] and ran.finished.wall_s > 0
    assert (tmp_path / "log" / "run.log").exists()


def test_a_missing_or_unreadable_result_is_said(tmp_path):
    paths = [tmp_path / "r0.json", tmp_path / "r1.json"]
    code = "import sys; open(sys.argv[1], 'w').write('{not json'); sys.exit(3)"
    ran = run(tmp_path, code, paths)
    assert not ran.clean and ran.how == "exited with code 3"
    assert ran.results == [None, None]
    assert ran.unreadable.startswith("r0.json:")
    assert ran.problem() == ("UnreadableResult", ran.unreadable)


def test_a_stop_from_outside_raises_and_leaves_nothing(tmp_path):
    paths = [tmp_path / "r0.json"]
    code = WRITER + "\nimport os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n"
    with pytest.raises(Interrupted) as caught:
        run(tmp_path, code, paths)
    assert caught.value.signum == signal.SIGTERM
    assert not paths[0].exists()  # it wrote a result, which is not kept


def test_a_timeout_is_no_interruption(tmp_path):
    ran = run(tmp_path, "import time; time.sleep(30)", [tmp_path / "r.json"], timeout_s=1)
    assert ran.finished.timed_out and not ran.clean and ran.results == [None]
    assert ran.problem() == ("Timeout", "killed after its time limit of 1 s")


def job(**params):
    inputs = {"env": "results/envs/upstream.json"}
    out = SimpleNamespace(probe="p.json", record="r.json", result="c.json")
    wildcards = SimpleNamespace(trial=0, variant="gloo")
    return inputs, out, SimpleNamespace(**params), wildcards, ["x.log"]


@pytest.mark.parametrize(
    "module, params, extra",
    [
        (calibration, {"threads": "auto", "repeats": 3, "ceiling_sizes": "1024"},
         {"probe_sizes": [256]}),
        (trial, {"spec": "{}", "data_path": ""}, {"noise_retries": 1, "noise_threshold": 0.8}),
        (collectives, {"settings": json.dumps({"ranks": 2, "sizes_kb": [1], "dtypes": ["float32"],
                                               "iterations": 2})}, {}),
    ],
)  # fmt: skip
def test_every_measured_job_gets_the_container_limits(module, params, extra):
    settings = {"containers": {"shm_size": "3g", "memory": "5g", "archive": "/shared/img"},
                **extra}  # fmt: skip
    argv = module.COMMAND.argv(*job(**params), settings=settings)
    assert "--shm-size=3g" in argv and "--memory=5g" in argv
    assert "--image-archives=/shared/img" in argv  # where a cluster node loads images
    ap = argparse.ArgumentParser()
    for arg in measured.LIMIT_ARGS:  # the options as the measured entry points declare them
        arg.add_to(ap)
    args, _ = ap.parse_known_args(argv)
    info = measured.with_limits({"name": "e"}, args)
    assert info == {"name": "e", "shm_size": "3g", "memory": "5g", "image_archives": "/shared/img"}
    settings["containers"]["memory"] = None  # no limit: the option stays, empty
    assert "--memory=" in module.COMMAND.argv(*job(**params), settings=settings)


def test_the_collectives_ranks_are_a_job_of_one_task_each():
    res = sizing.collectives({"collectives": {"ranks": 2}})
    assert (res["tasks"], res["nodes"], res["mpi"]) == (2, 1, "srun")
    assert res["slurm_extra"] == "--exclusive --ntasks-per-node=2"
    assert res["cpus_per_task"] == max(1, sizing.node_cpus() // 2)  # a block per rank
    # several counts: the job holds the most (each smaller count an srun inside it)
    res = sizing.collectives({"collectives": {"ranks": [2, 4]}})
    assert res["tasks"] == 4 and res["slurm_extra"] == "--exclusive --ntasks-per-node=4"
