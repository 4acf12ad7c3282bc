"""A budget's plan made again once the calibrations and the first trials of its own
experiments have measured this machine.

Before any job runs, ``study/entry.py`` (``plan_budget``) fits a budget that does not
cover every experiment's minimum trials from what it knows then. On a fresh machine that
is a quick matmul and rough constants for a trial's process start and setup imports
(6 s and 5 s, where a calibration on a 2-vCPU EPYC then measured 1.5 s and 0.8 s): a
budget=1h run of the default study kept 45 experiments and ended after 43 minutes. So
where a calibration is missing, the plan keeps as its *reserve* the experiments beyond
it in the study's order that fit in :data:`RESERVE` budgets by that estimate (of the
environments the plan builds anyway; :attr:`Study.replan`, and :data:`REPLAN_VAR` for a
job's process), and the checkpoint ``budget_plan`` (rules/experiments.smk) plans again
once the calibrations and the first trial of each of the plan's own experiments have
run: the calibrated estimate scaled by how far it was off for those trials (each
group's own where its trials say, as the progress line scales it), the plan's
own trials yet to run, the collectives and the report kept aside, then the reserve in
the study's order while it fits in :data:`FILL` of the time left on the clock, none
after the first that does not. Its file (``results/budget/plan.json``) is what the final
report's records hold, what every progress line counts and what the report states as
left out.
"""

from __future__ import annotations

import copy
import math
import os
import time
from pathlib import Path

from ..plan import clock
from ..util import read_json
from .budget import leave_out, minimum_s, with_weights, within_budget

#: the reserve: the experiments beyond the plan that fit in this many budgets by the
#: estimate before the calibrations (on a fresh 2-vCPU Xeon that estimate said 15.3 h,
#: the calibrated one 4.1 h: 3.7x; on a 2-vCPU EPYC 1.45x)
RESERVE = 4.0
#: the share of the time left (less the collectives and the report) that the plan from
#: the calibrations fills, its estimates scaled by the first trials' measured/estimated:
#: that ratio is an average (the progress lines it scales were within 0.92-1.23x of the
#: time a budget=1h run then took); what still runs over, the clock leaves out
FILL = 0.9
#: the reserve (comma-separated ids) where the checkpoint plans again, for every job's process
REPLAN_VAR = "STUDY_BUDGET_RESERVE"
#: the plan's file, under the study's results
FILE = "budget/plan.json"


def path(results: Path | str) -> Path:
    return Path(results) / FILE


def needed(study, results: Path | str = "results") -> bool:
    """Whether a calibration the estimate would use is missing (the plan is then made
    from the constants, and made again from the calibrations)."""
    from ..plan import study_estimate

    found = study_estimate.read_calibrations(Path(results), list(study.envs))
    return not all(isinstance(c, dict) and c.get("ceiling") for c in found.values())


def reserve_of(study, per: dict, kept: list[str], left: list[str], room_s: float) -> list[str]:
    """Of ``left`` (what the plan before the calibrations left out), those that fit in
    :data:`RESERVE` times ``room_s`` with ``kept``, by the estimate ``per``, whose
    environment one of ``kept`` runs in (no build or calibration for them alone)."""
    wide, _ = within_budget(study, per, RESERVE * room_s)
    envs = {study.by_id[e]["env"] for e in kept}
    out = set(left)
    return [e for e in wide if e in out and study.by_id[e]["env"] in envs]


def first_trials(study, reserve: list[str], trials: int) -> dict[str, int]:
    """Each experiment's trials before any adaptive round (``rounds.first_trials``), the
    plan's own counted among themselves: a seed whose sweep's other seeds are in the
    reserve has the trials it would have without them (they may never run), a reserve's
    seed its share of the whole sweep."""
    from ..plan import rounds

    gone = set(reserve)
    own = rounds.first_trials([s for s in study.experiments if s["id"] not in gone], trials)
    return {**rounds.first_trials(study.experiments, trials), **own}


def _setup_left_s(study, est: dict) -> float:
    """What the study's jobs besides its trials still take: the collectives without a
    result, the report."""
    variants = (study.settings.get("collectives") or {}).get("variants") or []
    setup = est.get("setup") or {}
    where = study.path(study.results) / "collectives"
    done = sum((where / f"{v}.json").exists() for v in variants)
    per = float(setup.get("collectives") or 0.0) / len(variants) if variants else 0.0
    return per * (len(variants) - done) + float(setup.get("report") or 0.0)


