"""One-off work once per configuration, through the real workflow (tests/test_carry.py
and tests/test_trial.py have the fast tests of workflow_scripts/trial/carry.py): a
compiled experiment's later trial starts from its first trial's compile cache, and the
report's compile latency stays the cold one."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest

from tests.conftest import ENVS_ROOT
from tests.runs import local_study
from workflow_scripts.report import stats as report_stats
from workflow_scripts.summary import records as summary_records

pytestmark = [pytest.mark.slow, pytest.mark.torch]

#: the quick preset's tiny CNN, compiled with Inductor, two trials
COMPILED_STUDY = """
runtime: local
trials: 2
max_trials: null
collectives: {variants: []}
defaults: {warmup_steps: 1, steps: 3, step_precision: null}
groups:
  compiled:
    runs:
      - {id: compiled, backend: inductor}
"""


def test_a_later_trial_compiles_from_the_first_trials_cache(
    upstream_env, upstream_calibration, tmp_path
):
    wd, cmd, _ = local_study(tmp_path / "wf", COMPILED_STUDY, ENVS_ROOT, [upstream_calibration])
    folder = wd / "results/records/compiled"
    first, later = (json.loads((folder / f"trial{k}.json").read_text()) for k in (0, 1))
    assert first["status"] == later["status"] == "ok", (first.get("error"), later.get("error"))

    # trial 0 compiled cold, into the folder it left beside its record ...
    cold, warm = first["provenance"]["compile_cache"], later["provenance"]["compile_cache"]
    assert cold["fresh"] is True and cold["kept"] and cold["dir"] == str(folder / "compile-cache")
    assert any((folder / "compile-cache").iterdir())
    hits = first["checks"]["compile"]["cache"]
    assert hits["fxgraph_cache_miss"] > 0 and hits["fxgraph_cache_hit"] == 0, hits
    # ... and trial 1 from a copy of it, gone afterwards: every graph a cache hit
    assert warm["fresh"] is False and warm["from"] == "trial 0" and warm["removed"] is True
    hits = later["checks"]["compile"]["cache"]
    assert hits["fxgraph_cache_hit"] > 0 and hits["fxgraph_cache_miss"] == 0, hits
    assert hits["autograd_cache_hit"] > 0 and hits["autograd_cache_miss"] == 0, hits
    left = sorted(p.name for p in folder.iterdir())
    assert left == ["compile-cache", "trial0.json", "trial1.json"]
    # the warm compile is the cheaper one, as the estimate of each trial said it would be
    assert later["checks"]["compile"]["compile_s"] < first["checks"]["compile"]["compile_s"]
    assert later["estimate"]["parts"]["compile"] < first["estimate"]["parts"]["compile"]

    # the summary says which trial started warm; the compile latency is trial 0's
    summary = pd.read_csv(wd / "results/summary.csv").set_index("trial")
    assert list(summary["compile_cache_fresh"]) == [True, False]
    stats = report_stats.experiment_stats(summary_records.summary_frame([first, later]))
    # (whichever trial the noise check leaves out of the throughput: trial 0's cold compile)
    assert stats.iloc[0]["time_to_first_step_s"] == first["metrics"]["time_to_first_step_s"]
    assert stats.iloc[0]["n_ok"] == 2

    # nothing changed: nothing reruns (the cache beside the records is no input)
    again = subprocess.run(cmd + ["-n"], cwd=wd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
