"""Extending the study, in a real run (tests/test_extending.py adds the throwaway backend
and knob to a temporary copy of the workflow and checks the rest): the toy backend and
the knob act on a real training in the upstream environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.extending import add_knob, add_toy_backend, python, study
from tests.runs import copy_workflow

pytestmark = [pytest.mark.slow, pytest.mark.torch]


HARNESS_RUN = """
import json, sys
from workflow_scripts.rank import harness
spec = json.loads(sys.argv[1])
result = harness.run(spec)
assert result["status"] == "ok", result["error"]
print(json.dumps(result["losses"]))
"""


def _losses(wd: Path, env: dict, spec: dict) -> list[float]:
    return json.loads(python(wd, HARNESS_RUN, json.dumps(spec), exe=env["python"]))


def _spec(wd: Path, **fields) -> dict:
    base = {"id": "x", "model": "cnn", "image_size": 32, "batch_size": 4, "warmup_steps": 1}
    proc = study(wd, {"groups": {"g": {"runs": [{**base, "steps": 3, "probe_size": 0, **fields}]}}})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["experiments"][0]


def test_the_toy_backend_and_knob_act_in_a_real_run(upstream_env, tmp_path):
    wd = add_toy_backend(tmp_path)
    # the toy backend's prepare() zeroes the learning rate: a model that never moves sees
    # one loss for the one repeated batch; eager learns from it
    frozen = _losses(wd, upstream_env, _spec(wd, backend="toy"))
    learning = _losses(wd, upstream_env, _spec(wd, backend="eager"))
    assert len(frozen) == 4 and max(frozen) - min(frozen) < 1e-6
    assert learning[0] == pytest.approx(frozen[0]) and learning[-1] < learning[0] - 1e-4
    # the knob: label smoothing changes the loss of the same model and batch
    knob = add_knob(copy_workflow(tmp_path / "knob"))
    plain = _losses(knob, upstream_env, _spec(knob))
    smoothed = _losses(knob, upstream_env, _spec(knob, label_smoothing=0.5))
    assert plain[0] != pytest.approx(smoothed[0])
