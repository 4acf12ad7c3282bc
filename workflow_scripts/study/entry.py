"""The ways into the study loader: Snakemake's config (``command_line_config`` before the
Snakefile's configfile statement, then ``load_for_snakemake``), and the command line
``python -m workflow_scripts.study`` (``main``)."""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from ..plan import clock
from ..spec.fields import BUILTIN_DEFAULTS, FIELDS, PER_EXPERIMENT
from ..spec.settings import budget_seconds
from ..sysinfo import PLAN_CPUS_VAR, allowed_cpus, cpu_list_str
from ..util import bare as _bare
from . import replan
from .budget import leave_out, within_budget
from .causes import given_fields, one_per_cause
from .config import (
    Study,
    StudyConfigError,
    load_study,
    merge_config,
    resolve_spec,
)
from .files import check_configfile, read_config_file
from .machine import check_machine
from .schema import build_schema, err

#: what the study was planned for, set by Snakemake's own process for its jobs':
#: ``host <name>`` (this machine) or ``nodes <description>`` (a SLURM partition's)
PLANNED_FOR_VAR = "STUDY_PLANNED_FOR"


def command_line_config(
    config: dict, configfile: str = "config.yaml", configfiles: Sequence[str] = ()
) -> dict:
    """For the Snakefile, before its ``configfile`` statement: what the command line set
    (the ``--configfile`` files, then ``--config``), with which Snakemake fills ``config``
    before that statement merges the workflow's own file under it. The study's loader
    lets it win over the selected preset, as Snakemake lets it win over config.yaml.
    Also checks the workflow's config file (``configfile``) before Snakemake reads it,
    and reads each of the command line's (``configfiles``, which Snakemake has parsed)
    as the study reads its own (:mod:`.files`: a duplicate key, a value that is not plain
    data, a templated file refused)."""
    from snakemake.exceptions import WorkflowError

    try:
        if Path(configfile).exists():
            read_config_file(configfile)
        for path in configfiles:
            found = _as_given(path)
            if found is not None:  # (else Snakemake, which read it, would have said)
                check_configfile(found)
    except StudyConfigError as exc:
        raise WorkflowError(str(exc)) from None
    return copy.deepcopy(dict(config))


def _as_given(path: str) -> Path | None:
    """A ``--configfile`` as the user gave it: from here, else from the folder Snakemake
    was started in (``--directory`` moves Snakemake before the Snakefile runs)."""
    for where in (Path(path), Path(os.environ.get("PWD", ".")) / path):
        if where.exists():
            return where
    return None


def configfiles_given(argv: Sequence[str]) -> list[str]:
    """The files Snakemake's command line (``argv``) gives with ``--configfile`` or
    ``--configfiles`` (each takes one or more), in order."""
    files: list[str] = []
    taking = False
    for arg in argv[1:]:
        name, eq, value = arg.partition("=")
        if name in ("--configfile", "--configfiles"):
            taking = not eq
            if eq:
                files.append(value)
        elif arg.startswith("-"):
            taking = False
        elif taking:
            files.append(arg)
    return files


#: Snakemake's options that run no job (a left-out trial's record stays where they are)
RUNS_NOTHING = {
    "-n", "--dry-run", "--dryrun", "--lint", "--dag", "--rulegraph", "--filegraph", "-S",
    "--summary", "-D", "--detailed-summary", "-l", "--list", "--list-rules", "--lt",
    "--list-target-rules", "--unlock", "--cleanup-metadata", "--cm", "-t", "--touch",
    "--report", "--containerize", "--lc", "--list-changes", "--list-code-changes",
    "--li", "--list-input-changes", "--lp", "--list-params-changes", "-h", "--help",
    "--version", "--print-compilation", "--export-cwl", "--archive", "--delete-all-output",
    "--delete-temp-output", "--list-untracked", "--lu", "--show-failed-logs-only",
}  # fmt: skip


def runs_jobs(argv: Sequence[str]) -> bool:
    """Whether Snakemake's command line (``argv``) runs jobs: none of :data:`RUNS_NOTHING`,
    also in a group of short flags (``-np``)."""
    for arg in argv[1:]:
        name = arg.partition("=")[0]
        if name in RUNS_NOTHING:
            return False
        if name[:1] == "-" and name[1:2] != "-" and name[1:].isalpha():
            if any(f"-{c}" in RUNS_NOTHING for c in name[1:]):
                return False
    return True


