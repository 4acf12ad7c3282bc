"""The pre-flight of a study (setting ``preflight``; ``--config preset=preflight`` for the
default study): every experiment at its real model, shape, launcher, layout, backend
and precision, each running the fewest steps that still make a whole step, so that
what would fail at real size (memory, a compiled backward, a launcher at a layout,
an image) fails in minutes instead of after hours.

Each experiment keeps its id and everything but how long it runs: one warm-up and one
timed step (an epochs run: one epoch cut at :data:`EPOCH_STEPS` steps, then scored on
the held-out split), no time budget; one trial, no noisy reruns; the allreduce
microbenchmark with :data:`COLLECTIVE_ITERATIONS` calls per size. Its records, summary
and report go under :data:`RESULTS` (``results/preflight``), apart from the study's
own; the environments, images and calibrations are the study's. The whole study's
estimate then takes each experiment's measured pre-flight (its wall time, and its
step time for the steps the whole trial runs beyond it): :func:`matches` says whether a
pre-flight record is of that experiment as the study now has it.
"""

from __future__ import annotations

from typing import Any

from ..experiment import PREFLIGHT_KEY

#: where a pre-flight's records, summary and report go (the study's go to ``results``;
#: the logs of its trials to ``logs/preflight``)
SUBDIR = "preflight"
RESULTS = f"results/{SUBDIR}"
#: an epochs run's steps in a pre-flight (one warm-up step, then timed ones)
EPOCH_STEPS = 3
#: the allreduce microbenchmark's timed calls per size in a pre-flight
COLLECTIVE_ITERATIONS = 2
#: the fields a pre-flight changes (how long a trial runs, never what it runs)
SHORTENED = ("warmup_steps", "steps", "epochs", "max_steps", "time_budget_s", "preset", "preflight")


def shorten(spec: dict) -> dict:
    """The pre-flight of one resolved spec: the same experiment, the fewest steps."""
    out = dict(spec)
    out[PREFLIGHT_KEY] = True  # (the report says so)
    out["warmup_steps"] = 1
    out["time_budget_s"] = None
    if spec["epochs"]:
        out["epochs"] = 1
        out["max_steps"] = EPOCH_STEPS
    else:
        out["steps"] = 1
    return out


def settings(settings: dict) -> dict:
    """A pre-flight's settings: one trial, no noisy reruns, a short microbenchmark."""
    out = dict(settings)
    out["trials"] = 1
    out["max_trials"] = None
    out["noise_retries"] = 0
    collectives = dict(out["collectives"])
    collectives["iterations"] = min(collectives["iterations"], COLLECTIVE_ITERATIONS)
    out["collectives"] = collectives
    return out


def matches(spec: dict, preflight_spec: Any) -> bool:
    """Whether a pre-flight record's spec is this experiment's, but for how long it ran."""
    if not isinstance(preflight_spec, dict):
        return False
    keys = (set(spec) | set(preflight_spec)) - set(SHORTENED)
    return all(spec.get(k) == preflight_spec.get(k) for k in keys)


def results_root(settings: dict) -> str:
    """Where a study's records, summary and report go."""
    return RESULTS if settings.get("preflight") else "results"


def under(results, settings: dict):
    """A study's records, summary and report folder under a results folder (a Path)."""
    return results / SUBDIR if settings.get("preflight") else results


def logs_root(settings: dict) -> str:
    """Where the logs of its trials, collectives and report go."""
    return "logs/preflight" if settings.get("preflight") else "logs"
