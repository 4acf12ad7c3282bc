"""One-off work once per configuration (workflow_scripts/trial/carry.py): what a later
trial takes from its first trial's record, and what it never takes (no torch; the real
trials: tests/test_gradcheck.py)."""

from __future__ import annotations

import json

from workflow_scripts.rank import gradcheck
from workflow_scripts.trial import carry

COMPARISON = {"negligible": ["bias_k"], "missing": [], "over_limit": [], "max_rel_error": 0.1}


def first(tmp_path, status="ok", ok=True, comparison=COMPARISON, flops=1e9, error=None):
    record = {
        "trial": 0,
        "status": status,
        "gradient_check": {"ok": ok, "comparison": comparison},
        "metrics": {"flops_per_sample": flops, "flops_error": error},
    }
    path = tmp_path / "trial0.json"
    path.write_text(json.dumps(record))
    return path


def test_a_later_trial_carries_the_comparison_and_the_flop_count(tmp_path):
    carried, record = carry.from_first_trial(first(tmp_path))
    assert carried == {"from": "trial 0", "negligible": ["bias_k"], "flops_per_sample": 1e9}
    later = {"gradient_check": {"ok": True, "comparison": None}, "spec": {"id": "x"}}
    carry.complete(later, carried, record)
    assert later["gradient_check"]["comparison"] == COMPARISON
    assert later["gradient_check"]["comparison_from"] == "trial 0"
    assert later["carried"] == carried


def test_nothing_is_carried_from_a_first_trial_that_did_not_pass(tmp_path):
    for bad in (
        {"status": "failed"},
        {"status": "incorrect", "ok": False},
        {"ok": False},  # (an ok status with a failed check: never carried)
    ):
        carried, _ = carry.from_first_trial(first(tmp_path, flops=None, **bad))
        assert carried is None, bad
    # a comparison that could not be made: the later trial compares for itself
    carried, _ = carry.from_first_trial(first(tmp_path, comparison={"error": "not kept"}))
    assert carried == {"from": "trial 0", "flops_per_sample": 1e9}
    carried, _ = carry.from_first_trial(first(tmp_path, comparison=None, flops=None))
    assert carried is None
    # a FLOP count that failed is counted again
    carried, _ = carry.from_first_trial(first(tmp_path, flops=None, error="TypeError"))
    assert "flops_per_sample" not in carried
    # no record, an unreadable one, or not a record at all
    assert carry.from_first_trial(None) == (None, None)
    assert carry.from_first_trial(tmp_path / "missing.json") == (None, None)
    (tmp_path / "bad.json").write_text("[1, 2")
    assert carry.from_first_trial(tmp_path / "bad.json") == (None, None)
    (tmp_path / "list.json").write_text("[1, 2]")
    assert carry.from_first_trial(tmp_path / "list.json") == (None, None)


def test_a_carried_check_still_judges_its_own_gradients():
    """The first trial's negligible parameters excuse their zero gradients; any other
    parameter without a gradient still makes the step incorrect."""
    got = {"parameters": 3, "zero_gradient": ["bias_k"], "without_gradient": []}
    assert gradcheck.problem(got, None, "bf16") is not None  # alone: a lost gradient
    assert gradcheck.problem(got, None, "bf16", ["bias_k"]) is None
    got["without_gradient"] = ["weight"]
    assert "trained 2 of 3" in gradcheck.problem(got, None, "bf16", ["bias_k"])


def test_a_dynamically_padded_first_trial_carries_no_flop_count(tmp_path):
    # its flops_per_sample is the count scaled to its batches' padded lengths: taken as
    # the count, a later trial would scale it again
    path = first(tmp_path)
    record = json.loads(path.read_text())
    record["spec"] = {"padding": "dynamic"}
    path.write_text(json.dumps(record))
    carried, _ = carry.from_first_trial(path)
    assert carried == {"from": "trial 0", "negligible": ["bias_k"]}


def test_a_first_trial_takes_the_flop_count_of_its_workload_from_another(tmp_path):
    """Trial 0 of one experiment counts its workload's FLOPs and leaves them; trial 0 of
    another experiment of the same workload (any precision, backend or batch) carries
    them; another input shape, model or environment counts for itself."""
    spec = {"id": "a", "env": "upstream", "model": "resnet50", "mode": "train",
            "image_size": 224, "seq_len": None, "batch_size": 16}  # fmt: skip
    out = tmp_path / "results" / "records" / "a" / "trial0.json"
    assert carry.shared_flops(out, spec) is None
    counted = {"status": "ok", "spec": spec,
               "metrics": {"flops_per_sample": 1.2e10, "flops_error": None,
                           "flops_count_s": 3.5}}  # fmt: skip
    carry.share_flops(out, spec, counted)
    assert carry.flops_path(out, spec).parent == tmp_path / "results" / "flops"
    other = {**spec, "id": "b", "precision": "bf16", "batch_size": 32, "backend": "ipex"}
    out_b = tmp_path / "results" / "records" / "b" / "trial0.json"
    assert carry.shared_flops(out_b, other) == {
        "from": "a trial 0 (the same workload)", "flops_per_sample": 1.2e10
    }  # fmt: skip
    for differs in ({"image_size": 128}, {"model": "resnet18"}, {"env": "ipex"},
                    {"mode": "inference"}):  # fmt: skip
        assert carry.shared_flops(out_b, {**other, **differs}) is None, differs
    # only a count made here is left: not a carried one, a failed one or a scaled one
    for record in (
        {**counted, "carried": {"from": "x"}},
        {**counted, "status": "failed"},
        {**counted, "spec": {**spec, "padding": "dynamic"}},
        {**counted, "metrics": {**counted["metrics"], "flops_error": "TypeError: x"}},
    ):
        spec_c = {**spec, "image_size": 64}
        carry.share_flops(out, spec_c, record)
        assert carry.shared_flops(out, spec_c) is None
    # a file that holds another workload's count (a hash collision, a hand edit): ignored
    path = carry.flops_path(out, {**spec, "image_size": 96})
    path.write_text(json.dumps({"workload": {"model": "x"}, "flops_per_sample": 5.0}))
    assert carry.shared_flops(out, {**spec, "image_size": 96}) is None


def test_only_an_incorrect_first_trial_stops_the_later_ones(tmp_path):
    """A first trial whose step was incorrect: the later trials would take the same step,
    so they run nothing and say why; one that failed, crashed, timed out or was lost
    leaves them to run (a fault need not happen again)."""
    path = first(tmp_path, status="incorrect", ok=False)
    record = json.loads(path.read_text())
    record["error"] = {"type": "IncorrectStep", "message": "the step trained 4 of 10 tensors"}
    path.write_text(json.dumps(record))
    why = carry.incorrect_first(path)
    assert why.startswith(
        "not run: its first trial's step was incorrect (the step trained 4 of 10 tensors), "
    )
    assert why.endswith("the figures that step ran at are trial 0's unchecked_metrics")
    for status in ("ok", "failed", "crashed", "timeout", "oom", "node_fail", "left_out"):
        assert carry.incorrect_first(first(tmp_path, status=status)) is None, status
    assert carry.incorrect_first(None) is None
    assert carry.incorrect_first(tmp_path / "missing.json") is None
