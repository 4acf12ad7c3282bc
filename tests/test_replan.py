"""A budget's plan made again from the calibrations and the first trials of its own
experiments (workflow_scripts/study/replan.py): its own experiments always, then its
reserve in the study's order while the estimate, scaled as far as those trials found it
off, fits in the time left, none after the first that does not; what the final report
and the jobs' progress read from its file. (The real run: tests/test_workflow.py.)"""

from __future__ import annotations

import copy
import json

import pytest

from tests.runs import BUDGET_PART
from workflow_scripts.plan import clock, order, study_estimate
from workflow_scripts.study import load_study, replan
from workflow_scripts.study.budget import leave_out

MUST = ["base", "bf16", "o-base"]  # the question of BUDGET_PART
RESERVE = ["o-bf16", "o-batch-bs4", "o-batch-bs16"]


@pytest.fixture
def study(tmp_path):
    config = {**copy.deepcopy(BUDGET_PART), "runtime": "local", "budget": "10min",
              "collectives": {"variants": []}}  # fmt: skip
    return load_study(config, tmp_path)


def costs(study, results):
    """Each experiment's minimum trials by the estimate the plan goes by, the setup left,
    and the reserve in the order it is admitted."""
    machine = study_estimate.study_machine(study, results, measure=False)
    est = study_estimate.for_study(study, results, machine=machine)
    per = {e: v["seconds"] + v["later_seconds"] * (v["trials"] - 1)
           for e, v in est["experiments"].items()}  # fmt: skip
    seconds = {e: v["seconds"] for e, v in est["experiments"].items()}
    ordered = [e for e in order.run_order(study.experiments, seconds) if e in RESERVE]
    return per, est["setup"]["report"], ordered


def time_left_for(study, results, admitted: list[str], per, report_s) -> float:
    """The time left at which the plan's room holds the must-runs and ``admitted``, and
    half the next one's cost more."""
    need = sum(per[e] for e in MUST + admitted)
    rest = [e for e in RESERVE if e not in admitted]
    spare = 0.5 * min(per[e] for e in rest) if rest else 1.0
    return (need + spare) / replan.FILL + report_s


def test_the_reserve_runs_in_the_studys_order_while_it_fits_and_none_after(study, tmp_path):
    per, report_s, ordered = costs(study, tmp_path)
    for k in range(len(ordered) + 1):
        left = time_left_for(study, tmp_path, ordered[:k], per, report_s)
        plan = replan.replan(study, MUST, RESERVE, tmp_path, now=1000.0, until=1000.0 + left)
        r = plan["replanned"]
        assert r["admitted"] == ordered[:k], (k, r)
        assert r["admitted_s"] == pytest.approx(sum(per[e] for e in ordered[:k]), abs=0.1)
        nxt = None if k == len(ordered) else pytest.approx(per[ordered[k]], abs=0.1)
        assert r["first_left_out_s"] == nxt, (k, r)
        assert r["before"] == 3 and r["kept"] == 3 + k
        assert [e["id"] for e in plan["left_out"]] == [e for e in RESERVE if e not in ordered[:k]]
        assert plan["planned"] == 6 and plan["budget"] == "10min"
        assert r["time_left_s"] == pytest.approx(left, abs=0.1)


def test_the_plans_own_experiments_run_whatever_is_left_and_no_deadline_leaves_none_out(
    study, tmp_path, monkeypatch
):
    plan = replan.replan(study, MUST, RESERVE, tmp_path, now=1000.0, until=1000.0)
    assert plan["replanned"]["kept"] == 3 and plan["replanned"]["admitted"] == []
    assert sorted(e["id"] for e in plan["left_out"]) == sorted(RESERVE)
    monkeypatch.delenv(clock.DEADLINE_VAR, raising=False)
    plan = replan.replan(study, MUST, RESERVE, tmp_path)  # no clock: nothing to fit in
    assert plan["replanned"]["kept"] == 6 and plan["left_out"] == []
    assert plan["replanned"]["time_left_s"] is None


