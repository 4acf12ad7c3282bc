"""Cluster runs, without a cluster, for real (tests/test_cluster.py has the fast tests of
workflow_scripts/cluster/sizing.py): a several-node experiment refused by ``snakemake`` where
there is one machine, and a trial on a node of another CPU model than its calibration's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.runs import copy_workflow
from workflow_scripts import trial

pytestmark = pytest.mark.slow


def test_snakemake_refuses_several_nodes_on_one_machine(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    experiment = "{id: multi, launcher: torchrun, nodes: 2, ranks: 1, threads: 1, batch_size: 8}"
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config"]
    cmd += [f"groups={{g: {{runs: [{experiment}]}}}}", "runtime=local"]
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "experiment multi.nodes: 2 nodes need a cluster" in proc.stderr + proc.stdout
    assert not (wd / "results").exists()


@pytest.mark.torch
def test_a_trial_on_another_node_type_is_not_judged_by_its_reference(
    make_spec, upstream_env, tmp_path
):
    """The calibration ran on a node of another CPU model: the trial's probes are not
    compared with it (no foreign 1e6 GFLOP/s verdict), and the trial writes no reference
    of its own (references are the calibrate rule's outputs); the log says why."""
    calibration = tmp_path / "calibration" / "upstream.json"
    calibration.parent.mkdir()
    other = {"cpu_model": "Some Other CPU", "logical_cpus": 128}
    foreign = {"entries": [{"size": 256, "threads": 1, "fp32_gflops": 1e6}], "provenance": other}
    calibration.write_text(json.dumps(foreign))
    env_json = tmp_path / "env.json"
    env_json.write_text(json.dumps(upstream_env))
    out = tmp_path / "records" / "t" / "trial0.json"
    log = tmp_path / "logs" / "t.log"
    spec = make_spec(probe_size=256, steps=2, warmup_steps=1)
    args = [f"--spec-json={json.dumps(spec)}", f"--env-json={env_json}", f"--out={out}"]
    args += [f"--log={log}", f"--reference-probe={calibration}"]
    assert trial.main([*args, "--max-retries=0"]) == 0
    assert sorted(p.name for p in calibration.parent.iterdir()) == ["upstream.json"]
    record = json.loads(out.read_text())
    assert record["status"] == "ok"
    check = record.get("noise_check") or {}
    assert "reference_fp32_gflops" not in check  # no probe judged by the foreign one
    assert all(s["signal"] != "probe before steps" for s in check.get("signals", []))
    assert "was measured on Some Other CPU" in log.read_text()