def load_for_snakemake(config: dict, command_line: dict | None = None, runs: bool = True) -> Study:
    """:func:`load_study` for the Snakefile (run from the repository root, where
    Snakemake reads config.yaml), with ``command_line`` (:func:`command_line_config`)
    winning over the preset, and the checks that need this machine (CPUs, memory,
    files). A configuration error stops Snakemake with the loader's message alone (a
    WorkflowError, no traceback); warnings are printed.

    The first process that loads the study (Snakemake's own) plans it: for this
    machine, or for the nodes of the cluster (``cluster.scheduler: slurm``, which
    profiles/slurm sets), and hands the plan to every job's process through the
    environment (:data:`PLANNED_FOR_VAR`, the CPUs and memory); a job's process loads
    the same study from it, without the checks and messages.

    ``runs``: whether this invocation runs jobs (:func:`runs_jobs`); where it does, the
    first process forgets the trials the budget's clock left out last time, so they
    run (plan/clock.py)."""
    from snakemake.exceptions import WorkflowError

    base_dir = Path.cwd()
    cli = copy.deepcopy(dict(command_line or {}))
    main_process = PLANNED_FOR_VAR not in os.environ
    try:
        if main_process:
            # the CPUs the study is planned on, for every job's process (sysinfo.plan_cpus)
            os.environ.setdefault(PLAN_CPUS_VAR, cpu_list_str(allowed_cpus()))
        study = load_study(config, base_dir, cli=cli)
        node = None
        if main_process and study.settings["cluster"]["scheduler"] == "slurm":
            # planned for the cluster's nodes, not this (submit) host: every job's
            # process inherits what they have (PLAN_CPUS_VAR, NODE_MEM_VAR)
            node = plan_for_nodes(study.settings)
            study = load_study(config, base_dir, cli=cli)
        if main_process:
            os.environ[PLANNED_FOR_VAR] = planned_for(node)
            try:
                check_machine(study, memory_mb=node.mem_mb if node else None)
            except StudyConfigError as exc:
                if node is None:
                    raise
                raise StudyConfigError(
                    f"{exc}\n(the study was planned for the nodes of {node.describe()}; "
                    "not this submit host)"
                ) from None
            if node is None:
                need_cluster(study)
        else:
            check_job_host(os.environ[PLANNED_FOR_VAR])
    except StudyConfigError as exc:
        raise WorkflowError(str(exc)) from None
    from ..launchers.torchrun import FABRIC_PROVIDER_VAR, NETWORK_INTERFACE_VAR

    # for several-node trials, in every job's process (launchers.torchrun)
    iface = study.settings["cluster"]["network_interface"]
    if iface:
        os.environ[NETWORK_INTERFACE_VAR] = iface
    os.environ[FABRIC_PROVIDER_VAR] = study.settings["cluster"]["fabric_provider"] or ""
    if main_process:
        for line in study.warnings:
            print(line, file=sys.stderr)
        if runs:
            root = study.path(study.results)
            gone = clock.forget(root / "records", root / "summary.csv")
            if gone:
                print(f"[budget] {len(gone)} trials that the budget's clock left out last "
                      "time run now", file=sys.stderr)  # fmt: skip
        try:
            est = plan_budget(study)
            est = print_estimate(study, est)
            problems = endless(study, est)
            if problems:
                given = given_fields(study.defaults)
                lines = one_per_cause(problems, study.ids, given, len(study.experiments))
                raise StudyConfigError("\n".join(lines))
        except StudyConfigError as exc:
            raise WorkflowError(str(exc)) from None
    else:  # the main process's budget plan
        if os.environ.get(MAX_TRIALS_VAR):
            study.settings["max_trials"] = int(os.environ[MAX_TRIALS_VAR])
        if os.environ.get(LEFT_OUT_VAR):
            leave_out(study, os.environ[LEFT_OUT_VAR].split(","))
        replan.from_environment(study)
    return study


#: the adaptive rounds' cap a budget allowed, for every job's process
MAX_TRIALS_VAR = "STUDY_MAX_TRIALS"
#: the experiments a budget left out (comma-separated ids), for every job's process
LEFT_OUT_VAR = "STUDY_LEFT_OUT"


