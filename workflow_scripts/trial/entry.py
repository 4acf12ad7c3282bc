"""The trial's entry point: the rule's command line, ``main`` and the progress line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .. import runtimes
from ..commands import Arg, Command
from ..experiment import Spec
from ..runtimes.measured import ENV_JSON, LIMIT_ARGS, with_limits
from ..spec.settings import NOISE_RETRIES as MAX_RETRIES
from ..spec.settings import NOISE_THRESHOLD
from ..util import finite, read_json
from .attempt import Trial
from .policy import RETRY_DELAY_S, Noise, run
from .reference import node_reference, read_reference


def yes(text: str) -> bool:
    if text.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if text.strip().lower() in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not true or false: {text!r}")


def progress_line(record: dict) -> str:
    head = f"[experiment] {record['experiment']} trial {record.get('trial', 0)}:"
    if record["status"] == "ok":
        m = record["metrics"]
        line = (
            f"{head} ok {m['samples_per_s']:.2f} samples/s "
            f"(step median {m['step_time_s']['median']:.3f} s, first step "
            f"{m['time_to_first_step_s']:.2f} s, peak RSS {m['peak_rss_mb']:.0f} MB"
        )
        p = record.get("probe") or {}
        if finite(p.get("fp32_gflops")):
            line += f", probe {p['fp32_gflops']:.0f} GFLOP/s fp32"
        if finite(m.get("pct_of_peak")):
            line += f", {m['pct_of_peak']:.0f}% of the {m.get('ceiling_dtype', '')} ceiling"
        line += ")"
        if m.get("measurement_error"):
            line += f" [measurement error: {m['measurement_error']}]"
        if m.get("stop_reason") == "precision":
            line += (
                f" [step time known within step_precision after {m.get('steps_timed')} of "
                f"{record['spec']['steps']} timed steps]"
            )
        far_from = record.get("far_from") or {}
        if m.get("stop_reason") == "far_from_baseline":
            line += (
                f" [beyond {far_from.get('factor')}x {far_from.get('baseline')}'s speed after "
                f"{m.get('steps_timed')} of {record['spec']['steps']} timed steps]"
            )
        if m.get("time_budget_hit"):
            line += (
                f" [time budget: {m.get('steps_timed')} of {record['spec']['steps']} timed steps]"
            )
        discarded = record.get("discarded_attempts") or []
        if discarded:
            line += f" [attempt {record.get('attempts')}: {len(discarded)} discarded as noisy]"
        check = record.get("noise_check") or {}
        if check.get("passed") is False:
            line += f" [still disturbed: {', '.join(check['caught_by'])}]"
        return line
    err = record.get("error") or {}
    return f"{head} {record['status']} {err.get('type', '')}: {err.get('message', '')}"[:400]


#: The run_experiment rule's entry point: each parameter once, with where the rule has
#: it. The noise settings come from the study settings, not from params: changing them
#: reruns no experiment.
COMMAND = Command(
    "Run one experiment trial; always write its record.",
    (
        Arg("spec_json", "params.spec", help="the resolved spec (JSON)"),
        ENV_JSON,
        Arg("out", "output.record", type=Path, help="the record to write"),
        Arg("log", "log", type=Path, help="the trial's log"),
        Arg("trial", "wildcards.trial", type=int, default=0),
        Arg("data_path", "params.data_path", default=None),
        Arg("first_trial", "input.first_trial", default="",
            help="a later trial: its experiment's first trial's record (what it carries)"),
        Arg("far_baseline", "input.far_baseline", default="",
            help="the first trial's record of the experiment it stops early against"),
        Arg("reference_probe", "input.reference_probe", default="",
            help="reference probe JSON; none: no reruns"),
        Arg("max_retries", "settings.noise_retries", type=int, default=MAX_RETRIES,
            help="noisy reruns at most"),
        Arg("noise_threshold", "settings.noise_threshold", type=float, default=NOISE_THRESHOLD),
        Arg("retry_delay", type=float, default=RETRY_DELAY_S, help="seconds"),
        Arg("attempt", "settings.job_attempt", type=int, default=1,
            help="the job's attempt (Snakemake's)"),
        Arg("warm_interpreter", "settings.warm_interpreter", type=yes, default=False,
            help="fork a one-process run from a warm interpreter (true/false)"),
        *LIMIT_ARGS,
    ),
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    spec = Spec(json.loads(args.spec_json))
    env_info = {**with_limits(read_json(args.env_json, want=None), args),
                "warm_interpreter": args.warm_interpreter}  # fmt: skip
    reference_path = Path(args.reference_probe) if args.reference_probe else None
    try:
        reference = node_reference(
            read_reference(reference_path, args.log), reference_path, env_info, args.log,
            int(spec.get("probe_size") or 0),
        )  # fmt: skip
        job = Trial(
            spec, env_info, args.out, args.log, args.trial, args.data_path,
            first_trial=Path(args.first_trial) if args.first_trial else None,
            far_baseline=Path(args.far_baseline) if args.far_baseline else None,
            attempt=args.attempt,
        )  # fmt: skip
        noise = Noise(reference, args.noise_threshold, args.max_retries, args.retry_delay)
        record = run(job, noise)
    except runtimes.Interrupted as exc:
        print(f"[experiment] {spec['id']} trial {args.trial}: {exc}; the run was stopped and "
              "no record written (a rerun repeats it)", file=sys.stderr, flush=True)  # fmt: skip
        return exc.exit_code
    print(progress_line(record), flush=True)
    return 0
