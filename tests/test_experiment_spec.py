"""The experiment spec as the code holds it (``workflow_scripts.experiment.Spec``):
frozen, every declared field present, a misspelt name failing at its read on the host
and in a rank, and a dict for JSON, pickle and comparison."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess

import pytest

from tests.conftest import REPO, spec_of
from workflow_scripts.experiment import EXTRA_KEYS, FAR_KEY, Spec
from workflow_scripts.spec.fields import DERIVED_KEYS, FIELDS
from workflow_scripts.study import load_study
from workflow_scripts.study.entry import read_config


def test_the_loader_hands_out_frozen_specs_with_every_field():
    for preset in ("default", "quick"):
        study = load_study({**read_config(REPO / "config.yaml"), "preset": preset}, REPO)
        assert all(type(spec) is Spec for spec in study.experiments)
        assert all(set(spec) >= {*FIELDS, *DERIVED_KEYS} for spec in study.experiments)


def test_a_misspelt_name_fails_where_it_is_read():
    spec = spec_of(id="typo")
    assert type(spec) is Spec and spec["batch_size"] == spec.get("batch_size") == 4
    for read in (lambda: spec["bach_size"], lambda: spec.get("bach_size"),
                 lambda: spec.get("bach_size", 4)):  # fmt: skip
        with pytest.raises(KeyError, match="'bach_size' is not a field of experiment typo"):
            read()
    # the keys a host adds beside the fields, where it adds them: absent is their default
    assert all(spec.get(key) is None for key in EXTRA_KEYS)
    assert spec.get(FAR_KEY, "none") == "none"
    assert "bach_size" not in spec


def test_a_spec_is_frozen_and_a_change_makes_a_new_one():
    spec = spec_of(id="frozen")
    for change in (
        lambda: spec.__setitem__("steps", 9), lambda: spec.update(steps=9),
        lambda: spec.pop("steps"), lambda: spec.setdefault("x", 1),
        lambda: spec.__delitem__("steps"), lambda: spec.clear(),
    ):  # fmt: skip
        with pytest.raises(TypeError, match="a Spec is frozen"):
            change()
    longer = spec | {"steps": 9, FAR_KEY: {"factor": 1.5}}
    assert type(longer) is Spec and longer["steps"] == 9 and spec["steps"] == 3
    assert longer.get(FAR_KEY) == {"factor": 1.5}
    assert type({**spec}) is dict  # a plain copy to build on


def test_a_spec_is_a_dict_for_json_pickle_and_comparison():
    spec = spec_of(id="plain")
    assert json.loads(json.dumps(spec)) == spec == dict(spec)
    for twin in (pickle.loads(pickle.dumps(spec)), copy.deepcopy(spec), copy.copy(spec)):
        assert type(twin) is Spec and twin == spec
        with pytest.raises(KeyError):
            twin.get("bach_size")


@pytest.mark.slow
def test_a_rank_reads_its_spec_strictly_too(upstream_env, tmp_path):
    """The rank side holds its spec as a Spec: a rank handed one without a field it
    reads (here the seed) fails naming it, in its result, not with a None deep inside."""
    spec = {k: v for k, v in spec_of(id="no-seed").items() if k != "seed"}
    out = tmp_path / "rank.json"
    proc = subprocess.run(
        [upstream_env["python"], str(REPO / "workflow_scripts/rank/run_trial.py"),
         "--spec-json", json.dumps(spec), "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["status"] == "failed", proc.stderr
    assert "'seed' is not a field of experiment no-seed" in result["error"]["message"]
