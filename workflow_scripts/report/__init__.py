"""Build ``summary.csv``, the plots and a self-contained HTML report from trial records.

Usage::

    python -m workflow_scripts.report --records R1.json R2.json ... \\
        --summary results/summary.csv --html results/report/index.html \\
        --plots-dir results/report [--prices-json '[{"name": ..., "usd_per_hour": ...}]'] \\
        [--noise-threshold 0.85] [--title T]

Per experiment, throughput is the median of ``samples_per_s`` over its ok trials
that were not marked noisy (see ``records.mark_noisy``; when every ok trial was
noisy, over all of them, flagged), with the spread min-max and the coefficient of
variation when there are several. Speedups are relative to
the ladder's baseline: the experiment ``baseline`` if present, else the first
experiment of group ``ladder`` in record order. The plot files in ``--plots-dir``
have fixed names (:data:`PLOT_NAMES`) and are always written: a group without
data gets a figure that says "no successful trials in this group".
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workflow_scripts.commands import Arg, Command, announce
from workflow_scripts.summary.records import DEFAULT_NOISE_THRESHOLD, load_records, summary_frame

from .compare import backend_matrix, compiled_pairs, previous_steps
from .comparisons import comparisons_section, stated_comparisons
from .distributed import distributed_section
from .families import (
    families_section,
    family_lines,
    family_picks,
    inference_lines,
    inference_picks,
    inference_section,
)
from .figures import plot_all
from .headline import Findings, headline_html, headline_pairs, left_out_by_plan
from .html import Page, page_html
from .machines import Machine, load_machine, machines_section, parse_machines, result_files
from .quality import correctness_section, startup_section
from .sections import (
    backends_section,
    ceiling_section,
    cost_section,
    failures_section,
    ladder_section,
    noise_section,
    other_section,
    provenance_html,
    summary_section,
    sweep_sections,
)
from .stats import (
    baseline_sps,
    ceiling_frame,
    cost_frame,
    enrich,
    experiment_stats,
    in_effect,
    incorrect,
    isnan,
    ladder_frame,
    left_out,
    loss_curves,
    parse_prices,
    pick_baseline,
    trial_counts,
    with_group_speedup,
    with_speedup,
)
from .timing import timing_section
from .uncertainty import MARGIN, comparisons_frame
from .values import spreadsheet_safe

__all__ = ["DEFAULT_TITLE", "Options", "Outputs", "build_report", "main"]

DEFAULT_TITLE = "Training AI models on CPU: benchmark report"


@dataclasses.dataclass(frozen=True)
class Outputs:
    """Where a report goes: the summary CSV, the HTML page, the plots' folder and the
    comparisons CSV (default: ``comparisons.csv`` beside the summary)."""

    summary: Path
    html: Path
    plots_dir: Path
    comparisons: Path | None = None


@dataclasses.dataclass(frozen=True)
class Options:
    """What a report states besides the records. ``collectives``: the collectives
    microbenchmark's results; ``machines``: other result sets to compare with this one
    (see :func:`machines.parse_machines`); ``name``: this run's name among them (default:
    its CPU), priced at the first ``measured`` price; ``margin``: within it, two
    throughputs are the same (the verdicts, :mod:`uncertainty`); ``looks``: how many
    rounds' reports may decide a comparison, ``look``: which of them this report is
    (default: the last; :func:`plan.rounds.spent`); ``plan``: what a budget's plan left
    out (:func:`headline.left_out_by_plan`)."""

    prices: Any = None
    title: str = DEFAULT_TITLE
    noise_threshold: float = DEFAULT_NOISE_THRESHOLD
    collectives: Sequence[Mapping] = ()
    machines: Any = None
    name: str | None = None
    margin: float = MARGIN
    looks: int = 1
    look: int | None = None
    plan: Mapping | None = None


def build_report(
    records: Sequence[Mapping], outputs: Outputs, options: Options = Options()
) -> dict:
    """Write the summary CSV, the plots (:data:`PLOT_NAMES`, the collectives', and the
    extra ones: losses, startup, machines), the comparisons CSV and the HTML page;
    return counts."""
    summary_path, html_path = Path(outputs.summary), Path(outputs.html)
    plots_dir = Path(outputs.plots_dir)
    comparisons_path = Path(outputs.comparisons or summary_path.with_name("comparisons.csv"))
    noise_threshold, margin = options.noise_threshold, options.margin
    for folder in (summary_path.parent, html_path.parent, plots_dir):
        folder.mkdir(parents=True, exist_ok=True)
    records = list(records)
    frame = summary_frame(records, noise_threshold)
    spreadsheet_safe(frame).to_csv(summary_path, index=False)
    price_list = parse_prices(options.prices)
    rich = enrich(frame, records)

    stats = experiment_stats(rich, margin, options.looks, options.look)
    # (an experiment split by node type, "<id> @ <node type>", has its id's findings)
    stats["in_effect"] = stats["experiment"].str.split(" @ ").str[0].map(in_effect(records))
    baseline = pick_baseline(stats)
    base = baseline_sps(stats, baseline)
    stats_sp = with_group_speedup(with_speedup(stats, base))
    ladder = previous_steps(ladder_frame(stats, baseline))
    matrix, order = backend_matrix(stats)
    compiled = compiled_pairs(stats)
    curves = loss_curves(rich, records)
    correctness, check = correctness_section(stats, rich, curves, plots_dir)
    diverging = list(check.loc[check["verdict"] == "diverges", "experiment"])
    costs = cost_frame(stats, baseline, price_list, diverging)
    roof = ceiling_frame(stats)
    svgs = plot_all(stats, ladder, matrix, order, roof, baseline, plots_dir)

    others = [load_machine(m, noise_threshold) for m in parse_machines(options.machines)]
    machine_summary = None
    machine_sections = []
    if others:
        measured = [p for p in price_list if p["throughput"] == "measured"]
        here = Machine(
            name=options.name or ", ".join(dict.fromkeys(rich["node_type"].dropna())) or "this run",
            frame=rich,
            records=records,
            usd_per_hour=measured[0]["usd_per_hour"] if measured else math.nan,
            note=measured[0]["note"] if measured else "",
            source="this run",
        )
        section, machine_summary = machines_section([here, *others], plots_dir)
        machine_sections.append(section)

    found = stated_comparisons(stats_sp, baseline, ladder, matrix, compiled)
    trained = family_picks(stats_sp, baseline, diverging)
    served = inference_picks(stats_sp, baseline)
    stated = [p[1] for p in trained] + [p[2] for p in served]  # (their comparisons)
    comparisons = comparisons_frame(found, headline_pairs(stats_sp, baseline, diverging, stated))
    spreadsheet_safe(comparisons).to_csv(comparisons_path, index=False)
    sweeps, not_run = sweep_sections(stats_sp, baseline, svgs)
    sections = [
        ladder_section(ladder, baseline, base, svgs["ladder"]),
        families_section(stats_sp, baseline),
        *machine_sections,
        cost_section(costs, baseline),
        backends_section(matrix, order, compiled, svgs["backends"]),
        correctness,
        startup_section(stats, baseline, plots_dir),
        *sweeps,
        inference_section(stats_sp, baseline),
        ceiling_section(roof, svgs["ceiling"]),
        distributed_section(stats_sp, options.collectives, plots_dir),
        noise_section(rich, records, noise_threshold),
        comparisons_section(comparisons, stats),
        timing_section(frame, records),
        other_section(stats_sp, baseline),
        failures_section(frame, records),
        summary_section(frame),
    ]
    found = Findings(
        rich, records, stats, baseline, costs, check, compiled, machine_summary,
        family_lines(trained) + inference_lines(served), comparisons, options.plan,
    )  # fmt: skip
    headline = headline_html(found)
    provenance = provenance_html(frame, records)
    page = Page(options.title, baseline, sections, headline, provenance, not_run,
                left_out_by_plan(options.plan)[1])  # fmt: skip
    html_path.write_text(page_html(page, frame, len(stats)), encoding="utf-8")
    n, n_ok, n_failed = trial_counts(frame)
    return {"trials": n, "ok": n_ok, "failed": n_failed, "incorrect": incorrect(frame),
            "left_out": left_out(frame),
            "baseline": baseline}  # fmt: skip


def _plan_file(job) -> str | None:
    """The report's input ``plan`` (a budget's plan made again), where it has one."""
    items = _items(job, "plan")
    return items[0] if items else None


def _records(job) -> list[str]:
    """The report's trial records: its input ``records`` and, where it has them,
    ``early`` (the headline's second trials a provisional report holds besides: an input
    of its own, as its list may wait for a checkpoint that the first trials must not)."""
    return _items(job, "records") + _items(job, "early")


def _items(job, name: str) -> list[str]:
    """A job's named input as a list of paths (none where the job lacks it)."""
    given = job.input.get(name) if hasattr(job.input, "get") else None
    return [given] if isinstance(given, str) else [str(item) for item in given or []]