def plan_budget(study: Study, results: Path | str = "results") -> dict | None:
    """With ``budget`` set: cap the adaptive rounds at what fits in it, in the worst case
    (every experiment in every round, as estimated on this machine), and say what
    precision that buys. Not even the minimum (``trials``) fitting is said too; the
    study then runs the minimum. The estimate it planned with (None: none made), for
    :func:`print_estimate`."""
    from ..plan import estimate_text, order, rounds, study_estimate

    settings = study.settings
    if not settings.get("budget"):
        return None
    try:
        budget = budget_seconds(settings["budget"])
    except ValueError as exc:
        raise StudyConfigError(f"config error at budget: {exc}") from None
    clock.start(budget)  # every job's process holds to it, also where the plan is wrong
    clock.keep_after(*after_last_trial(study, results))
    low, high = int(settings["trials"]), rounds.cap(settings)
    try:
        machine = study_estimate.study_machine(study, results)
        est = study_estimate.for_study(study, results, machine=machine)
    except Exception as exc:  # noqa: BLE001 - the estimate is advice, not a check
        print(f"[budget] no estimate ({type(exc).__name__}: {exc}): max_trials alone caps "
              "the rounds", file=sys.stderr)  # fmt: skip
        return None
    round_s = est.get("later_round_s", est["trials_s"] / low)
    setup_s = est["total_s"] - est["trials_s"]
    fits = rounds.rounds_within(budget, setup_s, est["trials_s"], round_s, low, high)
    n = len(study.experiments)
    measured = rounds.measured_spread(study.path(study.results) / "comparisons.csv")
    spread = measured or rounds.ASSUMED_SPREAD
    source = "as the last run measured" if measured else "assumed: no run measured one yet"
    margin = settings["margin"]
    human = estimate_text.human
    if fits is None:
        room, all_specs = budget - setup_s, list(study.experiments)
        for _ in range(5):  # the estimate of what is left may differ: fit it again
            kept, left = within_budget(study, est["experiments"], room)
            trial = copy.copy(study)
            leave_out(trial, left)
            over = study_estimate.for_study(trial, results, machine=machine)["total_s"] - budget
            if over <= 0 or not left and len(kept) == len(all_specs):
                break
            room -= over
        print(f"[budget] {settings['budget']} does not cover the {low} trials every experiment "
              f"runs (about {human(est['total_s'])} here): the study runs the first "
              f"{len(kept)} of its {n} experiments in its order, the question first (the "
              "headline's group, every group's baseline, their ladders, the rest cheapest "
              f"first), with no adaptive rounds, and leaves out {len(left)}: "
              f"{_by_group(study, left)}", file=sys.stderr)  # fmt: skip
        full = est
        # before a calibration: the next in the order, planned again from them (replan.py)
        reserve = (replan.reserve_of(study, est["experiments"], kept, left, budget - setup_s)
                   if left and replan.needed(study, results) else [])  # fmt: skip
        if left:
            runs = copy.copy(study)
            leave_out(runs, left)
            est = study_estimate.for_study(runs, results, machine=machine)
            est["all_experiments"] = full["experiments"]  # (the reserve's too: endless())
            n = len(runs.experiments)
            gone = [e for e in left if e not in set(reserve)]
            leave_out(study, gone)
            os.environ[LEFT_OUT_VAR] = ",".join(gone)
            print(f"[budget] what it runs: about {human(est['total_s'])} here",
                  file=sys.stderr)  # fmt: skip
        if reserve:
            study.replan = {"must": kept, "reserve": reserve}
            os.environ[replan.REPLAN_VAR] = ",".join(reserve)
            print(f"[budget] this estimate has no calibration of this machine yet: once they "
                  "and the first trial of each of these have run, the study plans again from "
                  "them and the time left, and runs the next of the "
                  f"{len(reserve)} in its order that fit then (those that fit in "
                  f"{replan.RESERVE:g}x the budget here)", file=sys.stderr)  # fmt: skip
        if est["total_s"] > budget:
            question = set(order.question(all_specs))
            print(_over_budget(settings["budget"], only_question=set(kept) <= question),
                  file=sys.stderr)  # fmt: skip
        fits = low
    else:
        print(f"[budget] {settings['budget']}: {low} to {fits} trials per experiment fit "
              f"(about {human(est['total_s'] + (fits - low) * round_s)} if every experiment "
              f"that may go on ran {fits})",
              file=sys.stderr)  # fmt: skip
    print(f"[budget] {rounds.precision_text(low, n, spread, source, margin)}", file=sys.stderr)
    if fits > low:
        print(f"[budget] at most: {rounds.precision_text(fits, n, spread, source, margin)}",
              file=sys.stderr)  # fmt: skip
    settings["max_trials"] = fits
    os.environ[MAX_TRIALS_VAR] = str(fits)
    return study_estimate.with_rounds(est, low, rounds.cap(settings))