def test_what_the_budget_left_out_before_stays_out_and_is_stated(study, tmp_path):
    """An experiment the plan before the calibrations left out for good (not in the
    reserve) is in the plan's left_out whatever the time left, with its group."""
    leave_out(study, ["o-batch-bs16"])
    plan = replan.replan(study, MUST, RESERVE[:2], tmp_path, now=0.0, until=1e9)
    assert sorted(plan["replanned"]["admitted"]) == ["o-batch-bs4", "o-bf16"]
    assert plan["left_out"] == [{"id": "o-batch-bs16", "group": "other"}]
    assert plan["planned"] == 6


def test_first_trials_slower_than_their_estimate_leave_less_room(study, tmp_path):
    """The must-runs' first trials took twice their estimate: the rest is planned at
    twice its estimate, so the time that held the whole reserve at its estimate holds
    less of it now."""
    per, report_s, ordered = costs(study, tmp_path)
    left = time_left_for(study, tmp_path, ordered, per, report_s)
    assert replan.replan(study, MUST, RESERVE, tmp_path, 0.0, left)["replanned"]["admitted"] == (
        ordered
    )
    machine = study_estimate.study_machine(study, tmp_path, measure=False)
    first = study_estimate.for_study(study, tmp_path, machine=machine)["experiments"]
    for e in MUST:
        record = tmp_path / "results/records" / e / "trial0.json"
        record.parent.mkdir(parents=True)
        wall = 2.0 * first[e]["seconds"]
        record.write_text(json.dumps({"status": "ok", "trial_wall_s": wall, "metrics": {}}))
    plan = replan.replan(study, MUST, RESERVE, tmp_path / "results", 0.0, left)
    r = plan["replanned"]
    assert r["ratio"] == pytest.approx(2.0, rel=1e-3) and r["measured_trials"] == 3
    assert len(r["admitted"]) < len(ordered) and r["admitted"] == ordered[: len(r["admitted"])]


def test_the_reserve_is_costed_at_its_groups_ratio_where_its_trials_say(study, tmp_path):
    """The ladder's first trials took twice their estimate, the other group's one its
    estimate: the other group's reserve is planned at that group's ratio (drawn towards
    the run's as one more of its trials), not the run's, and the plan's own trials left
    each at their group's; so a time left that holds the reserve that way admits it all,
    where at the run's ratio it would not."""
    results = tmp_path / "results"
    machine = study_estimate.study_machine(study, results, measure=False)
    est = study_estimate.for_study(study, results, machine=machine)["experiments"]
    ratios = {"base": 2.0, "bf16": 2.0, "o-base": 1.0}
    for e, r in ratios.items():
        record = results / "records" / e / "trial0.json"
        record.parent.mkdir(parents=True)
        wall = r * est[e]["seconds"]
        record.write_text(json.dumps({"status": "ok", "trial_wall_s": wall, "metrics": {}}))
    first = {e: est[e]["seconds"] for e in ratios}
    run = sum(ratios[e] * first[e] for e in ratios) / sum(first.values())
    ladder = (
        4.0 * (first["base"] + first["bf16"]) / 2 + (first["base"] + first["bf16"]) / 2 * run
    ) / (1.5 * (first["base"] + first["bf16"]))
    other = (first["o-base"] + first["o-base"] * run) / (2 * first["o-base"])
    assert other < run < ladder
    later = {e: est[e]["later_seconds"] for e in est}
    own_left = (later["base"] + later["bf16"]) * ladder + later["o-base"] * other
    reserve = sum(est[e]["seconds"] + later[e] for e in RESERVE)
    report_s = study_estimate.for_study(study, results, machine=machine)["setup"]["report"]
    left = (own_left + other * reserve * 1.01) / replan.FILL + report_s
    assert (own_left + run * reserve) / replan.FILL + report_s > left  # (not at the run's)
    r = replan.replan(study, MUST, RESERVE, results, 0.0, left)["replanned"]
    assert r["ratio"] == pytest.approx(run, abs=1e-3)
    assert r["group_ratios"] == {"ladder": pytest.approx(ladder, abs=1e-3),
                                 "other": pytest.approx(other, abs=1e-3)}  # fmt: skip
    assert r["own_left_s"] == pytest.approx(own_left, abs=0.1)
    assert sorted(r["admitted"]) == sorted(RESERVE)


