"""The trial policy: run attempts until one is not disturbed (at most
``max_retries`` reruns), keep the discarded ones, write the record. On a cluster, a
trial whose earlier job was lost whole gets its record from SLURM's accounting instead
(``lost.py``)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from .. import runtimes, sysinfo
from ..experiment import CARRIED_KEY, FAR_KEY, PROBE_FLOOR_KEY
from ..plan import clock, estimate, far
from ..rank import gradcheck, references
from ..runtimes import warm
from ..runtimes.measured import Ran
from ..spec.settings import NOISE_RETRIES as MAX_RETRIES
from ..spec.settings import NOISE_THRESHOLD
from ..study import machine
from ..util import write_json_atomic
from . import carry, lost, peers
from .attempt import Trial, attempt_once
from .noise import noise_check, noise_reason, with_ceiling
from .outcome import assemble, failure

RETRY_DELAY_S = 5.0


@dataclasses.dataclass(frozen=True)
class Noise:
    """How a trial's attempts are judged and rerun: the calibration's reference probe
    (None: no reruns), the threshold, reruns at most, and the pause before each."""

    reference: dict | None = None
    threshold: float = NOISE_THRESHOLD
    max_retries: int = MAX_RETRIES
    retry_delay_s: float = RETRY_DELAY_S


def run(job: Trial, noise: Noise = Noise()) -> dict:
    """Run the trial (again, while its probe says it was disturbed) and write its record.
    A machine that cannot give the spec its CPUs or its data (a cluster node other than
    the one the study was checked on) runs nothing: a failed record says why."""
    spec, env_info, out, log, trial = job.spec, job.env_info, job.out, job.log, job.index
    data_path = job.data_path
    out.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    problems = machine.cpu_problems(spec, sysinfo.allowed_cpus())
    if data_path and not Path(data_path).exists():
        problems.append(
            f"experiment {spec['id']}.data_dir: {str(Path(data_path).resolve())!r} "
            "does not exist on this machine"
        )
    if problems:
        message = "this machine cannot run the experiment as configured: " + "; ".join(
            p.removeprefix("config error at ") for p in problems
        )
        return _not_run(failure(spec, trial, "MachineMismatch", message), env_info, out)
    slurm = sysinfo.slurm_job()
    loss = lost.earlier_loss(out, slurm["job_id"], log, attempt=job.attempt) if slurm else None
    if loss:  # an earlier job of this trial was lost whole: its record, from SLURM's words
        kind, words = loss
        record = failure(spec, trial, kind, f"the trial's earlier job was lost whole: {words}")
        _not_run(record, env_info, out)
        lost.unmark(out)
        return record
    lost.mark(out)
    try:
        record = _run(job, noise)
    except runtimes.Interrupted:
        # stopped from outside: by SLURM itself (its time limit signals first) or by the
        # user; the next attempt tells them apart from the accounting
        lost.mark(out, interrupted=True)
        raise
    except Exception:
        lost.unmark(out)  # the job fails with its own error; a retry runs it again
        raise
    lost.unmark(out)
    return record


def _not_run(record: dict, env_info: dict, out: Path, log: Path | None = None) -> dict:
    """Write the record of a trial that ran nothing (a failure's, or one left out); with
    ``log``, say why there too."""
    if log is not None:
        with open(log, "a") as logf:
            print(f"[launch] {record['error']['message']}", file=logf)
    now = sysinfo.now()
    runtime = runtimes.for_env(env_info).name
    assemble(record, record["spec"], record["trial"], env_info, runtime, Ran.not_run(now), now)
    write_json_atomic(out, record)
    return record


def _run(job: Trial, noise: Noise) -> dict:
    spec, env_info, out, log, trial = job.spec, job.env_info, job.out, job.log, job.index
    first_trial, reference = job.first_trial, noise.reference
    repeated = carry.incorrect_first(first_trial) if trial > 0 else None
    if repeated:
        return _not_run(failure(spec, trial, "IncorrectStep", repeated), env_info, out, log)
    memory = machine.memory_warning(spec, machine.total_memory_mb())
    carried, first = carry.from_first_trial(first_trial) if trial > 0 else (None, None)
    shared = carry.shared_flops(out, spec) if trial == 0 else None
    if shared:  # another first trial of the same workload counted its FLOPs
        carried = shared
    rank_spec = spec | {CARRIED_KEY: carried} if carried else spec
    far_from = far.reference(job.far_baseline, spec)
    if far_from:
        rank_spec = rank_spec | {FAR_KEY: far_from}
    if memory:  # a warning, not a refusal: the estimate is rough
        with open(log, "a") as logf:
            print(f"[launch] warning: {memory}", file=logf)
    cache_plan = carry.compile_cache_plan(spec, out, trial, first_trial)
    forks = warm.enabled(env_info.get("warm_interpreter", False), runtimes.for_env(env_info).name)
    # the gradient check's references another experiment made for the same step
    checks = not (carried and "negligible" in carried)
    kinds = gradcheck.reference_kinds(spec) if checks else []
    expected = estimate.for_trial(
        spec, reference, runtimes.in_container(env_info), warm="warm_from" in cache_plan,
        forks=forks, carried=carried,
        shared_references=[k for k in kinds if references.known(out, spec, k)],
    )  # fmt: skip
    until = clock.deadline()
    # (a budget's clock: the estimates scaled as this study's trials so far took)
    scale = clock.ratio(out.parent.parent) if until is not None else 1.0
    if until is not None and clock.too_late(expected["seconds"], until=until, scale=scale):
        why = clock.why(expected["seconds"], until, clock.kept(scale), scale)
        record = failure(spec, trial, clock.KIND, why)
        record["estimate"] = expected
        return _not_run(record, env_info, out, log)
    started = time.monotonic()
    started_at = time.time()
    discarded: list[dict] = []
    attempt = 1
    probe_log = peers.log_path(out, spec.get("env") or env_info.get("name") or "env")
    last_trial = peers.last_trial_path(out)
    node = sysinfo.node_type()
    own = (spec["id"], trial)
    withheld = False
    while True:
        attempt_started = time.monotonic()
        # what the probe before the steps ordinarily reads here: below it, the trial
        # probes again before it steps (where disturbed attempts are run again at all)
        floors = (
            peers.floors(peers.read(probe_log), spec.get("probe_size"), node, own, noise.threshold)
            if reference is not None and noise.max_retries > 0
            else {}
        )
        attempt_spec = rank_spec | {PROBE_FLOOR_KEY: floors} if floors else rank_spec
        record = with_ceiling(
            attempt_once(dataclasses.replace(job, spec=attempt_spec), attempt, cache_plan),
            reference,
        )
        record["spec"] = spec  # (what it carried: the record's own key)
        line = peers.line_for(record, spec["id"], trial, attempt, node)
        levels = {}
        if line is not None:  # what its peers ordinarily read, then its own for later trials
            seen = peers.read(probe_log)
            kind = {k: line[k] for k in ("size", "threads", "world", "node")}
            levels = {
                s: peers.ordinary(peers.peer_rates(seen, kind, s, own)) for s in peers.SIGNALS
            }
            peers.append(probe_log, line)
        check = noise_check(record, reference, noise.threshold, levels)
        record["noise_check"] = check
        if not check or check["passed"] is not False or attempt > noise.max_retries:
            break
        if clock.too_late(noise.retry_delay_s + expected["seconds"], scale=scale):  # nor a rerun
            with open(log, "a") as logf:
                print("[launch] no noise rerun: the budget's clock would run out; the "
                      "attempt is kept, flagged", file=logf)  # fmt: skip
            break
        streak = peers.persistent(last_trial, own, started_at)
        if streak:  # the machine is disturbed for now: a rerun would be disturbed too
            check["rerun_withheld"] = streak
            withheld = True
            with open(log, "a") as logf:
                print(f"[launch] no noise rerun: {streak}; the attempt is kept, flagged",
                      file=logf)  # fmt: skip
            break
        reason = noise_reason(check)
        discarded.append(
            {
                "attempt": attempt,
                "reason": reason,
                "signal": "; ".join(check["caught_by"]),
                "probe": record.get("probe"),
                "probe_after": record.get("probe_after"),
                "other_work": record.get("other_work"),
                "samples_per_s": (record.get("metrics") or {}).get("samples_per_s"),
                "launched_at": record["provenance"].get("launched_at"),
            }
        )
        with open(log, "a") as logf:
            pause = noise.retry_delay_s
            print(
                f"[launch] attempt {attempt} discarded: {reason}; again in {pause:g} s", file=logf
            )
        time.sleep(noise.retry_delay_s)
        attempt += 1
    record["attempts"] = attempt
    record["discarded_attempts"] = discarded
    disturbed = bool(check) and check.get("passed") is False
    if check:  # (a trial without a noise check says nothing of the machine's state)
        peers.ended(last_trial, own, attempt, disturbed, withheld)
    # what the discarded attempts and the pauses after them cost (0 without a rerun)
    record["retry_wall_s"] = round(attempt_started - started, 3) if attempt > 1 else 0.0
    # how long the trial took here (every attempt, the pauses between them) beside
    # what the study predicted before it ran (one attempt)
    record["trial_wall_s"] = round(time.monotonic() - started, 3)
    record["estimate"] = expected
    carry.complete(record, carried, first)
    if shared:
        record["carried"] = shared
    elif trial == 0:
        carry.share_flops(out, spec, record)
    if far_from:
        record[FAR_KEY] = far_from
    record["warnings"] = [memory] if memory else []
    write_json_atomic(out, record)
    return record
