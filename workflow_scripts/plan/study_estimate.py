"""The whole study's estimate on this machine: every trial's (:mod:`.estimate`) summed
by group and round, with the calibrations, collectives and report, and what the plan
knows of this machine (its calibrations, a quick measurement, the pre-flight's step
times)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..calibration import clean_calibration
from ..rank import gradcheck, references
from ..util import finite, read_json
from . import order, rounds
from .estimate import (
    COLLECTIVES_S,
    Machine,
    is_text,
    quick_fp32_gflops,
    reference_carries,
    report_s,
    trial,
)
from .far import baseline_of, same_work


@dataclasses.dataclass(frozen=True)
class Setup:
    """The jobs around the trials: a calibration per environment (``envs``) and
    ``collectives`` variants of the allreduce microbenchmark (the report's is fixed)."""

    envs: Iterable[str] = ()
    collectives: int = 0


@dataclasses.dataclass(frozen=True)
class Known:
    """What the study's records tell so far: ``done``, the (experiment, trial) pairs that
    have a record; ``far``, for each experiment whose first trial ran, its step time
    over its baseline's where it stopped far (plan/rounds.py: :func:`far_first`), 0 or
    False where it did not;
    ``failed``, the wall time of each experiment's last trial where it did not end ok
    (failed, out of memory, timed out, incorrect): its trials yet to run are predicted at
    that time, the same end again (an instruction set this CPU lacks, a model its
    compiler cannot take), not at a whole trial's."""

    done: Iterable[tuple[str, int]] = ()
    far: Mapping[str, float] = dataclasses.field(default_factory=dict)
    failed: Mapping[str, float] = dataclasses.field(default_factory=dict)


def reports(experiments: Sequence[Mapping], trials: int) -> int:
    """How many reports the minimum's trials run (each of the whole study's size, near
    enough): the question's stages' (plan/order.py), the rounds' before the minimum's
    last (rules/common.smk: one after each round but the last) and the study's own. The
    minimum's last round's report, which decides the first adaptive round, is in
    ``later_round_s`` with each adaptive round's."""
    return len(order.stages(experiments, trials)) + max(0, int(trials) - 1) + 1


def total(
    experiments: list[Mapping],
    trials: int,
    machine: Machine,
    setup: Setup = Setup(),
    known: Known = Known(),
    margin: float = 0.03,
) -> dict:
    """Every trial's estimate, summed per group and for the study, with the jobs around
    them (``setup``: calibrations, the collectives, and the report; environment and
    image builds are not included), less what is ``known`` done; ``margin``: the
    verdicts' (a far stop within it leaves the trials as they are). Of the trials left,
    ``remaining_repeats_s`` is what the ``known`` failures predict: measured, not
    estimated.
    Each experiment runs ``trials``, but a seed sweep's seeds share them
    (``rounds.first_trials``) and a run predicted slower than its baseline by its
    ``far_stop`` squared runs one trial that stops at its first timed steps
    (:func:`predicted_far`); the others may go on in the adaptive rounds
    (``later_round_s``: one more round of them)."""
    envs, done = list(setup.envs), set(known.done)
    groups: dict[str, dict] = {}
    per_experiment = {}
    trials_s = remaining = repeats = later_round_s = 0.0
    planned = adaptive = 0
    firsts = rounds.first_trials(experiments, trials)
    predicted = predicted_far(experiments, machine)
    # (a first trial that ran: how far it stopped, if it did, not the prediction)
    far_ones = {e: r for e, r in predicted.items() if e not in known.far}
    far_ones.update({e: r for e, r in known.far.items() if r})
    bf16 = {"seconds": 0.0, "experiments": 0, "ratios": []}
    made: set[str] = set()  # the gradient check's references made so far (their keys)
    for spec in experiments:
        ratio = far_ones.get(spec["id"])
        kinds = {k: references.key_name(spec, k) for k in gradcheck.reference_kinds(spec)}
        shared = [k for k, name in kinds.items() if name in made]
        made.update(kinds.values())
        first = trial(spec, machine, far=ratio, carries=reference_carries(shared))
        later = trial(spec, machine, later=True, far=ratio)["seconds"]
        again = known.failed.get(spec["id"])
        if finite(again) and again >= 0:
            later = float(again)
        last = bool(ratio) and rounds.settles_alone(ratio, spec.get("far_stop"))
        last = last and rounds.one_trial_when_far(spec, margin)
        n = 1 if last else firsts[str(spec["id"])]
        per_experiment[spec["id"]] = {**first, "later_seconds": later, "trials": n}
        if spec.get("precision") == "bf16":
            bf16["seconds"] += first["seconds"] + later * (n - 1)
            bf16["experiments"] += 1
            bf16["ratios"].append(machine.bf16_ratio(spec.get("env") or "upstream", is_text(spec)))
        if n >= trials:
            later_round_s += later
            adaptive += 1
        g = groups.setdefault(
            spec.get("group") or spec["id"],
            {"seconds": 0.0, "trials": 0, "left_s": 0.0, "left_trials": 0},
        )
        for k in range(n):
            seconds = first["seconds"] if k == 0 else later
            g["seconds"] += seconds
            g["trials"] += 1
            trials_s += seconds
            planned += 1
            if (spec["id"], k) not in done:
                remaining += seconds
                g["left_s"] += seconds
                g["left_trials"] += 1
                repeats += seconds if k and spec["id"] in known.failed else 0.0
    # each adaptive round adds a report: the one before it decides who runs it (the
    # minimum's last round's, then each round's but the last)
    if adaptive:
        later_round_s += report_s(len(experiments))
    setup = {
        "calibrations": sum(machine.calibration_s(e) for e in envs),
        "collectives": COLLECTIVES_S * setup.collectives,
        "report": report_s(len(experiments)) * reports(experiments, trials),
    }
    return {
        "trials_s": round(trials_s, 1),
        "setup_s": round(sum(setup.values()), 1),
        "total_s": round(trials_s + sum(setup.values()), 1),
        "remaining_trials_s": round(remaining, 1),
        "remaining_repeats_s": round(repeats, 1),
        "later_round_s": round(later_round_s, 1),
        "planned_trials": planned,
        "adaptive_experiments": adaptive,
        "far": sorted(e for e in far_ones if per_experiment[e]["trials"] == 1),
        "groups": {
            k: {**v, "seconds": round(v["seconds"], 1), "left_s": round(v["left_s"], 1)}
            for k, v in groups.items()
        },
        "setup": setup,
        "experiments": per_experiment,
        "basis": _basis(machine, envs, per_experiment),
        "bf16": {
            "seconds": round(bf16["seconds"], 1),
            "experiments": bf16["experiments"],
            "ratio": [min(bf16["ratios"]), max(bf16["ratios"])] if bf16["ratios"] else None,
            "native": machine.native,
        },
    }


def predicted_far(experiments: list[Mapping], machine: Machine) -> dict[str, float]:
    """The experiments whose predicted step time is beyond their ``far_stop`` of their
    baseline's (plan/far.py: the same work per step), with that ratio (their step
    time over the baseline's): their trials stop at their first timed steps, and where
    slower by the factor squared (``far_stop`` beyond the margin) their first trial is
    their last (plan/rounds.py)."""
    by_id = {s["id"]: s for s in experiments}
    step: dict[str, float] = {}  # each experiment's predicted step, once

    def step_of(spec: Mapping) -> float:
        if spec["id"] not in step:
            step[spec["id"]] = trial(spec, machine)["step_s"]
        return step[spec["id"]]

    out = {}
    for spec in experiments:
        base = by_id.get(baseline_of(spec, experiments))
        if base is None or not same_work(spec, base):
            continue
        ratio = step_of(spec) / step_of(base)
        factor = float(spec["far_stop"])
        if ratio > factor or ratio < 1 / factor:
            out[spec["id"]] = ratio
    return out


def _basis(machine: Machine, envs: Iterable[str], per_experiment: Mapping) -> list[str]:
    modelled = {e.get("basis") for e in per_experiment.values()} - {"pre-flight"}
    basis = []
    measured = sum(1 for e in per_experiment.values() if e.get("basis") == "pre-flight")
    if measured:
        basis.append(f"pre-flight measurements for {measured} of {len(per_experiment)} experiments")
    if modelled or not per_experiment:
        basis += sorted({machine.basis(e) for e in envs} or {machine.basis("upstream")})
    return basis


def read_calibrations(results: Path, envs: Iterable[str]) -> dict[str, dict | None]:
    out: dict[str, dict | None] = {}
    for env in envs:
        try:
            data = read_json(results / "calibration" / f"{env}.json")
            out[env] = clean_calibration(data)[0]
        except (OSError, ValueError):
            out[env] = None
    return out


def done_trials(results: Path, experiments: list[Mapping], trials: int) -> list[tuple[str, int]]:
    return [
        (spec["id"], k)
        for spec in experiments
        for k in range(trials)
        if (results / "records" / spec["id"] / f"trial{k}.json").exists()
    ]


def failed_walls(results: Path, experiments: list[Mapping], trials: int) -> dict[str, float]:
    """Each experiment whose last trial with a record (of its first ``trials``) did not end
    ok, and that trial's wall time without its noise reruns (``Known.failed``)."""
    out: dict[str, float] = {}
    for spec in experiments:
        for k in reversed(range(trials)):
            try:
                record = read_json(results / "records" / spec["id"] / f"trial{k}.json", want=None)
            except (OSError, ValueError):
                continue
            wall = failed_wall(record)
            if wall is not None:
                out[str(spec["id"])] = wall
            break
    return out


def failed_wall(record) -> float | None:
    """A record that did not end ok: its wall time without its noise reruns (0 for an
    incorrect one: its experiment's later trials run nothing, trial/carry.py); else
    None."""
    if not isinstance(record, dict) or record.get("status") in ("ok", None):
        return None
    if record.get("status") == "incorrect":
        return 0.0
    wall, retry = record.get("trial_wall_s"), record.get("retry_wall_s")
    if not finite(wall):
        return None
    return max(float(wall) - (float(retry) if finite(retry) else 0.0), 0.0)


def read_preflight(records: Path, experiments: Iterable[Mapping]) -> dict[str, dict]:
    """The pre-flight (records under ``records``) of each experiment that has an ok one of
    that experiment as it now is: its wall time, its steps (warm-up included), and its
    step time."""
    from . import preflight

    out: dict[str, dict] = {}
    for spec in experiments:
        try:
            record = read_json((records / spec["id"] / "trial0.json"), want=None)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("status") != "ok":
            continue
        if not preflight.matches(dict(spec), record.get("spec")):
            continue
        step = ((record.get("metrics") or {}).get("step_time_s") or {}).get("median")
        wall, steps = record.get("trial_wall_s"), len(record.get("losses") or [])
        if finite(step) and finite(wall) and steps:
            out[spec["id"]] = {"wall_s": float(wall), "step_s": float(step), "steps": steps}
    return out


def study_machine(study, results: Path | str = "results", measure: bool = True) -> Machine:
    """What the estimate knows of this machine for a loaded study: the calibrations
    under ``results``, a quick measurement for an environment without one (``measure``;
    else a rough rate per CPU), and (for a study that is not itself a pre-flight) the
    pre-flight of its experiments measured under ``results/preflight``."""
    from .. import sysinfo
    from . import preflight

    results = Path(results)
    calibrations = read_calibrations(results, list(study.envs))
    quick = None
    cpus = len(sysinfo.plan_cpus())
    if measure and not all(isinstance(c, dict) and c.get("ceiling") for c in calibrations.values()):
        quick = quick_fp32_gflops(cpus=cpus)
    measured = {}
    if not study.settings.get("preflight"):
        root = preflight.under(results, {"preflight": True}) / "records"
        measured = read_preflight(root, study.experiments)
    return Machine(
        calibrations,
        quick,
        cpus,
        sysinfo.topology().get("cpu_flags") or [],
        container=study.settings.get("runtime") != "local",
        preflight=measured,
        forks=forks(study.settings),
    )


def forks(settings) -> bool:
    """Whether a one-process trial of this study is forked from a warm interpreter: its
    runtime local (``auto`` as resolved), outside SLURM, unless ``warm_interpreter``
    is off (runtimes/warm.py)."""
    from .. import runtimes
    from ..runtimes import warm

    runtime = runtimes.resolved(settings.get("runtime") or "auto",
                                settings.get("container_engine_conf"))  # fmt: skip
    return warm.enabled(settings.get("warm_interpreter", False), runtime or "auto")


def for_study(
    study, results: Path | str = "results", measure: bool = True, machine: Machine | None = None
) -> dict:
    """The estimate of a loaded study (``study.Study``) on this machine, from the
    calibrations under ``results`` (a quick measurement for what has none), or from
    ``machine`` (one already measured: several estimates of one plan agree)."""
    from . import preflight

    results = Path(results)
    settings = study.settings
    machine = machine or study_machine(study, results, measure)
    trials = int(settings["trials"])
    variants = (settings.get("collectives") or {}).get("variants") or []
    here = preflight.under(results, settings)
    done = done_trials(here, study.experiments, trials)
    est = total(
        study.experiments,
        trials,
        machine,
        setup=Setup(list(study.envs), len(variants)),
        known=Known(done, failed=failed_walls(here, study.experiments, trials)),
        margin=float(settings.get("margin", 0.03)),
    )
    return with_rounds(est, trials, rounds.cap(settings))


def with_rounds(est: dict, trials: int, most: int) -> dict:
    """``est`` (of ``trials`` each) with what the adaptive rounds may add at most: every
    experiment at ``most`` (its trials cost the same each round)."""
    est.pop("adaptive", None)
    if most > trials:
        more = est.get("later_round_s", est["trials_s"] / trials) * (most - trials)
        est["adaptive"] = {"max_trials": most, "total_s": est["total_s"] + more}
    return est


def trial_seconds(study) -> dict[str, float]:
    """One trial's estimated seconds per experiment, for the run order (plan/order.py):
    the calibrations under results/ if there are any, else a rate per CPU (only the
    order matters there); empty where the estimate cannot be made (the order is then
    tiers and the order written)."""
    try:
        machine = study_machine(study, study.results, measure=False)
        return {s["id"]: trial(s, machine)["seconds"] for s in study.experiments}
    except Exception:  # noqa: BLE001 - the order is advice, never a failure
        return {}