#: The report rule's entry point (the plots go next to the HTML file).
COMMAND = Command(
    __doc__.splitlines()[0],
    (
        Arg("records", _records, many=True, help="trial record JSON files"),
        Arg("collectives", "input.collectives", many=True,
            help="collectives microbenchmark JSON files"),
        Arg("summary", "output.summary", type=Path, help="summary CSV to write"),
        Arg("html", "output.html", type=Path, help="HTML report to write"),
        Arg("comparisons", "output.comparisons", type=Path, default=None,
            help="comparisons CSV to write (default: comparisons.csv beside the summary)"),
        Arg("plots_dir", lambda job: Path(job.output.html).parent, type=Path,
            help="folder for the SVG plots"),
        Arg("prices_json", "params.prices", default="[]",
            help="JSON list of {name, usd_per_hour, note, throughput: measured|article}"),
        Arg("machines_json", "params.machines", default="[]",
            help="JSON list of other result sets to compare: {name, results, usd_per_hour, "
            "note}"),
        Arg("machine", default=[], extra={"nargs": 3, "action": "append",
                                          "metavar": ("NAME", "RESULTS", "USD_PER_HOUR")},
            help="another result set (a results folder, records folder or summary.csv) and "
            "its hourly price ('-' for none); repeat for several. Without --records, the "
            "first one is the report's own run"),
        Arg("name", lambda job: job.params.name or None, default=None,
            help="this run's name beside other machines"),
        Arg("noise_threshold", "params.noise_threshold", type=float,
            default=DEFAULT_NOISE_THRESHOLD,
            help="a trial is noisy when its probe is below this fraction of comparable "
            "trials' median"),
        Arg("margin", "params.margin", type=float, default=MARGIN,
            help="two throughputs within this fraction of each other are the same"),
        Arg("looks", "params.looks", type=int, default=1,
            help="how many rounds' reports may decide a comparison (max_trials - trials + 1)"),
        Arg("look", "params.look", type=int, default=None,
            help="which of those looks this report is (default: the last)"),
        Arg("plan_json", "params.plan", default="{}",
            help='what a budget\'s plan left out: JSON {"budget", "planned", "left_out": '
            '[{"id", "group"}]}'),
        Arg("plan_file", _plan_file, type=Path, default=None,
            help="the same in a file (the plan made again from the calibrations, "
            "study/replan.py): it wins over --plan-json"),
        Arg("title", "params.title", default=DEFAULT_TITLE),
        Arg("log", "log", type=Path, default=None, help="also append the result line here"),
    ),
)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = COMMAND.parser(prog="python -m workflow_scripts.report")
    args = parser.parse_args(argv)
    try:
        prices = parse_prices(args.prices_json)
    except (ValueError, TypeError) as exc:
        parser.error(f"--prices-json is not valid JSON: {exc}")
    try:
        machines = parse_machines(args.machines_json)
        machines += parse_machines(
            [
                {"name": n, "results": r, "usd_per_hour": None if u in ("-", "") else u}
                for n, r, u in args.machine
            ]
        )
    except (ValueError, TypeError) as exc:
        parser.error(f"machines: {exc}")
    record_paths = list(args.records)
    name = args.name
    if not record_paths and machines:  # the first machine is this report's own run
        first = machines.pop(0)
        record_paths = [p for p in result_files(first["results"]) if p.suffix == ".json"]
        if not record_paths:
            parser.error(f"machine {first['name']!r}: no trial records in {first['results']}")
        name = name or first["name"]
        if not isnan(first["usd_per_hour"]):
            prices = [
                {"name": first["name"], "usd_per_hour": first["usd_per_hour"],
                 "note": first["note"], "throughput": "measured"},
                *[p for p in prices if p["throughput"] != "measured"],
            ]  # fmt: skip
    option = "--plan-file" if args.plan_file else "--plan-json"
    try:
        plan = json.loads(args.plan_file.read_text() if args.plan_file else args.plan_json)
    except (OSError, ValueError) as exc:
        parser.error(f"{option} is not valid JSON: {exc}")
    records = load_records(record_paths)
    try:
        outputs = Outputs(args.summary, args.html, args.plots_dir, args.comparisons)
        options = Options(
            prices, args.title, args.noise_threshold, load_records(args.collectives),
            machines, name, args.margin, args.looks, args.look, plan,
        )  # fmt: skip
        result = build_report(records, outputs, options)
    except ValueError as exc:
        parser.error(str(exc))
    line = f"report: {args.html} ({result['trials']} trials, {result['failed']} failed"
    line += f", {result['incorrect']} incorrect" if result["incorrect"] else ""
    line += f", {result['left_out']} left out by the budget's clock)" if result["left_out"] else ")"
    announce(line, args.log)
    return 0
