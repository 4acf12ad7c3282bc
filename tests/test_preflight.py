"""The pre-flight preset (``--config preset=preflight``): the default study's every
experiment at its real size with the fewest steps, into results/preflight/; the
study's estimate then uses what it measured."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import ENVS_ROOT
from tests.runs import copy_workflow, dry_run_jobs, seed_calibrations
from workflow_scripts import study
from workflow_scripts.plan import preflight, study_estimate

pytestmark = pytest.mark.slow


def test_the_preflight_plans_every_experiment_of_the_study_at_its_real_size(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    default = study.load_study(study.read_config(wd / "config.yaml"))
    jobs = dry_run_jobs(wd, "preset=preflight")
    runs = [j["wildcards"] for j in jobs if j["rule"] == "run_experiment"]
    assert sorted(runs) == sorted(f"experiment={i}, trial=0" for i in default.ids)
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "2", "--config", "runtime=local",
         "preset=preflight"], cwd=wd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = set(re.findall(r"results/\S+/records/\S+/trial\d\.json", proc.stdout))
    assert outputs == {f"results/preflight/records/{i}/trial0.json" for i in default.ids}
    assert "results/preflight/report/index.html" in proc.stdout
    assert "this study will take about" in proc.stderr


#: a part of the default study's pre-flight: ResNet-50 at 224 px, batch 16 (the
#: ladder's baseline), and one run of the accuracy experiment (torchrun, digits, epochs)
SUBSET = ("baseline", "acc-gloo-fp32-seed0-r1-t2")


@pytest.mark.torch
def test_a_preflight_runs_whole_steps_and_feeds_the_studys_estimate(upstream_calibration, tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    seed_calibrations(wd, [upstream_calibration])  # (the calibrate job is not tested here)
    targets = [f"results/preflight/records/{i}/trial0.json" for i in SUBSET]
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *targets, "--config",
           "runtime=local", "preset=preflight", f"envs_root={ENVS_ROOT}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert not (wd / "results/records").exists()  # the study's own records stay apart
    records = {i: json.loads((wd / t).read_text()) for i, t in zip(SUBSET, targets)}
    for rec in records.values():
        assert rec["status"] == "ok", rec.get("error")
        assert rec["gradient_check"]["ok"]
    base = records["baseline"]
    assert base["spec"]["model"] == "resnet50" and base["spec"]["image_size"] == 224
    assert base["spec"]["batch_size"] == 16
    assert len(base["losses"]) == 2 and base["metrics"]["steps_timed"] == 1
    acc = records["acc-gloo-fp32-seed0-r1-t2"]
    assert len(acc["losses"]) == preflight.EPOCH_STEPS and acc["metrics"]["epochs"] == 1
    assert 0 <= acc["metrics"]["test_accuracy"] <= 1  # scored on the held-out split

    # its report says what it is
    out = tmp_path / "report"
    paths = [str(wd / t) for t in targets]
    cmd = [sys.executable, "-m", "workflow_scripts.report", "--records", *paths,
           f"--summary={out / 'summary.csv'}", f"--html={out / 'index.html'}",
           f"--plots-dir={out}", f"--log={out / 'report.log'}"]  # fmt: skip
    out.mkdir()
    built = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    headline = (out / "index.html").read_text().split('class="headline"', 1)[1][:3000]
    assert "<b>A pre-flight</b>: every experiment ran at its real size" in headline

    # the default study's estimate now rests on these two measurements
    default = study.load_study(study.read_config(wd / "config.yaml"))
    est = study_estimate.for_study(default, wd / "results", measure=False)
    assert est["basis"][0] == f"pre-flight measurements for 2 of {len(default.ids)} experiments"
    spec = default.by_id["baseline"]
    got = est["experiments"]["baseline"]
    step = base["metrics"]["step_time_s"]["median"]
    more = spec["warmup_steps"] + got["timed_steps"] - 2
    assert got["basis"] == "pre-flight" and got["step_s"] == pytest.approx(step, abs=1e-3)
    assert got["seconds"] == pytest.approx(base["trial_wall_s"] + more * step, abs=0.05)
    assert est["experiments"]["bf16"]["basis"] != "pre-flight"
    dry = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "2", "--config", "runtime=local"],
        cwd=wd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "[estimate] basis: pre-flight measurements for 2 of" in dry.stderr, dry.stderr[-2000:]
