"""End to end: the quick preset through Snakemake in a temporary copy of the workflow."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ENVS_ROOT, REPO

WORKFLOW_FILES = ["Snakefile", "config.yaml", "rules", "workflow_scripts", "envs"]
REQUIRED_COLUMNS = [
    "experiment", "trial", "backend", "status", "samples_per_s", "step_time_median_s",
    "step_time_p90_s", "step_time_p95_s", "step_time_p99_s", "step_time_stdev_s",
    "time_to_first_step_s", "peak_rss_mb", "final_loss", "threads", "precision",
    "cpu_model", "cpu_flags", "logical_cpus", "numa_nodes", "affinity", "ld_preload",
    "torch_version", "env_lock_sha256", "git_revision",
]  # fmt: skip


def copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    cmd += ["--config", "preset=quick", f"envs_root={ENVS_ROOT}"]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=3000)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def experiments_run(proc: subprocess.CompletedProcess) -> list[str]:
    """Experiments whose job ran, from the launcher's per-job progress lines."""
    return re.findall(r"\[experiment\] (\S+) trial", proc.stdout + proc.stderr)


def mtimes(workdir: Path) -> dict[str, float]:
    files = [*workdir.glob("results/records/*/trial*.json"), *workdir.glob("results/envs/*")]
    files += [workdir / "results/summary.csv", workdir / "results/report/index.html"]
    return {str(p.relative_to(workdir)): p.stat().st_mtime_ns for p in files}


@pytest.mark.slow
@pytest.mark.torch
def test_quick_preset_end_to_end_and_rerun_only_what_changed(tmp_path):
    wd = copy_workflow(tmp_path / "wf")

    # 1. the whole quick study
    first = snakemake(wd)
    summary = pd.read_csv(wd / "results/summary.csv")
    assert set(REQUIRED_COLUMNS) <= set(summary.columns)
    expected = {
        "baseline", "bf16", "bf16-cl", "inductor-fp32", "runcpu-tcmalloc", "ipex-optimize-fp32",
        "xla-fp32", "resnet18", "folder", "workers-nw0", "workers-nw1",
    }  # fmt: skip
    assert set(summary["experiment"]) == expected
    assert sorted(experiments_run(first)) == sorted(expected)  # a progress line per job
    failed = summary[summary["status"] != "ok"]
    assert failed.empty, failed[["experiment", "status", "error"]].to_string()
    assert set(summary["backend"]) == {"eager", "inductor", "ipex", "xla"}
    assert (summary["samples_per_s"] > 0).all()
    versions = dict(zip(summary["backend"], summary["torch_version"]))
    assert versions["ipex"].startswith("2.8.") and versions["xla"].startswith("2.9.")
    assert versions["eager"].startswith("2.14.")
    assert summary["ipex_version"].dropna().str.startswith("2.8").any()
    assert summary.set_index("experiment").loc["runcpu-tcmalloc", "ld_preload"].count("tcmalloc")
    html = (wd / "results/report/index.html").read_text()
    for needle in ("ladder", "samples/s", "<svg", "bf16-cl", "xla-fp32", "per dollar"):
        assert needle in html
    assert not re.search(r"(src|href)=[\"']https?://", html)  # self-contained
    # no two measurements overlapped in time
    records = [json.loads(p.read_text()) for p in wd.glob("results/records/*/trial*.json")]
    spans = sorted((r["provenance"]["launched_at"], r["provenance"]["ended_at"]) for r in records)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, spans

    # 2. nothing changed: nothing runs
    before = mtimes(wd)
    again = snakemake(wd)
    assert experiments_run(again) == []
    assert "Nothing to be done" in again.stdout + again.stderr
    assert mtimes(wd) == before

    # 3. one experiment's settings change: exactly it and the report rerun
    config = (wd / "config.yaml").read_text()
    edited = config.replace(
        "      - id: bf16-cl\n", "      - id: bf16-cl\n        batch_size: 4\n", 1
    )
    assert edited != config
    (wd / "config.yaml").write_text(edited)
    third = snakemake(wd)
    assert experiments_run(third) == ["bf16-cl"]
    after = mtimes(wd)
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {
        "results/records/bf16-cl/trial0.json", "results/summary.csv", "results/report/index.html",
    }  # fmt: skip
    row = pd.read_csv(wd / "results/summary.csv").set_index("experiment").loc["bf16-cl"]
    assert row["batch_size"] == 4

    # 4. one environment's requirements change: it is rebuilt and only its experiments rerun
    old_xla = (wd / "results/envs/xla.json").read_text()
    with open(wd / "envs/xla.txt", "a") as fh:
        fh.write("# edited by the rerun test\n")
    try:
        fourth = snakemake(wd)
        assert experiments_run(fourth) == ["xla-fp32"]
        new_xla = (wd / "results/envs/xla.json").read_text()
        assert new_xla != old_xla
        final = mtimes(wd)
        changed = {k for k in after if after[k] != final[k]}
        assert changed == {
            "results/envs/xla.json", "results/records/xla-fp32/trial0.json",
            "results/summary.csv", "results/report/index.html",
        }  # fmt: skip
    finally:  # the edited set's environment is of no further use: do not keep gigabytes
        prefix = json.loads((wd / "results/envs/xla.json").read_text())["prefix"]
        if prefix != json.loads(old_xla)["prefix"]:
            shutil.rmtree(prefix, ignore_errors=True)

    # 5. Snakemake's own report, with the plots and their captions
    snakemake(wd, "--report", "report.html")
    report = (wd / "report.html").read_text(errors="replace")
    assert "ladder.svg" in report and "speedup" in report.lower()


@pytest.mark.parametrize(
    "override, message",
    [
        ("preset=nope", "not a preset"),
        ("trials=0", "trials"),
    ],
)
def test_bad_config_stops_before_any_job(tmp_path, override, message):
    wd = copy_workflow(tmp_path / "wf")
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config", override]
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert message in out.lower() or message in out
    assert not (wd / "results").exists()


def test_bad_experiment_field_names_path_value_and_allowed(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    config = (wd / "config.yaml").read_text()
    (wd / "config.yaml").write_text(config.replace("precision: bf16", "precision: fp16", 1))
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "1"]
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "precision" in out and "fp16" in out and "bf16" in out, out[-3000:]
    assert os.path.exists(wd / "config.yaml")