def after_last_trial(study: Study, results: Path | str = "results") -> tuple[float, float]:
    """What the study runs after its last trial, as estimated before any job, and the
    least the clock keeps for it (``plan/clock.py``: ``keep_after``'s two): each
    collectives job without a result (at the estimate's, and at the most one took on
    the machines measured) and the study's report (of every experiment, what a plan made
    again may add included)."""
    from ..plan import estimate

    variants = (study.settings.get("collectives") or {}).get("variants") or []
    missing = [v for v in variants if not (Path(results) / "collectives" / f"{v}.json").exists()]
    report = estimate.report_s(len(study.experiments))
    return (
        estimate.COLLECTIVES_S * len(missing) + report,
        estimate.COLLECTIVES_MOST_S * len(missing) + report,
    )


def _over_budget(budget: str, only_question: bool) -> str:
    """What happens where even the plan that leaves experiments out is estimated past the
    budget: the clock (plan/clock.py) holds the study to it."""
    why = (" (the question alone, which a budget never leaves out: the headline's group and "
           "every group's baseline)" if only_question else "")  # fmt: skip
    until = clock.deadline()
    at = f" ({time.strftime('%H:%M', time.localtime(until))})" if until else ""
    return (f"[budget] that is more than {budget}{why}: the budget's clock holds the study to "
            f"it: a trial that would end past its deadline{at} does not start, the report "
            "counts it as left out, and the next snakemake runs it")  # fmt: skip


def _by_group(study: Study, ids: list[str]) -> str:
    """``ids`` counted by group, in the order of the groups."""
    if not ids:
        return "none"
    groups: dict[str, int] = {}
    for spec in study.experiments:
        if spec["id"] in ids:
            key = spec.get("group") or spec["id"]
            groups[key] = groups.get(key, 0) + 1
    return ", ".join(f"{g} ({k})" for g, k in groups.items())


def planned_for(node) -> str:
    return f"nodes {node.describe()}" if node is not None else f"host {socket.gethostname()}"


def check_job_host(planned: str) -> None:
    """A job that SLURM runs on another host than the one its study was planned for
    (a study submitted without ``cluster.scheduler: slurm``) stops before it measures:
    its CPUs, memory and thread counts would be the submit host's."""
    job = os.environ.get("SLURM_JOB_ID")
    kind, _, host = planned.partition(" ")
    if job and kind == "host" and host != socket.gethostname():
        raise StudyConfigError(
            f"config error at cluster.scheduler: this job runs in SLURM job {job} on "
            f"{socket.gethostname()}, but the study was planned for the host {host} "
            "(its CPUs and memory); submit it with --profile profiles/slurm, or set "
            "cluster: {scheduler: slurm} in your config file"
        )


def need_cluster(study: Study) -> None:
    """Refuse what needs several nodes in a run on one machine."""
    at = [(f"experiment {s['id']}.nodes", s["nodes"]) for s in study.experiments if s["nodes"] > 1]
    c = study.settings["collectives"]
    if c["variants"] and c["nodes"] > 1:
        at.append(("collectives.nodes", c["nodes"]))
    if at:
        raise StudyConfigError(
            "\n".join(
                f"config error at {where}: {n} nodes need a cluster (snakemake --profile "
                "profiles/slurm); this run has one machine"
                for where, n in at
            )
        )


def plan_for_nodes(settings: dict):
    """Plan on the nodes of the study's partition (the ``cluster`` setting's, else
    SLURM's default one): their CPUs (as CPUs 0..n-1) and memory go to every job's
    process through the environment; a cluster that cannot be asked, or whose partition
    mixes node types, is a configuration error."""
    from ..cluster import slurm

    try:
        node = slurm.planned_node(settings)
    except slurm.ClusterError as exc:
        raise StudyConfigError(f"config error at cluster: {exc}") from None
    os.environ[PLAN_CPUS_VAR] = cpu_list_str(range(node.cpus))
    os.environ[slurm.NODE_MEM_VAR] = str(node.mem_mb)
    os.environ[slurm.NODES_VAR] = ",".join(node.nodes)
    print(f"planned for {node.describe()}", file=sys.stderr)
    return node


