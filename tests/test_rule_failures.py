"""Every rule's failure ends the run (issue 25): through the real ``snakemake``, each
rule's entry point is made to fail (``STUDY_FAIL_JOBS``, read by workflow_scripts.jobs
in the entry point's own process) and the run ends non-zero with the entry point's
message, instead of a worker thread's SystemExit leaving Snakemake waiting for ever.
And a study of one experiment with no fp32 eager run builds its report. (How an entry
point's failure becomes the job's message: tests/test_jobs.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from tests.conftest import ENVS_ROOT
from tests.runs import container_config, copy_workflow
from workflow_scripts import jobs

pytestmark = pytest.mark.slow

#: a run that hangs is killed here (and the test fails); a failing one ends in seconds
HANG_GUARD_S = 600

STUDY = """
runtime: local
trials: 1
image_folder: {images_per_class: 2, classes: 2, size: 32}
collectives: {variants: [gloo], ranks: 2, sizes_kb: [1], dtypes: [float32], iterations: 2}
defaults: {model: cnn, image_size: 32, batch_size: 8, warmup_steps: 1, steps: 2}
groups:
  mine:
    runs:
      - {id: synthetic, probe_size: 0}
      - {id: digits, data: digits, probe_size: 256}
      - {id: folder, data: image_folder, probe_size: 0, batch_size: 2}
"""

ONE_EXPERIMENT = """
runtime: local
trials: 1
collectives: {variants: []}
groups:
  mine:
    runs:
      - id: cl-fp32
        channels_last: true
        model: cnn
        image_size: 32
        batch_size: 8
        warmup_steps: 1
        steps: 2
        probe_size: 0
"""


def snakemake(
    wd, configfile: str, fail: str, *args: str
) -> tuple[subprocess.CompletedProcess, float]:
    (wd / "study.yaml").write_text(configfile)
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--keep-going",
           "--configfile=study.yaml", *args]  # fmt: skip
    if "runtime=podman" not in args:
        cmd += ["--config", f"envs_root={ENVS_ROOT}"]
    env = dict(os.environ, **{jobs.FAIL_VAR: fail})
    start = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    return proc, time.monotonic() - start


def assert_failed(proc, rules: dict[str, str]):
    """The run ended non-zero, each rule's job failed with its entry point's message."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "Exception in worker" not in out, out[-3000:]
    for rule, module in rules.items():
        assert f"Error in rule {rule}:" in out, (rule, out[-4000:])
        assert f"{module} failed (exit code 1): {module}: failure injected" in out, (
            module, out[-4000:],
        )  # fmt: skip


def test_every_rules_failure_ends_the_run_with_its_message(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    # 1. the jobs with no inputs: the environment and the two data sets
    proc, took = snakemake(wd, STUDY, "all")
    assert_failed(proc, {"build_env": "workflow_scripts.envs",
                         "image_folder": "workflow_scripts.imagefolder",
                         "digits": "workflow_scripts.digits"})  # fmt: skip
    print(f"setup rules failed; the run ended in {took:.1f} s")
    # 2. those made (the environment is reused), then the jobs behind them fail
    fail = "workflow_scripts.calibration,workflow_scripts.trial,workflow_scripts.collectives"
    proc, took = snakemake(wd, STUDY, fail)
    assert_failed(proc, {"calibrate": "workflow_scripts.calibration",
                         "run_experiment": "workflow_scripts.trial",
                         "collectives": "workflow_scripts.collectives"})  # fmt: skip
    assert (wd / "resources/digits").is_dir() and (wd / "resources/image_folder").is_dir()
    assert not list(wd.glob("results/records/*/trial*.json"))
    print(f"measuring rules failed; the run ended in {took:.1f} s")
    # 3. the report, behind a trial that ran
    proc, took = snakemake(wd, ONE_EXPERIMENT, "report")
    assert_failed(proc, {"report": "workflow_scripts.report"})
    assert (wd / "results/records/cl-fp32/trial0.json").exists()
    assert not (wd / "results/report/index.html").exists()
    print(f"the report failed; the run ended in {took:.1f} s")
    # 4. nothing injected: the report of one experiment with no fp32 eager run builds
    proc, took = snakemake(wd, ONE_EXPERIMENT, "")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    page = (wd / "results/report/index.html").read_text()
    summary = pd.read_csv(wd / "results/summary.csv")
    assert list(summary["experiment"]) == ["cl-fp32"] and summary["status"].eq("ok").all()
    assert '<section id="startup">' in page and "no fp32 eager run of this workload" in page


@pytest.mark.podman
def test_the_image_rules_failure_ends_the_run_with_its_message(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    config = ["--config", *container_config()]
    proc, took = snakemake(
        wd, "runtime: podman\n", "workflow_scripts.images", "results/images/eager.json",
        *config,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Exception in worker" not in out, out[-3000:]
    assert "Error in rule build_image:" in out or "Error in rule wheelhouse:" in out, out[-3000:]
    assert "workflow_scripts.images failed (exit code 1): workflow_scripts.images: failure " \
        "injected" in out, out[-3000:]  # fmt: skip
    print(f"the image rules failed; the run ended in {took:.1f} s")
