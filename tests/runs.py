"""Snakemake runs the tests read: a copy of the workflow in a temporary folder, its dry
runs, and the quick preset, run once a session through the real ``snakemake`` in the
podman images the workflow builds (every image, experiment, launcher, data mount and
process group, and the collectives). The end-to-end tests of test_workflow (what the
study measured and reported) and test_containers_slow (what ran in which image) read that
one run, which each used to run on its own."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workflow_scripts.study.config import is_block
from workflow_scripts.trial.environment import headers_folder

REPO = Path(__file__).resolve().parents[1]
#: the workflow as a user's checkout runs it (profiles/default: read on every run)
WORKFLOW_FILES = ["Snakefile", "config.yaml", "rules", "workflow_scripts", "envs", "containers",
                  "profiles/default"]  # fmt: skip
REQUIRED_COLUMNS = [
    "experiment", "trial", "backend", "status", "samples_per_s", "step_time_median_s",
    "step_time_p90_s", "step_time_p95_s", "step_time_p99_s", "step_time_stdev_s",
    "time_to_first_step_s", "peak_rss_mb", "final_loss", "threads", "precision",
    "cpu_model", "cpu_flags", "logical_cpus", "numa_nodes", "affinity", "ld_preload",
    "torch_version", "env_lock_sha256", "git_revision",
]  # fmt: skip
# Shared across test runs and workflow copies: the wheelhouse (8+ GB of wheels) and the
# engine's storage (a rebuild of unchanged images is a layer-cache hit).
WHEELHOUSE = os.environ.get(
    "STUDY_WHEELHOUSE", os.path.expanduser("~/.cache/cpu-train-study/wheelhouse")
)
# This kind of CI host needs the opt-in containers.conf (runc, no default ulimits);
# set STUDY_CONTAINERS_CONF= (empty) on a machine where podman's defaults work.
ENGINE_CONF = os.environ.get(
    "STUDY_CONTAINERS_CONF", str(REPO / "containers/engine/containers.conf")
)
#: a whole run's limit (the quick preset in images, builds included, on 2 AVX2 cores)
RUN_LIMIT_S = 5400


def copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


@dataclass(frozen=True)
class Calibrated:
    """An environment built (``envs.build``'s record) and calibrated (the calibrate job's
    file) on this machine earlier, runtime local."""

    name: str
    env: dict
    calibration: Path


def seed_calibrations(wd: Path, calibrated: Iterable[Calibrated]) -> None:
    """Each environment's record and calibration where the study in ``wd`` keeps its
    own, the calibration written last: its build_env and calibrate jobs then do not run
    (their outputs are there, newer than their inputs), and its trials take these as
    their reference."""
    for c in calibrated:
        record = wd / "results" / "envs" / f"{c.name}.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(c.env, indent=2, sort_keys=True) + "\n")
        kept = wd / "results" / "calibration" / f"{c.name}.json"
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(c.calibration, kept)


def local_study(
    dest: Path, study_yaml: str, envs_root: Path | str, calibrated: Iterable[Calibrated] = ()
) -> tuple[Path, list[str], subprocess.CompletedProcess]:
    """A study of its own (``study_yaml``, a config file beside a copy of the workflow in
    ``dest``) through the real ``snakemake``, locally, over the quick preset's settings
    and without noise reruns: the copy, the command (a dry run: add ``-n``) and its run.
    ``calibrated``: environments built and calibrated earlier (``seed_calibrations``),
    not by the study."""
    wd = copy_workflow(dest)
    seed_calibrations(wd, calibrated)
    (wd / "study.yaml").write_text(study_yaml)
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "study.yaml"]
    cmd += ["--config", "preset=quick", f"envs_root={envs_root}", "noise_retries=0"]
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for c in calibrated:  # taken as it was: not made again
        kept = wd / "results" / "calibration" / f"{c.name}.json"
        assert kept.read_bytes() == c.calibration.read_bytes(), f"{c.name} was calibrated again"
    return wd, cmd, proc


def experiments_run(proc: subprocess.CompletedProcess) -> list[str]:
    """Experiments whose job ran, from the launcher's per-job progress lines."""
    return re.findall(r"\[experiment\] (\S+) trial", proc.stdout + proc.stderr)


#: what the report rule writes beside the records (results/...)
REPORT_FILES = ("summary.csv", "comparisons.csv", "report/index.html")


