"""A bad configuration stops the workflow before any job: ``snakemake -n`` on a copy of
the workflow refuses it, names the field and its value, and creates nothing under
results/. (Every other mistake, through the same dry run: tests/test_config_errors.py;
the workflow end to end: tests/test_workflow.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.runs import copy_workflow


@pytest.mark.parametrize(
    "override, message",
    [
        ("preset=nope", "not a preset"),
        ("trials=0", "trials"),
    ],
)
def test_bad_config_stops_before_any_job(tmp_path, override, message):
    wd = copy_workflow(tmp_path / "wf")
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config", "runtime=local"]
    cmd.append(override)
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert message in out.lower() or message in out
    assert not (wd / "results").exists()


def test_bad_experiment_field_names_path_value_and_allowed(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    config = (wd / "config.yaml").read_text()
    (wd / "config.yaml").write_text(config.replace("precision: bf16", "precision: fp16", 1))
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config", "runtime=local"]
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "precision" in out and "fp16" in out and "bf16" in out, out[-3000:]
    assert os.path.exists(wd / "config.yaml")
