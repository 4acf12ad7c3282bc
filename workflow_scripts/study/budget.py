"""What a budget keeps of a study: the experiments whose minimum trials fit in the time
it has, in the study's order (the question first), and the study without the others
(study/entry.py plans it before any job, study/replan.py again after the calibrations)."""

from __future__ import annotations

from .config import Study


def leave_out(study: Study, ids: list[str]) -> None:
    """The study without the experiments ``ids``, which it keeps in ``left_out`` (a new
    list: a copy of the study may share the old one)."""
    gone = set(ids)
    dropped = [s for s in study.experiments if s["id"] in gone]
    study.left_out = [*study.left_out, *({"id": s["id"], "group": s.get("group") or s["id"]}
                                         for s in dropped)]  # fmt: skip
    study.experiments = [s for s in study.experiments if s["id"] not in gone]
    study.__post_init__()


def minimum_s(per_experiment: dict) -> float:
    """An experiment's minimum trials by the estimate (``study_estimate.total``'s entry)."""
    v = per_experiment or {}
    return v.get("seconds", 0.0) + v.get("later_seconds", 0.0) * (v.get("trials", 1) - 1)


def with_weights(study: Study, keep: set[str]) -> list[str]:
    """``keep`` in the study's order, without a served model whose weights come from a
    run not kept (it needs the run that trains them)."""
    for spec in study.experiments:
        if spec["id"] in keep and spec.get("weights_from") and spec["weights_from"] not in keep:
            keep.discard(spec["id"])
    return [e for e in study.ids if e in keep]


def within_budget(study: Study, per: dict, room_s: float) -> tuple[list[str], list[str]]:
    """The experiments whose minimum trials fit in ``room_s`` seconds, in the order the
    study runs them (the question first: plan/order.py) and never fewer than the
    question, and those left out: the rest of the order from the first that does not
    fit, and any whose served weights come from one left out."""
    from ..plan import order

    seconds = {e: v["seconds"] for e, v in per.items()}
    question = set(order.question(study.experiments))
    kept, used = [], 0.0
    for e in order.run_order(study.experiments, seconds):
        cost = minimum_s(per.get(e))
        if e not in question and used + cost > room_s:
            break
        kept.append(e)
        used += cost
    keep = with_weights(study, set(kept))
    return keep, [e for e in study.ids if e not in set(keep)]
