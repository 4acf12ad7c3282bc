"""One experiment trial, from the rule to the record: run it, judge its noise, assemble and
write its record.

Runs on the host side, in the workflow's environment (the study loader's jsonschema and
yaml included), never inside a rank. Read it top to bottom: ``entry`` (the rule's
command line and ``main``) -> ``reference`` (the calibration it is judged against) ->
``policy`` (attempts until one is not disturbed) -> ``attempt`` (one run: the
launcher's commands in the runtime, with ``environment``) -> ``outcome`` (how it ended,
the record) and ``noise`` (the signals, against ``peers``: what such a probe
ordinarily reads here; the ceiling).

 A trial is the
command lines of its ranks (from its launcher, ``workflow_scripts/launchers``),
wrapped by its runtime (a local environment or a container image,
``workflow_scripts/runtimes``), run with the spec's time limit. Whatever happened
becomes one JSON record: the harness's result (merged over the ranks by the
launcher), or a ``crashed``/``timeout`` record with the tail of the output when the
process died without one.

Noise: a trial was disturbed when one of three signals says so (:func:`noise_check`):
its noise probe just before the steps, or the one just after them, was an outlier
below what its peers ordinarily read (the study's trials probed the same way, by at
least ``1 - noise_threshold``; before there are peers, below half the calibration's
rate: ``peers.py``), or other work took more than ``1 - noise_threshold``
of its threads' CPU time during the timed steps (``workflow_scripts.rank.contention``);
the probe after the steps alone does not, where the steps kept their pace. A
disturbed trial is run again after a pause, at most ``max_retries`` times. The
discarded attempts stay in the record (``discarded_attempts``, with the signal that
caught each), with ``attempts`` and the last check (``noise_check``); a last attempt
still disturbed keeps its result, flagged (``noise_check.caught_by``).

Ceiling: the calibration also measured the machine's dense matmul ceiling per dtype
and thread count; a trial's ``pct_of_peak`` is its achieved GFLOP/s over the ceiling
of its dtype and all its threads (:func:`with_ceiling`). A correct run cannot beat
it: a value above 100 is a measurement error, recorded as such and not as a number.

Compile caches: each attempt gets a fresh, empty TorchInductor/Triton cache in a
temporary folder, removed afterwards, so a compiled run always pays (and reports)
its full compile cost; ``warm_compile_cache: true`` keeps the default cache
instead. Which one was used: ``provenance.compile_cache``.

    python -m workflow_scripts.trial --spec-json '{...}' --env-json results/envs/upstream.json \\
        --out results/records/<id>/trial0.json --log logs/experiments/<id>/trial0.log [--trial 0] \\
        [--reference-probe results/calibration/upstream.json --max-retries 2 --noise-threshold 0.85]
"""

from __future__ import annotations

from .attempt import Trial, attempt_once, cannot_start
from .entry import COMMAND, main, progress_line
from .environment import compile_cache, default_inductor_cache_dir, run_mounts
from .noise import (
    OTHER_WORK,
    PROBE_AFTER,
    PROBE_BEFORE,
    noise_check,
    noise_reason,
    probe_signal,
    with_ceiling,
    work_signal,
)
from .outcome import assemble, failure, outcome
from .policy import RETRY_DELAY_S, Noise, run
from .reference import measured_on, node_reference, read_reference

__all__ = [
    "COMMAND", "Noise", "OTHER_WORK", "PROBE_AFTER", "PROBE_BEFORE", "RETRY_DELAY_S", "Trial",
    "assemble", "attempt_once",
    "cannot_start", "compile_cache", "default_inductor_cache_dir", "failure",
    "main", "measured_on", "node_reference",
    "noise_check", "noise_reason", "outcome", "probe_signal", "progress_line", "read_reference",
    "run", "run_mounts", "with_ceiling", "work_signal",
]  # fmt: skip