def replan(study, must: list[str], reserve: list[str], results: Path | str = "results",
           now: float | None = None, until: float | None = None) -> dict:  # fmt: skip
    """The plan from the calibrations under ``results`` and the first trials of ``must``
    (the plan's own experiments: every one runs): the trials ``must`` has yet to run,
    then ``reserve``'s minimum trials in the study's order while they fit in :data:`FILL`
    of the time left to ``until`` (the clock's deadline), none after the first that does
    not, a served model only with the run that trains its weights; every estimate scaled
    by how far it was off for the trials with a record, its group's where they say (as
    the progress line scales the time left). The plan's file content: ``budget``,
    ``planned``, ``left_out`` (the study's and the reserve's), and ``replanned`` (what it
    kept, from what, and the estimates it filled the room by: ``admitted_s`` and the
    first left out's ``first_left_out_s``)."""
    from ..plan import order, preflight, progress, study_estimate

    results = Path(results)
    now = time.time() if now is None else now
    until = clock.deadline() if until is None else until
    machine = study_estimate.study_machine(study, results, measure=False)
    est = study_estimate.for_study(study, results, machine=machine)
    per = est["experiments"]
    speed = progress.speed(study, preflight.under(results, study.settings), per)
    own = copy.copy(study)  # (its seeds counted among themselves, as they run: first_trials)
    leave_out(own, reserve)
    groups = study_estimate.for_study(own, results, machine=machine)["groups"]
    own_left = sum(g["left_s"] * speed.of(name) for name, g in groups.items())
    time_left = (until - now) if until else math.inf
    room = FILL * (time_left - _setup_left_s(study, est)) - own_left
    seconds = {e: v["seconds"] for e, v in per.items()}
    admitted, used, reserved, first_out = [], 0.0, set(reserve), None
    group_of = progress.groups_of(study.experiments)
    for e in order.run_order(study.experiments, seconds):
        if e in reserved:
            cost = speed.of(group_of[e]) * minimum_s(per.get(e))
            if used + cost > room:
                first_out = cost
                break  # (none after the first that does not fit)
            admitted.append(e)
            used += cost
    kept = with_weights(study, {*must, *admitted})
    admitted = [e for e in admitted if e in set(kept)]
    dropped = [e for e in reserve if e not in set(kept)]
    gone = [{"id": e, "group": study.by_id[e].get("group") or e} for e in dropped]
    return {
        "budget": str(study.settings.get("budget")),
        "planned": len(study.experiments) + len(study.left_out),
        "left_out": [*study.left_out, *gone],
        "replanned": {
            "from": "the calibrations and the first trials of the plan's own",
            "time_left_s": round(time_left, 1) if math.isfinite(time_left) else None,
            "own_left_s": round(own_left, 1),
            "room_s": round(room, 1) if math.isfinite(room) else None,
            # what the reserve it admitted takes, and the first it left out
            "admitted_s": round(used, 1),
            "first_left_out_s": None if first_out is None else round(first_out, 1),
            "ratio": round(speed.run, 3),
            "group_ratios": {g: round(r, 3) for g, r in sorted(speed.groups.items())},
            "measured_trials": speed.trials,
            "before": len(must),
            "kept": len(kept),
            "admitted": admitted,
        },
    }


def reserve_ids(study) -> list[str]:
    """The study's reserve (:attr:`Study.replan`), of its experiments; [] without one."""
    return [e for e in (study.replan or {}).get("reserve") or [] if e in study.by_id]


def from_environment(study) -> None:
    """A job's process: the reserve the main process planned (:data:`REPLAN_VAR`), the
    rest of the study the plan's own (a job Snakemake spawns reads the workflow again:
    the same DAG)."""
    reserve = [e for e in os.environ.get(REPLAN_VAR, "").split(",") if e in study.by_id]
    if reserve:
        study.replan = {"must": [e for e in study.ids if e not in set(reserve)],
                        "reserve": reserve}  # fmt: skip


def admitted(plan_file: Path | str) -> list[str]:
    """The reserve the plan in ``plan_file`` runs, in the order it runs them."""
    plan = read_json(plan_file, want=dict)
    return [str(e) for e in (plan.get("replanned") or {}).get("admitted") or []]


def applied(study):
    """``study`` as this run plans it where its budget's plan is made again (its
    reserve): without the reserve until that plan is there, then
    without what it left out (a copy); else ``study``."""
    reserve = reserve_ids(study)
    if not reserve:
        return study
    where = path(study.path(study.results))
    try:
        runs = set(admitted(where)) if where.exists() else set()
    except (OSError, ValueError):  # (a progress line never fails a trial)
        runs = set()
    out = copy.copy(study)
    leave_out(out, [e for e in reserve if e not in runs])
    return out


def pending_s(study, results: Path | str = "results") -> float:
    """The estimate of the budget's reserve (:attr:`Study.replan`) while its plan is not
    made yet (the minimum trials of each, this machine's calibrations), for the progress
    line's time left; 0 otherwise."""
    from ..plan import study_estimate

    reserve = reserve_ids(study)
    if not reserve or path(study.path(study.results)).exists():
        return 0.0
    try:
        machine = study_estimate.study_machine(study, results, measure=False)
        per = study_estimate.for_study(study, results, machine=machine)["experiments"]
    except Exception:  # noqa: BLE001 - the progress line is advice: never a failed trial
        return 0.0
    return sum(minimum_s(per.get(e)) for e in reserve)


def text(plan: dict) -> str:
    """The plan's line for the log and Snakemake's output."""
    r = plan["replanned"]
    left = r["time_left_s"]
    n = len(plan["left_out"])
    return (f"[budget] planned again from the calibrations"
            f"{f', {left / 60:.0f} min left' if left is not None else ''}: it runs "
            f"{r['kept']} experiments ({len(r['admitted'])} more than before them) and "
            f"leaves out {n} of the study's {plan['planned']}")  # fmt: skip


def write(study, choice: dict, out: Path | str, log: Path | str) -> dict:
    """The checkpoint's work: the plan from the calibrations (``choice``: the must-runs
    and the reserve, :attr:`Study.replan`), written to ``out``, its line said."""
    from ..commands import announce
    from ..util import write_json_atomic

    plan = replan(study, list(choice.get("must") or []), list(choice.get("reserve") or []))
    write_json_atomic(Path(out), plan)
    announce(text(plan), Path(log))
    return plan
