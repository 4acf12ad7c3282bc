"""The trial's entry point: the rule's command line, ``main`` and the progress line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import runtimes
from ..runtimes.measured import add_limit_args, limit_argv, with_limits
from ..study.settings import NOISE_RETRIES as MAX_RETRIES
from ..study.settings import NOISE_THRESHOLD
from ..util import finite
from .policy import RETRY_DELAY_S, run
from .reference import node_reference, read_reference


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


def rule_argv(inputs, output, params, wildcards, log, settings: dict) -> list[str]:
    """The run_experiment rule's command line (workflow_scripts.jobs), from Snakemake's
    objects. The noise settings come from the study settings, not from params: changing
    them reruns no experiment."""
    env_json = inputs.get("image") or inputs.get("env")
    return [f"--spec-json={params.spec}", f"--env-json={env_json}", f"--out={output.record}",
         f"--log={log[0]}", f"--trial={wildcards.trial}", f"--data-path={params.data_path}",
         f"--reference-probe={inputs.get('reference_probe', '')}",
         f"--max-retries={settings['noise_retries']}",
         f"--noise-threshold={settings['noise_threshold']}",
         f"--attempt={settings.get('job_attempt', 1)}",
         *limit_argv(settings["containers"])]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one experiment trial; always write its record.")
    ap.add_argument("--spec-json", required=True)
    ap.add_argument("--env-json", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--log", required=True, type=Path)
    ap.add_argument("--trial", type=int, default=0)
    ap.add_argument("--data-path", default=None)
    ap.add_argument("--reference-probe", default="", help="reference probe JSON; none: no reruns")
    ap.add_argument("--max-retries", type=int, default=MAX_RETRIES, help="noisy reruns at most")
    ap.add_argument("--noise-threshold", type=float, default=NOISE_THRESHOLD)
    ap.add_argument("--retry-delay", type=float, default=RETRY_DELAY_S, help="seconds")
    ap.add_argument("--attempt", type=int, default=1, help="the job's attempt (Snakemake's)")
    add_limit_args(ap)
    args = ap.parse_args(argv)
    spec = json.loads(args.spec_json)
    env_info = with_limits(json.loads(args.env_json.read_text()), args)
    reference_path = Path(args.reference_probe) if args.reference_probe else None
    try:
        reference = node_reference(
            read_reference(reference_path, args.log), reference_path, env_info, args.log,
            int(spec.get("probe_size") or 0),
        )  # fmt: skip
        record = run(
            spec, env_info, args.out, args.log, args.trial, args.data_path,
            reference=reference, noise_threshold=args.noise_threshold,
            max_retries=args.max_retries, retry_delay_s=args.retry_delay, attempt=args.attempt,
        )  # fmt: skip
    except runtimes.Interrupted as exc:
        print(f"[experiment] {spec['id']} trial {args.trial}: {exc}; the run was stopped and "
              "no record written (a rerun repeats it)", file=sys.stderr, flush=True)  # fmt: skip
        return exc.exit_code
    print(progress_line(record), flush=True)
    return 0
