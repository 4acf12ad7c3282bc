"""The trial policy: run one experiment trial, judge its noise, assemble and write its record.

Runs in the workflow's environment (standard library only). A trial is the
command lines of its ranks (from its launcher, ``workflow_scripts/launchers``),
wrapped by its runtime (a local environment or a container image,
``workflow_scripts/runtimes``), run with the spec's time limit. Whatever happened
becomes one JSON record: the harness's result (merged over the ranks by the
launcher), or a ``crashed``/``timeout`` record with the tail of the output when the
process died without one.

Noise: a trial was disturbed when one of three signals says so (:func:`noise_check`):
its noise probe just before the steps, or the one just after them, ran below
``noise_threshold`` times the reference's fp32 rate (the calibration the workflow
measures once per environment), or other work took more than ``1 - noise_threshold``
of its threads' CPU time during the timed steps (``workflow_scripts.contention``). A
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

import argparse
import getpass
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import backends, estimate, launchers, probe, runtimes, sysinfo
from .launchers import harness_args, result_paths
from .runtimes.base import REPO_ROOT
from .study import machine
from .study.settings import NOISE_RETRIES as MAX_RETRIES
from .study.settings import NOISE_THRESHOLD
from .util import SCHEMA_VERSION, finite, tail, write_json_atomic

RETRY_DELAY_S = 5.0


# --------------------------------------------------------------------------- environment


def environment(spec: dict, runtime: runtimes.Runtime, starter: str = "local") -> dict[str, str]:
    """A run's variables: the runtime's, then the launcher's (threads), the backend's,
    and last the spec's own ``env_vars``."""
    env = runtime.environment()
    env.update(launchers.get(spec["launcher"]).environment(spec, starter))
    env.update(backends.get(spec["backend"]).env_vars)
    env.update({str(k): str(v) for k, v in (spec.get("env_vars") or {}).items()})
    return env


def default_inductor_cache_dir(env: dict[str, str]) -> str:
    """Where TorchInductor caches when TORCHINDUCTOR_CACHE_DIR is unset (as torch computes it)."""
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except Exception:  # noqa: BLE001 - no user name: torch falls back the same way
        user = "unknown"
    tmp = env.get("TMPDIR") or tempfile.gettempdir()
    return os.path.join(tmp, f"torchinductor_{user}")