def mtimes(workdir: Path) -> dict[str, float]:
    """The study's records, environment records, summary, comparisons and report: their
    mtimes."""
    files = [*workdir.glob("results/records/*/trial*.json"), *workdir.glob("results/envs/*")]
    files += [workdir / f"results/{name}" for name in REPORT_FILES]
    return {str(p.relative_to(workdir)): p.stat().st_mtime_ns for p in files}


def dry_run_jobs(workdir: Path, *config: str) -> list[dict]:
    """The jobs of a dry run, each {rule, wildcards, priority, input}, in the listed order
    (runtime local unless the config given says otherwise)."""
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "2", "--config", "runtime=local"]
    cmd += config
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs: list[dict] = []
    for line in proc.stdout.splitlines():
        if line.startswith(("rule ", "checkpoint ", "localrule ", "localcheckpoint ")):
            name = line.split(" ", 1)[1].rstrip(":")
            jobs.append({"rule": name, "wildcards": "", "priority": 0})
        elif jobs and line.startswith("    ") and ": " in line:
            key, value = line.strip().split(": ", 1)
            if key in ("wildcards", "input"):
                jobs[-1][key] = value
            elif key == "priority":
                jobs[-1]["priority"] = int(value)
    return jobs


def container_config(*extra: str) -> list[str]:
    """--config values of a run in podman images."""
    config = [
        # (noise reruns are the trial policy's, tested on their own: here they would only
        # add minutes on a shared machine)
        "preset=quick", "runtime=podman", "noise_retries=0",
        # the default image names: the base image (reused by its settings' hash) and
        # the layer cache are shared with the user's own runs
        f"containers={{wheelhouse: {WHEELHOUSE}}}",
    ]  # fmt: skip
    if ENGINE_CONF:
        config.append(f"container_engine_conf={ENGINE_CONF}")
    return [*config, *extra]


def snakemake_in_podman(wd: Path, *args: str) -> subprocess.CompletedProcess:
    """The quick preset in podman images (what config files given in args change)."""
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    cmd += ["--config", *container_config()]
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def read_folder(folder: Path) -> dict[str, dict]:
    """Every JSON file of a folder, by its name without .json."""
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}


@dataclass(frozen=True)
class QuickStudy:
    """What the quick preset's run in images wrote, read as soon as it ended: tests that
    change the workflow copy afterwards (a Containerfile edited) leave this as it was."""

    wd: Path
    proc: subprocess.CompletedProcess
    summary: pd.DataFrame  # one row per experiment (one trial each)
    records: dict[str, dict]  # experiment -> its trial's record
    images: dict[str, dict]
    calibrations: dict[str, dict]
    collectives: dict[str, dict]
    html: str
    comparisons: pd.DataFrame  # every comparison the report states (comparisons.csv)
    # the first round's provisional reports (rounds/<stage>/): their summary, and when
    # each was written (its page's mtime)
    stages: dict[str, tuple[pd.DataFrame, float]]

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr

    @classmethod
    def run(cls, wd: Path) -> QuickStudy:
        # (from none of this machine's precompiled headers: what the study builds of
        # them is seen, test_containers_slow; they are a cache, built again on demand)
        shutil.rmtree(headers_folder(), ignore_errors=True)
        return cls.read(wd, snakemake_in_podman(wd))

    @classmethod
    def read(cls, wd: Path, proc: subprocess.CompletedProcess) -> QuickStudy:
        results = wd / "results"
        records = {p.parent.name: json.loads(p.read_text())
                   for p in results.glob("records/*/trial0.json")}  # fmt: skip
        return cls(
            wd, proc, pd.read_csv(results / "summary.csv"), records,
            read_folder(results / "images"), read_folder(results / "calibration"),
            read_folder(results / "collectives"), (results / "report/index.html").read_text(),
            pd.read_csv(results / "comparisons.csv"),
            {stage: (pd.read_csv(results / f"rounds/{stage}/summary.csv"),
                     (results / f"rounds/{stage}/report/index.html").stat().st_mtime)
             for stage in ("first", "families")},
        )  # fmt: skip


def pick_runs(section: dict, keep) -> dict:
    """The groups of a study (config.yaml's, a preset's) with only the runs ``keep``
    names (a single run by its id, a sweep by its name), each in its group (and block)
    with their shared fields: e.g. part of the quick preset for a --configfile."""

    def picked(runs: list[dict]) -> list[dict]:
        out = []
        for run in runs:
            if is_block(run):  # a block: the runs it keeps, with its shared fields
                inner = picked(run["runs"])
                out += [{**run, "runs": inner}] if inner else []
            elif run.get("id", run.get("name")) in keep:
                out.append(run)
        return out

    groups = {}
    for name, group in section["groups"].items():
        runs = picked(group["runs"])
        if runs:
            groups[name] = {**group, "runs": runs}
    return groups


