"""The order the study runs its trials in: the question first.

Within a round (trial k of every experiment before trial k+1 of any), the experiments
run in four tiers:

0. the headline's: the study's first group (the optimization ladder on the main model,
   where the study's baseline is), in the order written;
1. each other group's first run, in the order of the groups: the baseline every
   comparison of that family is made against (the transformer ladder's fp32 eager run,
   inference's first row, DDP's first layout, ...);
2. the runs that do the same work per step as their group's first (its ladder: the
   transformer ladder's rungs, inference's other stacks at the same batch, DDP's other
   process groups; not an epochs run's seeds), cheapest first (the estimate of one
   trial), so that every minute of measurement adds as many comparisons to the answer
   as it can;
3. the rest (sweeps, seeds, other shapes), cheapest first.

The order written breaks ties.

As soon as the first round's tier 0 has run, the study writes a provisional report of
it (``results/rounds/first/``: the headline's comparisons, one trial each); then tier 0
runs its second trials, before any other experiment's first (the rest of the study is
trial k of every experiment before trial k+1 of any), and the study writes
``results/rounds/headline/``: the headline's comparisons with their intervals; and again
after tiers 1-2 (``results/rounds/families/``: every family's baseline and ladder
besides), before the rest of the study (:func:`stages`). Priorities change no job's
inputs: the order never reruns anything, and a stopped study resumes in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from . import far

HEADLINE, BASELINES, LADDERS, REST = 0, 1, 2, 3


def tiers(experiments: Sequence[Mapping]) -> dict[str, int]:
    """Each experiment's tier (the module docstring)."""
    first_group = experiments[0].get("group") if experiments else None
    firsts: dict = {}
    out = {}
    for spec in experiments:
        group = spec.get("group")
        first = firsts.setdefault(group, spec)
        if group == first_group:
            out[spec["id"]] = HEADLINE
        elif first is spec:
            out[spec["id"]] = BASELINES
        elif not first.get("epochs") and far.same_work(first, spec):
            out[spec["id"]] = LADDERS
        else:
            out[spec["id"]] = REST
    return out


def run_order(experiments: Sequence[Mapping], seconds: Mapping[str, float]) -> list[str]:
    """The experiments' ids in the order they run within a round: by tier, the first two
    in the order written, the others by ``seconds`` (a trial's estimate; unknown: last)."""
    tier = tiers(experiments)
    written = {spec["id"]: i for i, spec in enumerate(experiments)}

    def key(spec: Mapping) -> tuple:
        i = spec["id"]
        cost = seconds.get(i) if tier[i] >= LADDERS else 0.0
        return (tier[i], cost if cost is not None else float("inf"), written[i])

    return [spec["id"] for spec in sorted(experiments, key=key)]


def question(experiments: Sequence[Mapping]) -> list[str]:
    """The experiments of tiers 0 and 1 (the headline's group and every other group's
    first run: what a budget never leaves out), as written."""
    tier = tiers(experiments)
    return [spec["id"] for spec in experiments if tier[spec["id"]] < LADDERS]


#: the provisional reports of the first round, by stage: the tiers each one waits for,
#: and how many trials of the headline's group (its second ones, where it runs two, run
#: right after its first: the headline's intervals early)
STAGES = {"first": (HEADLINE, 1), "headline": (HEADLINE, 2), "families": (LADDERS, 2)}
#: how a provisional report's title begins (a stage's, or a round's: rules/common.smk);
#: the report reads it so (report/html.py: what has not run may run yet)
PROVISIONAL = "Provisional report"
#: what each stage's report holds, for its title
STAGE_WORDS = {
    "first": "the first trial of the headline's group",
    "headline": "the first two trials of the headline's group",
    "families": "the first trials of every group's baseline and ladder",
}


def stages(experiments: Sequence[Mapping], trials: int = 1) -> dict[str, list[str]]:
    """The first round's provisional reports (``results/rounds/<stage>/``): each stage's
    experiments (tiers up to :data:`STAGES`'), as written, where every experiment runs
    ``trials`` (the headline's second trials come early only where that is 2 or more); a
    stage that holds the whole study, or no more than the stage before it, is left out
    (the report, or that stage's, says it)."""
    tier = tiers(experiments)
    out: dict[str, list[str]] = {}
    last = (0, 0)
    for name, (top, _) in STAGES.items():
        ids = [spec["id"] for spec in experiments if tier[spec["id"]] <= top]
        held = (len(ids), headline_trials(name, trials))
        if last < held and len(ids) < len(experiments):
            out[name] = ids
            last = held
    return out


def headline_trials(stage: str, trials: int) -> int:
    """How many trials of the headline's group stage ``stage``'s report holds."""
    return min(STAGES[stage][1], max(1, int(trials)))