def compile_cache(
    spec: dict, env: dict[str, str], label: str, container: bool = False
) -> tuple[dict, Path | None]:
    """Point the run's compile caches at a fresh temporary folder (unless the spec keeps
    them warm, or sets TORCHINDUCTOR_CACHE_DIR itself); return what was used and the
    folder to remove afterwards."""
    own = "TORCHINDUCTOR_CACHE_DIR" in (spec.get("env_vars") or {})
    if spec.get("warm_compile_cache") or own:
        where = env.get("TORCHINDUCTOR_CACHE_DIR") or default_inductor_cache_dir(env)
        return {"dir": where, "fresh": False}, None
    if container:
        # every container starts from the image: its /tmp is fresh and goes with it
        env["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/torchinductor-cache"
        env["TRITON_CACHE_DIR"] = "/tmp/torchinductor-cache/triton"
        return {"dir": "/tmp/torchinductor-cache (in the container)", "fresh": True}, None
    folder = Path(tempfile.mkdtemp(prefix=f"compile-cache-{label}-"))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    env["TRITON_CACHE_DIR"] = str(folder / "triton")
    return {"dir": str(folder), "fresh": True}, folder


def _absolute(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def run_mounts(out: Path, data_path: str | None, cache: dict) -> list[tuple[str, str]]:
    """What a container run sees of the host besides the sources, each at its own path:
    the record's folder writable, the data (image folder or digits) read-only, and a
    warm compile cache if the spec keeps one."""
    mounts = [(str(out.parent.resolve()), "rw")]
    if data_path:
        mounts.append((_absolute(data_path), "ro"))
    if not cache["fresh"]:
        Path(cache["dir"]).mkdir(parents=True, exist_ok=True)
        mounts.append((cache["dir"], "rw"))
    return mounts


# --------------------------------------------------------------------------- noise


PROBE_BEFORE = "probe before steps"
PROBE_AFTER = "probe after steps"
OTHER_WORK = "other work during steps"


def probe_signal(name: str, result, reference: dict | None, threshold: float) -> dict | None:
    """A probe's fp32 rate against the reference; None when there is nothing to compare."""
    rate = result.get("fp32_gflops") if isinstance(result, dict) else None
    if reference is None or not finite(rate):
        return None
    ref, how = probe.reference_rate(reference, result.get("size"), result.get("threads"))
    check = {"signal": name, "fp32_gflops": rate, "reference": how}
    check["reference_node_type"] = measured_on(reference)
    if ref is None or ref <= 0:
        return {**check, "reference_fp32_gflops": None, "ratio": None, "passed": None}
    ratio = rate / ref
    check.update(reference_fp32_gflops=ref, ratio=ratio, passed=ratio >= threshold)
    check["detail"] = (
        f"{name}: fp32 {rate:.1f} GFLOP/s = {ratio:.2f} x the reference {ref:.1f} GFLOP/s ({how})"
    )
    return check


def work_signal(work, threshold: float) -> dict | None:
    """Other work's share of the run's threads' CPU time during the steps, as a ratio
    comparable with the probes' (1 - share); None when it could not be judged."""
    if not isinstance(work, dict) or not finite(work.get("share")):
        return None
    ratio = 1.0 - work["share"]
    detail = (
        f"{OTHER_WORK}: other processes took {work['other_cpu_s']:.1f} CPU s on the run's "
        f"{work['cpus']} CPUs in {work['wall_s']:.1f} s, {100 * work['share']:.0f}% of its "
        f"{work['threads']} threads' time"
    )
    return {"signal": OTHER_WORK, "ratio": ratio, "passed": ratio >= threshold,
            "detail": detail}  # fmt: skip


def noise_check(record: dict, reference: dict | None, threshold: float) -> dict | None:
    """Every noise signal of an ok record; None when none can be judged (a failed run,
    no probes and no /proc). ``passed`` is False when any signal failed, and
    ``caught_by`` names those; the probe before the steps keeps its fields at the top."""
    if record.get("status") != "ok":
        return None
    before = probe_signal(PROBE_BEFORE, record.get("probe"), reference, threshold)
    after = probe_signal(PROBE_AFTER, record.get("probe_after"), reference, threshold)
    work = work_signal(record.get("other_work"), threshold)
    signals = [x for x in (before, after, work) if x]
    if not signals:
        return None
    judged = [x["passed"] for x in signals if x["passed"] is not None]
    check = {
        "threshold": threshold,
        "signals": signals,
        "caught_by": [x["signal"] for x in signals if x["passed"] is False],
        "passed": all(judged) if judged else None,
    }
    if before:
        keys = ("fp32_gflops", "reference", "reference_fp32_gflops", "ratio",
                "reference_node_type")  # fmt: skip
        check.update({k: before[k] for k in keys})
    return check


def noise_reason(check: dict) -> str:
    failed = [x["detail"] for x in check["signals"] if x["passed"] is False]
    return "; ".join(failed) + f", below the threshold {check['threshold']:g}"


def with_ceiling(record: dict, reference: dict | None) -> dict:
    """Put the calibrated ceiling and the run's share of it in an ok record's metrics:
    ``ceiling_gflops`` (of the run's dtype, for all its threads: per rank x ranks),
    ``ceiling_dtype``, ``ceiling_source`` and ``pct_of_peak``; a share above 100 is
    no result but a ``measurement_error`` (``pct_of_peak_measured`` keeps the value)."""
    m = record.get("metrics")
    if record.get("status") != "ok" or not isinstance(m, dict):
        return record
    spec = record.get("spec") or {}
    checks = record.get("checks") or {}
    threads = checks.get("threads") or spec.get("threads")
    world = checks.get("world_size") or 1
    total = threads * world if finite(threads) else None
    rate, dtype, how = probe.ceiling_rate(reference, spec.get("precision", "fp32"), total)
    m.update(ceiling_gflops=rate, ceiling_dtype=dtype, ceiling_source=how, pct_of_peak=None)
    achieved = m.get("achieved_gflops")
    if rate and finite(achieved):
        pct = 100.0 * achieved / rate
        if pct <= 100.0:
            m["pct_of_peak"] = pct
        else:
            m["pct_of_peak_measured"] = pct
            m["measurement_error"] = (
                f"{pct:.0f}% of the calibrated ceiling ({rate:.1f} GFLOP/s, {how}): a run "
                "cannot compute faster than the machine's best dense matmul, so the FLOP "
                "count or the ceiling is wrong"
            )
    return record


# --------------------------------------------------------------------------- the policy


def run(
    spec: dict,
    env_info: dict,
    out: Path,
    log: Path,
    trial: int = 0,
    data_path: str | None = None,
    reference: dict | None = None,
    noise_threshold: float = NOISE_THRESHOLD,
    max_retries: int = MAX_RETRIES,
    retry_delay_s: float = RETRY_DELAY_S,
) -> dict:
    """Run the trial (again, while its probe says it was disturbed) and write its record.
    A machine that cannot give the spec its CPUs or its data (a cluster node other than
    the one the study was checked on) runs nothing: a failed record says why."""
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
        record = failure(spec, trial, "MachineMismatch", message)
        assemble(record, spec, trial, env_info, runtimes.for_env(env_info).name, [],
                 runtimes.Finished(None, False, 0.0, sysinfo.now(), sysinfo.now()),
                 sysinfo.now())  # fmt: skip
        write_json_atomic(out, record)
        return record
    memory = machine.memory_warning(spec, machine.total_memory_mb())
    if memory:  # a warning, not a refusal: the estimate is rough
        with open(log, "a") as logf:
            print(f"[launch] warning: {memory}", file=logf)
    expected = estimate.for_trial(spec, reference, runtimes.in_container(env_info))
    started = time.monotonic()
    discarded: list[dict] = []
    attempt = 1
    while True:
        record = with_ceiling(
            attempt_once(spec, env_info, out, log, trial, data_path, attempt), reference
        )
        check = noise_check(record, reference, noise_threshold)
        record["noise_check"] = check
        if not check or check["passed"] is not False or attempt > max_retries:
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
            print(
                f"[launch] attempt {attempt} discarded: {reason}; again in {retry_delay_s:g} s",
                file=logf,
            )
        time.sleep(retry_delay_s)
        attempt += 1
    record["attempts"] = attempt
    record["discarded_attempts"] = discarded
    # how long the trial took here (every attempt, the pauses between them) beside
    # what the study predicted before it ran (one attempt)
    record["trial_wall_s"] = round(time.monotonic() - started, 3)
    record["estimate"] = expected
    record["warnings"] = [memory] if memory else []
    write_json_atomic(out, record)
    return record


def attempt_once(
    spec: dict,
    env_info: dict,
    out: Path,
    log: Path,
    trial: int,
    data_path: str | None,
    attempt: int,
) -> dict:
    """One run of the trial (its ranks' processes): its record, not yet written."""
    runtime = runtimes.for_env(env_info)
    launcher = launchers.get(spec["launcher"])
    container = runtimes.in_container(env_info)
    label = f"{spec['id']}-trial{trial}-{attempt}"
    template, results = result_paths(out, launcher.ranks(spec))
    for path in results:
        path.unlink(missing_ok=True)
    spec_json = json.dumps(spec, sort_keys=True)
    args = harness_args(spec_json, template, _absolute(data_path))
    starter = launchers.starter(launcher, spec, runtime.name)
    cmd = launcher.command(spec, env_info["python"], args, starter=starter)
    env = environment(spec, runtime, starter)
    cache, cache_folder = compile_cache(spec, env, label, container)
    missing = runtime.missing()
    why_not = missing or cannot_start(spec, runtime.name)
    if why_not:
        kind = "ImageMissing" if missing else "NeedsCluster"
        record = failure(spec, trial, kind, why_not)
        record["provenance"] = {**sysinfo.collect(), **runtimes.image_provenance(env_info)}
        record["provenance"].update(runtime=runtime.name, compile_cache=cache)
        return record
    cpus = sysinfo.parse_cpu_list(spec["cpus"]) if spec.get("cpus") else None
    wrapped = runtime.wrap(
        cmd, env, label=f"{spec['id']}-t{trial}-a{attempt}",
        mounts=run_mounts(out, data_path, cache), cpus=cpus,
    )  # fmt: skip
    started = sysinfo.now()
    mark = runtime.oom_mark()
    try:
        finished = runtimes.run_logged(wrapped, log, spec["timeout_s"])
        interrupted(finished, container)
        oom = runtime.oom_killed(wrapped, mark)
    except runtimes.Interrupted:
        for path in results:  # no part of an unfinished trial is ever read
            path.unlink(missing_ok=True)
        raise
    finally:
        runtime.cleanup(wrapped)
        if cache_folder is not None:
            shutil.rmtree(cache_folder, ignore_errors=True)
            cache["removed"] = not cache_folder.exists()
    record = outcome(spec, launcher, results, finished, log, container, oom)
    for path in results:
        path.unlink(missing_ok=True)
    assemble(record, spec, trial, env_info, runtime.name, wrapped.cmd, finished, started)
    record["provenance"]["compile_cache"] = cache
    return record


def cannot_start(spec: dict, runtime: str) -> str | None:
    """Why the ranks of a several-node trial cannot start here (None: they can)."""
    nodes = launchers.nodes(spec)
    if nodes == 1:
        return None
    if not sysinfo.slurm_job():
        return (
            f"nodes {nodes} needs a SLURM job (snakemake --profile profiles/slurm): "
            "outside one there is a single machine"
        )
    if runtime != "local":
        return (
            f"nodes {nodes} runs its ranks with srun in local environments on a shared "
            f"filesystem; runtime {runtime} starts one container per trial on one node "
            "(use runtime: local on the cluster, or nodes: 1)"
        )
    return None


def failure(spec: dict, trial: int, kind: str, message: str, log_tail: str | None = None) -> dict:
    """The record of a trial that produced no result."""
    error = {"type": kind, "message": message}
    if log_tail is not None:
        error["tail"] = log_tail
    return {
        "status": _FAILURE_STATUS.get(kind, "failed"),
        "error": error,
        "metrics": {},
        "schema_version": SCHEMA_VERSION,
        "experiment": spec["id"],
        "trial": trial,
        "spec": spec,
    }


_FAILURE_STATUS = {
    "Timeout": "timeout",
    "Crashed": "crashed",
    "UnreadableResult": "crashed",
    "OutOfMemory": "oom",
}


def killed_by(returncode: int | None, container: bool = False) -> int | None:
    """The signal that ended a run: a negative return code, or a container's 128 + n
    (the engine passes its process's death on that way: 137 = SIGKILL, 139 = SIGSEGV)."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if container and 128 < returncode < 128 + 65:
        return returncode - 128
    return None


def interrupted(finished, container: bool) -> None:
    """A run ended by an interrupting signal (SIGTERM, SIGINT, ...) from outside was
    interrupted, not crashed: raise, so that no record is written."""
    sig = killed_by(finished.returncode, container)
    if sig in runtimes.base.INTERRUPTS and not finished.timed_out:  # (a timeout's own kill)
        raise runtimes.Interrupted(f"the run was interrupted by {runtimes.signal_name(sig)}", sig)


def _how_it_ended(returncode: int | None, container: bool = False) -> str:
    sig = killed_by(returncode, container)
    if sig is not None:
        return f"killed by signal {sig} ({runtimes.signal_name(sig)})"
    return f"exited with code {returncode}"


def outcome(
    spec: dict,
    launcher: launchers.Launcher,
    results: list[Path],
    finished,
    log: Path,
    container: bool = False,
    oom: bool = False,
) -> dict:
    """What the ranks left: the launcher's merge of their results, or why there is none.

    The kernel's out-of-memory killer (seen in the memory cgroup, or by the container
    engine) and an allocation that failed in the run give ``oom``; a run that wrote a
    result and then did not exit cleanly (a crash on exit) is ``crashed``, not ok."""
    how = _how_it_ended(finished.returncode, container)
    if finished.timed_out:
        message = f"killed after the spec's timeout_s={spec['timeout_s']} s"
        return failure(spec, 0, "Timeout", message, tail(log))
    if oom:
        message = f"the kernel's out-of-memory killer ended the run ({how})"
        return failure(spec, 0, "OutOfMemory", message, tail(log))
    try:
        found = [json.loads(p.read_text()) if p.exists() else None for p in results]
    except ValueError as exc:
        return failure(spec, 0, "UnreadableResult", str(exc))
    failed = [(r, res) for r, res in enumerate(found) if res and res.get("status") != "ok"]
    if failed and len(results) > 1:
        # a rank that failed ends the others (the launcher stops them): its error is why
        return _memory(launcher.merge([res if res else {"status": "stopped"} for res in found]))
    if any(res is None for res in found):
        lost = [r for r, res in enumerate(found) if res is None]
        who = f" (rank {', '.join(map(str, lost))})" if len(results) > 1 else ""
        return failure(
            spec, 0, "Crashed", f"the run {how} without writing a result{who}", tail(log)
        )
    try:
        record = _memory(launcher.merge(found))
    except ValueError as exc:
        return failure(spec, 0, "UnreadableResult", str(exc))
    if record.get("status") == "ok" and finished.returncode != 0:
        record["status"] = "crashed"
        record["error"] = {
            "type": "CrashedAfterResult",
            "message": f"the run wrote its result, then {how}",
            "tail": tail(log),
        }
    return record


# an allocation that failed inside the run (torch's allocator, Python's MemoryError)
_MEMORY_ERROR = re.compile(
    r"MemoryError|(can't|cannot|unable to|failed to) allocate|not enough memory|out of memory",
    re.IGNORECASE,
)


def _memory(record: dict) -> dict:
    """A failed run whose error is a failed allocation ran out of memory: ``oom``."""
    error = record.get("error") or {}
    if record.get("status") == "failed" and _MEMORY_ERROR.search(
        f"{error.get('type', '')}: {error.get('message', '')}"
    ):
        record["status"] = "oom"
    return record


def assemble(
    record: dict,
    spec: dict,
    trial: int,
    env_info: dict,
    runtime: str,
    cmd: list[str],
    finished,
    started: str,
) -> dict:
    """Complete a record with what the trial policy knows: the spec, where and how it
    ran, and the process's lifetime as the trial policy saw it."""
    record.setdefault("metrics", {})
    record["schema_version"] = SCHEMA_VERSION
    record["experiment"] = spec["id"]
    record["trial"] = trial
    record["spec"] = spec
    prov = record.get("provenance") or sysinfo.collect()
    prov.setdefault("started_at", started)
    prov.setdefault("finished_at", sysinfo.now())
    prov.update(
        {
            "runtime": runtime,
            "env_name": env_info.get("name"),
            "env_prefix": env_info.get("prefix"),
            "env_lock_sha256": env_info.get("requirements_sha256"),
            **runtimes.image_provenance(env_info),
            "command": cmd,
            "exit_code": finished.returncode,
            "launched_at": finished.launched_at,
            "ended_at": finished.ended_at,
            "process_wall_s": finished.wall_s,
        }
    )
    prov.setdefault("versions", env_info.get("versions", {}))
    prov["slurm"] = sysinfo.slurm_job()  # None outside a SLURM job
    if not prov.get("git_revision"):  # no git in the images: the host's checkout
        prov["git_revision"], prov["git_dirty"] = sysinfo.git_revision(REPO_ROOT)
    record["provenance"] = prov
    return record


# --------------------------------------------------------------------------- output


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


def measured_on(reference: dict) -> str | None:
    """The node type a reference probe was measured on (None: it does not say)."""
    prov = reference.get("provenance") or {}
    return sysinfo.node_type(prov) if prov.get("cpu_model") else None


def node_reference(
    reference: dict | None, path: Path | None, env_info: dict, log: Path, size: int
) -> dict | None:
    """The reference probe of this node's type. The calibration job measured one on the
    node it ran on; a trial on a node of another type (a cluster of several CPU models)
    measures this type's own, once per environment and node type, with the node to
    itself (its job is exclusive), next to the calibration as
    ``<env>.<node type>.json``, and compares with that."""
    if reference is None or path is None or size <= 0:
        return reference
    here = sysinfo.node_type()
    if measured_on(reference) in (None, here):
        return reference  # (a reference that does not say where: taken as this node's)
    own = path.with_name(f"{path.stem}.{re.sub(r'[^A-Za-z0-9._-]+', '_', here)}.json")
    if own.exists():
        return read_reference(own, log)
    from . import calibration

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as logf:
        print(f"[launch] the calibration ran on another node type; measuring this one's "
              f"reference ({here}) into {own}", file=logf)  # fmt: skip
    result = calibration.calibrate(env_info, own, log.with_suffix(".calibration.log"), [size])
    return None if result.get("error") else result


def read_reference(path: Path | None, log: Path | None = None) -> dict | None:
    """The reference probe, or None (with a note in the log) when it cannot be read."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data
    except (OSError, ValueError) as exc:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as logf:
                print(f"[launch] reference probe {path} unusable ({exc}); no noise reruns",
                      file=logf)  # fmt: skip
        return None


# --------------------------------------------------------------------------- entry points


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
         f"--shm-size={settings['containers']['shm_size']}",
         f"--memory={settings['containers'].get('memory') or ''}"]  # fmt: skip


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
    ap.add_argument("--shm-size", default="2g", help="/dev/shm of a container run")
    ap.add_argument("--memory", default="", help="memory limit of a container run (e.g. 8g)")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec_json)
    env_info = json.loads(args.env_json.read_text())
    env_info["shm_size"] = args.shm_size
    env_info["memory"] = args.memory or None
    reference_path = Path(args.reference_probe) if args.reference_probe else None
    try:
        reference = node_reference(
            read_reference(reference_path, args.log), reference_path, env_info, args.log,
            int(spec.get("probe_size") or 0),
        )  # fmt: skip
        record = run(
            spec, env_info, args.out, args.log, args.trial, args.data_path,
            reference=reference, noise_threshold=args.noise_threshold,
            max_retries=args.max_retries, retry_delay_s=args.retry_delay,
        )  # fmt: skip
    except runtimes.Interrupted as exc:
        print(f"[experiment] {spec['id']} trial {args.trial}: {exc}; the run was stopped and "
              "no record written (a rerun repeats it)", file=sys.stderr, flush=True)  # fmt: skip
        return exc.exit_code
    print(progress_line(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