# --------------------------------------------------------------------------- bad configs


def dry_run(wd: Path, *config: str, study: dict | None = None) -> subprocess.CompletedProcess:
    """A dry run of the workflow copy ``wd`` (the study part ``study`` as a --configfile,
    then ``config`` as --config values); it creates nothing."""
    import yaml

    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "1"]
    if study is not None:
        path = wd / "study.yaml"
        path.write_text(yaml.safe_dump(study, sort_keys=False))
        cmd += ["--configfile", str(path)]
    cmd += ["--config", "runtime=local", *config]
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=300)
    assert not (wd / "results").exists()  # a dry run, and a bad config, create nothing
    return proc


def failed(proc: subprocess.CompletedProcess) -> str:
    """The output of a run that stopped with a message, never a traceback."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert "Traceback" not in out, out[-3000:]
    return out


def jobs(proc: subprocess.CompletedProcess, rule: str = "run_experiment") -> int:
    """How many jobs of ``rule`` a dry run planned."""
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == rule:
            return int(parts[1])
    return 0


#: what a refused config may cost: seconds, and this much address space for Snakemake
REFUSE_WITHIN_S = 60
REFUSE_WITHIN_BYTES = 4 * 2**30


def limited_dry_run(where: Path, *config: str, study: dict | None = None):
    """:func:`dry_run` with an address-space limit on Snakemake, timed: (its run, seconds)."""
    import resource
    import time

    import yaml

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (REFUSE_WITHIN_BYTES, REFUSE_WITHIN_BYTES))

    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "1"]
    if study is not None:
        (where / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
        cmd += ["--configfile", str(where / "study.yaml")]
    cmd += ["--config", "runtime=local", *config]
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=where, capture_output=True, text=True, timeout=300, preexec_fn=limit
    )
    took = time.monotonic() - t0
    assert not (where / "results").exists()
    return proc, took


def waiting_jobs_workflow(jobs: int, sleep: float) -> str:
    """A Snakefile of ``jobs`` local jobs that each sleep ``sleep`` seconds in a ``run:``
    block (threads of Snakemake's own process: ``--force-use-threads``) and write how many
    re-evaluation timers its scheduler had pending meanwhile; the fix installed where
    ``--config install=True`` (test_snakemake_timers.py, benchmarks/scheduler_cpu.py)."""
    return textwrap.dedent(
        f"""
        import sys, threading, time
        sys.path.insert(0, {str(REPO)!r})
        from workflow_scripts import snakemake_timers

        if config["install"]:
            snakemake_timers.install()
            snakemake_timers.install()  # twice changes nothing

        rule all:
            input: expand("out/{{i}}.txt", i=range({jobs}))

        rule one:
            output: "out/{{i}}.txt"
            run:
                # the scheduler's pending re-evaluation timers while this job runs
                timers = sum(isinstance(t, threading.Timer) for t in threading.enumerate())
                time.sleep({sleep})
                open(output[0], "w").write(f"{{timers}}\\n")
        """
    )


def timers_seen(wd, jobs: int) -> list[int]:
    """What each job of ``waiting_jobs_workflow`` run in ``wd`` wrote."""
    return [int((wd / "out" / f"{i}.txt").read_text()) for i in range(jobs)]


#: a study that a one-second budget cannot hold: the question (the ladder's two runs
#: and the other group's baseline) is kept; the plan leaves out the other group's three
#: more runs (:data:`LEFT_BY_PLAN`) before anything starts
BUDGET_PART = {
    "trials": 2,
    "max_trials": 2,
    "defaults": {"far_stop": None, "model": "cnn", "image_size": 32},
    "groups": {
        "ladder": {"runs": [{"id": "base"}, {"id": "bf16", "precision": "bf16"}]},
        "other": {"runs": [{"id": "o-base"}, {"id": "o-bf16", "precision": "bf16"},
                           {"name": "o-batch", "batch_size": [4, 16]}]},
    },
}  # fmt: skip
LEFT_BY_PLAN = {"o-bf16", "o-batch-bs4", "o-batch-bs16"}