def test_the_plans_file_is_what_the_final_report_and_every_jobs_progress_go_by(
    study, tmp_path, monkeypatch
):
    where = replan.path(tmp_path / "results")
    assert replan.applied(study) is study  # not planned again in this run: as it is
    study.replan = {"must": MUST, "reserve": RESERVE}
    before = replan.applied(study)  # before the plan: the plan's own alone
    assert before.ids == MUST and study.ids == MUST + RESERVE  # (a copy)
    plan = replan.replan(study, MUST, RESERVE, tmp_path, now=0.0, until=1e9)
    where.parent.mkdir(parents=True)
    where.write_text(json.dumps({**plan, "replanned": {**plan["replanned"],
                                                       "admitted": ["o-bf16"]}}))  # fmt: skip
    assert replan.admitted(where) == ["o-bf16"]
    after = replan.applied(study)
    assert after.ids == [*MUST, "o-bf16"]
    assert [e["id"] for e in after.left_out] == ["o-batch-bs4", "o-batch-bs16"]
    assert replan.text(plan).startswith("[budget] planned again from the calibrations")


def test_a_study_without_its_calibrations_is_planned_again(study, tmp_path):
    assert replan.needed(study, tmp_path / "results")
    cal = tmp_path / "results/calibration/upstream.json"
    cal.parent.mkdir(parents=True)
    cal.write_text(json.dumps({"kind": "calibration", "ceiling": [{"threads": 1}]}))
    assert not replan.needed(study, tmp_path / "results")


def test_a_job_snakemake_spawns_plans_the_same_reserve(tmp_path, monkeypatch):
    """A job that Snakemake runs in a process of its own reads the workflow again: its
    study has the main process's reserve (from the environment), so its DAG, the final
    report's records among it, is the same."""
    from workflow_scripts.study import entry

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(entry.PLANNED_FOR_VAR, entry.planned_for(None))  # a job's process
    monkeypatch.setenv(entry.LEFT_OUT_VAR, "o-batch-bs16")
    monkeypatch.setenv(replan.REPLAN_VAR, "o-bf16,o-batch-bs4")
    config = {**copy.deepcopy(BUDGET_PART), "runtime": "local", "budget": "10min",
              "collectives": {"variants": []}}  # fmt: skip
    job = entry.load_for_snakemake(config, {}, runs=True)
    assert job.replan == {"must": MUST, "reserve": ["o-bf16", "o-batch-bs4"]}
    assert [e["id"] for e in job.left_out] == ["o-batch-bs16"]
    monkeypatch.delenv(replan.REPLAN_VAR)
    assert entry.load_for_snakemake(config, {}, runs=True).replan is None


def test_a_seed_whose_sweep_is_in_the_reserve_keeps_its_own_replicates(tmp_path):
    """A seed sweep's seeds share the minimum's trials (they are its replicates); where
    the budget keeps one seed and reserves the others (which may never run), the kept
    seed runs the trials it would run alone, a reserved seed its share of the sweep."""
    groups = {"g": {"runs": [{"id": "base"}]},
              "acc": {"runs": [{"name": "acc", "seed": [0, 1, 2]}]}}  # fmt: skip
    config = {"runtime": "local", "trials": 2, "groups": groups}
    study = load_study(config, tmp_path)
    reserve = ["acc-seed1", "acc-seed2"]
    assert replan.first_trials(study, reserve, 2) == {
        "base": 2, "acc-seed0": 2, "acc-seed1": 1, "acc-seed2": 1}  # fmt: skip
    assert replan.first_trials(study, [], 2) == {
        "base": 2, "acc-seed0": 1, "acc-seed1": 1, "acc-seed2": 1}  # fmt: skip