def print_estimate(study: Study, est: dict | None = None) -> dict | None:
    """The study's expected wall time on this machine (``est``: one already made), before
    anything runs (a dry run too), and that estimate. An estimate that cannot be made
    never stops the workflow (None)."""
    from ..plan import estimate_text, study_estimate

    try:
        est = est or study_estimate.for_study(study, "results")
    except Exception as exc:  # noqa: BLE001 - the estimate is advice, not a check
        print(f"[estimate] no estimate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    print(estimate_text.format_estimate(est, study.settings["trials"]), file=sys.stderr)
    return est


#: a trial whose estimate exceeds its timeout_s this many times, with nothing to stop its
#: steps sooner, is refused: the estimate is within 2x of the measured time (docs/presets.md)
ENDLESS = 4


def endless(study: Study, est: dict | None) -> list[str]:
    """The experiments whose trials would be killed at their ``timeout_s`` before they
    record: their steps estimated (``est``) beyond :data:`ENDLESS` times it, with no
    ``time_budget_s`` or ``step_precision`` to end them sooner."""
    problems = []
    per = (est or {}).get("all_experiments") or (est or {}).get("experiments") or {}
    for spec in study.experiments:
        e = per.get(spec["id"]) or {}
        timeout = spec.get("timeout_s")
        if spec.get("time_budget_s") or spec.get("step_precision") or not timeout:
            continue
        if float(e.get("uncapped_s") or 0.0) > ENDLESS * float(timeout):
            what = f"{spec['epochs']} epochs" if spec.get("epochs") else f"{spec['steps']} steps"
            problems.append(
                err(
                    f"experiment {spec['id']}.timeout_s",
                    f"{what} take more than {ENDLESS}x timeout_s {timeout} here (the "
                    "estimate above), with time_budget_s and step_precision off: every "
                    "trial would be killed before it records; lower steps, raise timeout_s "
                    "or set time_budget_s",
                )
            )
    return problems


# ---------------------------------------------------------------------------
# command line


def read_config(path: Path | str, sets: list[str] | None = None) -> dict:
    """config.yaml plus ``key=value`` overrides (values read as YAML, like Snakemake's
    ``--config``)."""
    return {**read_config_file(path), **read_sets(sets or [])}


def read_sets(sets: list[str]) -> dict:
    """``key=value`` overrides, values read as YAML (like Snakemake's ``--config``)."""
    out: dict = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StudyConfigError(f"config error: --set {item!r}: expected key=value")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key] = value
    return out


def format_table(study: Study) -> str:
    s = study.settings
    lines = [
        (
            f"preset {s['preset']}: {len(study.experiments)} experiments, "
            f"envs {', '.join(study.envs)}, trials {s['trials']}, runtime {s['runtime']}"
        ),
    ]
    changed = {
        k: v
        for k, v in study.defaults.items()
        if k != "compile" and v != BUILTIN_DEFAULTS[k] and k not in PER_EXPERIMENT
    }
    if changed:
        lines.append("defaults: " + " ".join(f"{k}={_bare(v)}" for k, v in changed.items()))
    rows = [("id", "backend", "env", "group", "claim", "fields (other than the defaults)")]
    skip = {"id", "backend", "group", "claim_speedup", "env", "preset"}
    for spec in study.experiments:
        diffs = []
        # what the defaults resolve to for this model and backend (their family's
        # optimizer, sequence length, the backend's compile, ...)
        base = resolve_spec(
            {"model": spec["model"], "backend": spec["backend"]}, study.defaults, s["preset"]
        )
        for k in FIELDS:
            if k in skip:
                continue
            if spec[k] != base[k]:
                diffs.append(f"{k}={_bare(spec[k])}")
        claim = "" if spec["claim_speedup"] is None else f"{spec['claim_speedup']:g}x"
        rows.append(
            (spec["id"], spec["backend"], spec["env"], spec["group"], claim, " ".join(diffs))
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[5])
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m workflow_scripts.study",
        description="Print the experiments a study config expands to.",
    )
    ap.add_argument("--config", default="config.yaml", type=Path, help="default: config.yaml")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a top-level key, like snakemake --config KEY=VALUE (repeatable)",
    )
    ap.add_argument("--json", action="store_true", help="print the resolved specs as JSON")
    ap.add_argument("--schema", action="store_true", help="print the config schema (YAML)")
    ap.add_argument(
        "--check",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="a file for snakemake --configfile, checked first (repeatable): bounded before "
        "it is parsed (Snakemake parses it before any check of the study's), then loaded "
        "over --config as snakemake would",
    )
    args = ap.parse_args(argv)
    if args.schema:
        print(yaml.safe_dump(build_schema(), sort_keys=False, width=100), end="")
        return 0
    try:
        config = read_config(args.config, args.set)
        cli: dict = {}
        for path in args.check:  # (then --set, as snakemake's --config after --configfile)
            merge_config(cli, check_configfile(path))
        if cli:
            cli.update(read_sets(args.set))
        merge_config(config, cli)
        study = load_study(config, base_dir=args.config.parent, cli=cli)
    except StudyConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"settings": study.settings, "experiments": study.experiments}, indent=2))
    else:
        print(format_table(study))
    return 0
