"""Run one experiment trial in its backend environment and always leave a record.

Runs in the workflow's environment (standard library only). It builds the
command line (plain ``python -m workflow_scripts.harness`` or through
``torch.backends.xeon.run_cpu`` with the spec's allocator and OpenMP runtime),
the environment (threads, PJRT_DEVICE, the spec's extra variables) and the CPU
affinity, runs it with the spec's time limit, and turns whatever happened into
one JSON record: the harness's own result, or a ``crashed``/``timeout`` record
with the tail of the output when the process died without one.

Noise: given a reference probe (``--reference-probe``, the calibration the
workflow measures once), a trial whose own probe ran below ``--noise-threshold``
times the reference's fp32 rate was disturbed; it is run again after a pause, at
most ``--max-retries`` times. The discarded attempts' probes stay in the record
(``discarded_attempts``), with ``attempts`` and the last check (``noise_check``).

Compile caches: each attempt gets a fresh, empty TorchInductor/Triton cache in a
temporary folder, removed afterwards, so a compiled run always pays (and
reports) its full compile cost; ``warm_compile_cache: true`` keeps the default
cache instead. Which one was used: ``provenance.compile_cache``.

    python -m workflow_scripts.launch --spec-json '{...}' --env-json results/envs/upstream.json \
        --out results/records/<id>/trial0.json --log logs/experiments/<id>/trial0.log [--trial 0] \
        [--reference-probe results/calibration/upstream.json --max-retries 2 --noise-threshold 0.85]
    python -m workflow_scripts.launch calibrate --env-json results/envs/upstream.json \
        --out results/calibration/upstream.json --log logs/calibration/upstream.log \
        --sizes 1024 --threads auto
"""

from __future__ import annotations

import argparse
import getpass
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import images, probe, sysinfo

REPO_ROOT = Path(__file__).resolve().parent.parent
ENTRY = Path(__file__).resolve().parent / "run_trial.py"
SCHEMA_VERSION = 1
NOISE_THRESHOLD = 0.85
MAX_RETRIES = 2
RETRY_DELAY_S = 5.0


def run_cpu_args(spec: dict) -> list[str]:
    """Arguments for torch.backends.xeon.run_cpu matching the spec."""
    args = {
        "default": ["--use-default-allocator"],
        "jemalloc": ["--enable-jemalloc"],
        "tcmalloc": ["--enable-tcmalloc"],
    }[spec["allocator"]]
    if spec["openmp"] != "intel":
        args.append("--disable-iomp")
    if spec.get("threads"):
        # "=" form: the option takes several values and would swallow the program path
        args.append(f"--ncores-per-instance={spec['threads']}")
    if spec.get("cpus"):
        args.append("--core-list=" + ",".join(map(str, sysinfo.parse_cpu_list(spec["cpus"]))))
    return args


def command(spec: dict, python: str, result_path: Path, image_folder: str | None) -> list[str]:
    harness_args = ["--spec-json", json.dumps(spec, sort_keys=True), "--out", str(result_path)]
    if image_folder:
        harness_args += ["--image-folder", str(image_folder)]
    if spec["launcher"] == "run_cpu":
        return [
            python, "-u", "-m", "torch.backends.xeon.run_cpu", *run_cpu_args(spec),
            str(ENTRY), *harness_args,
        ]  # fmt: skip
    return [python, "-u", str(ENTRY), *harness_args]


def base_environment(env_info: dict, base: dict | None = None) -> dict[str, str]:
    """The backend environment's variables, without any tuning the spec did not ask for."""
    env = dict(os.environ if base is None else base)
    prefix = env_info["prefix"]
    env["VIRTUAL_ENV"] = prefix  # run_cpu looks for allocator/OpenMP libraries in $VIRTUAL_ENV/lib
    env["PATH"] = f"{prefix}/bin:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONHOME", None)
    for key in ("LD_PRELOAD", "OMP_NUM_THREADS", "MALLOC_CONF", "KMP_AFFINITY", "KMP_BLOCKTIME"):
        env.pop(key, None)  # only what the spec (or its launcher) asks for
    return env


def container_base_environment(env_info: dict) -> dict[str, str]:
    """A container run's variables: the image's environment, nothing from the host."""
    prefix = env_info["prefix"]
    return {
        "VIRTUAL_ENV": prefix,
        "PATH": f"{prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
        "HOME": "/tmp",  # a writable home for any uid (runs use the invoking user's)
    }


def in_container(env_info: dict) -> bool:
    """An image record (results/images/<image>.json) rather than a local environment."""
    return bool(env_info.get("image_id") and env_info.get("engine"))


def environment(spec: dict, env_info: dict, base: dict | None = None) -> dict[str, str]:
    if in_container(env_info):
        env = container_base_environment(env_info)
    else:
        env = base_environment(env_info, base)
    if spec.get("threads"):
        env["OMP_NUM_THREADS"] = str(spec["threads"])
    if spec["backend"] == "xla":
        env["PJRT_DEVICE"] = "CPU"
    env.update({str(k): str(v) for k, v in (spec.get("env_vars") or {}).items()})
    return env


def _tail(path: Path, limit: int = 6000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


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


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def noise_check(record: dict, reference: dict | None, threshold: float) -> dict | None:
    """Compare an ok record's fp32 probe with the reference; None when there is nothing
    to compare (no reference, a failed run, no probe)."""
    if reference is None or record.get("status") != "ok":
        return None
    result = record.get("probe")
    rate = result.get("fp32_gflops") if isinstance(result, dict) else None
    if not _finite(rate):
        return None
    ref, how = probe.reference_rate(reference, result.get("size"), result.get("threads"))
    check = {"threshold": threshold, "fp32_gflops": rate, "reference": how}
    if ref is None or ref <= 0:
        return {**check, "reference_fp32_gflops": None, "ratio": None, "passed": None}
    ratio = rate / ref
    return {**check, "reference_fp32_gflops": ref, "ratio": ratio, "passed": ratio >= threshold}


def noise_reason(check: dict) -> str:
    return (
        f"probe fp32 {check['fp32_gflops']:.1f} GFLOP/s = {check['ratio']:.2f} x the reference "
        f"{check['reference_fp32_gflops']:.1f} GFLOP/s ({check['reference']}), "
        f"below the threshold {check['threshold']:g}"
    )


def launch(
    spec: dict,
    env_info: dict,
    out: Path,
    log: Path,
    trial: int = 0,
    image_folder: str | None = None,
    runtime: str = "local",
    reference: dict | None = None,
    noise_threshold: float = NOISE_THRESHOLD,
    max_retries: int = MAX_RETRIES,
    retry_delay_s: float = RETRY_DELAY_S,
) -> dict:
    """Run the trial (again, while its probe says it was disturbed) and write its record."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    discarded: list[dict] = []
    attempt = 1
    while True:
        record = _attempt(spec, env_info, out, log, trial, image_folder, runtime, attempt)
        check = noise_check(record, reference, noise_threshold)
        record["noise_check"] = check
        if not check or check["passed"] is not False or attempt > max_retries:
            break
        reason = noise_reason(check)
        discarded.append(
            {
                "attempt": attempt,
                "reason": reason,
                "probe": record.get("probe"),
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
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    os.replace(tmp, out)
    return record


def _attempt(
    spec: dict,
    env_info: dict,
    out: Path,
    log: Path,
    trial: int,
    image_folder: str | None,
    runtime: str,
    attempt: int,
) -> dict:
    """One run of the trial in its own process: its record (not yet written)."""
    result_path = out.with_name(out.stem + ".harness.json").resolve()
    result_path.unlink(missing_ok=True)
    container = in_container(env_info)
    cmd = command(spec, env_info["python"], result_path, _absolute(image_folder))
    env = environment(spec, env_info)
    cache, cache_folder = compile_cache(
        spec, env, f"{spec['id']}-trial{trial}-{attempt}", container
    )
    name = None
    if container:
        if not images.image_present(env_info):
            return _image_missing(spec, env_info, trial, runtime, cache)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"study-{spec['id']}-t{trial}-a{attempt}")
        name += f"-{os.getpid()}"
        mounts = run_mounts(out, image_folder, cache)
        cpus = sysinfo.parse_cpu_list(spec["cpus"]) if spec.get("cpus") else None
        cmd = images.run_prefix(
            env_info, name, mounts, env, cpus=cpus, shm_size=env_info.get("shm_size", "2g"),
            workdir=str(REPO_ROOT),
        ) + cmd  # fmt: skip
        env = images.engine_env(env_info.get("engine_conf"))
    try:
        record = _run(spec, env_info, cmd, env, result_path, log, trial, runtime)
    finally:
        if name is not None:
            images.remove_container(env_info, name)
        if cache_folder is not None:
            shutil.rmtree(cache_folder, ignore_errors=True)
            cache["removed"] = not cache_folder.exists()
    record["provenance"]["compile_cache"] = cache
    return record


def _absolute(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def run_mounts(out: Path, image_folder: str | None, cache: dict) -> list[tuple[str, str]]:
    """What a container run sees of the host, each at its own path: the sources
    read-only, the record's folder writable, the image folder read-only, and a warm
    compile cache if the spec keeps one."""
    mounts = [(str(REPO_ROOT), "ro"), (str(out.parent.resolve()), "rw")]
    if image_folder:
        mounts.append((_absolute(image_folder), "ro"))
    if not cache["fresh"]:
        Path(cache["dir"]).mkdir(parents=True, exist_ok=True)
        mounts.append((cache["dir"], "rw"))
    return mounts


def _image_missing(spec: dict, env_info: dict, trial: int, runtime: str, cache: dict) -> dict:
    """The failure record of a run whose image is no longer in the engine's storage."""
    record = {
        "status": "failed",
        "error": {
            "type": "ImageMissing",
            "message": (
                f"image {env_info.get('image')} ({env_info['image_id']}) is not in "
                f"{env_info['engine']}'s storage; rebuild it: snakemake -R build_image "
                f"--until results/images/{env_info.get('image')}.json"
            ),
        },
        "metrics": {},
        "schema_version": SCHEMA_VERSION,
        "experiment": spec["id"],
        "trial": trial,
        "spec": spec,
        "provenance": {**sysinfo.collect(), **_image_provenance(env_info), "runtime": runtime},
    }
    record["provenance"]["compile_cache"] = cache
    return record


def _image_provenance(env_info: dict) -> dict:
    return {
        "image": env_info.get("image"),
        "image_id": env_info.get("image_id"),
        "image_digest": env_info.get("image_digest"),
    }


def _run(
    spec: dict,
    env_info: dict,
    cmd: list[str],
    env: dict[str, str],
    result_path: Path,
    log: Path,
    trial: int,
    runtime: str,
) -> dict:
    started = sysinfo.now()
    launched_at = sysinfo.now("microseconds")
    t0 = time.perf_counter()
    status_override = None
    with open(log, "ab") as logf:
        logf.write(f"$ {' '.join(cmd)}\n".encode())
        logf.flush()
        proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
            start_new_session=True,  # its own process group: a timeout kills every child
        )  # fmt: skip
        try:
            returncode = proc.wait(timeout=spec["timeout_s"])
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            returncode = proc.returncode
            status_override = "timeout"
        finally:
            if proc.poll() is None:
                _kill_group(proc)
    wall = time.perf_counter() - t0

    record: dict
    if result_path.exists() and status_override is None:
        try:
            record = json.loads(result_path.read_text())
        except ValueError as exc:
            record = {
                "status": "crashed",
                "error": {"type": "UnreadableResult", "message": str(exc)},
            }
    else:
        record = {}
    if status_override == "timeout":
        record = {
            "status": "timeout",
            "error": {
                "type": "Timeout",
                "message": f"killed after the spec's timeout_s={spec['timeout_s']} s",
                "tail": _tail(log),
            },
        }
    elif not record:
        how = (
            f"killed by signal {-returncode} ({signal.Signals(-returncode).name})"
            if returncode < 0
            else f"exited with code {returncode}"
        )
        record = {
            "status": "crashed",
            "error": {
                "type": "Crashed",
                "message": f"the run {how} without writing a result",
                "tail": _tail(log),
            },
        }
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
            **_image_provenance(env_info),
            "command": cmd,
            "exit_code": returncode,
            "launched_at": launched_at,  # the trial's process lifetime, as the launcher saw it
            "ended_at": sysinfo.now("microseconds"),
            "process_wall_s": wall,
        }
    )
    prov.setdefault("versions", env_info.get("versions", {}))
    if not prov.get("git_revision"):  # no git in the images: the host's checkout
        prov["git_revision"], prov["git_dirty"] = sysinfo.git_revision(REPO_ROOT)
    record["provenance"] = prov
    result_path.unlink(missing_ok=True)
    return record


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
        if _finite(p.get("fp32_gflops")):
            line += f", probe {p['fp32_gflops']:.0f} GFLOP/s fp32"
        if _finite(m.get("pct_of_peak")):
            line += f", {m['pct_of_peak']:.0f}% of the {m.get('peak_dtype', '')} probe"
        line += ")"
        discarded = record.get("discarded_attempts") or []
        if discarded:
            line += f" [attempt {record.get('attempts')}: {len(discarded)} discarded as noisy]"
        check = record.get("noise_check") or {}
        if check.get("passed") is False:
            line += " [still below the noise threshold]"
        return line
    err = record.get("error") or {}
    return f"{head} {record['status']} {err.get('type', '')}: {err.get('message', '')}"[:400]


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


def calibrate(
    env_info: dict, out: Path, log: Path, sizes: list[int], threads: str = "auto", repeats: int = 3
) -> dict:
    """Measure the reference probe in a backend environment (``probe --calibrate``),
    with the environment's backend module imported, as in its trials."""
    env_name = env_info.get("env") or env_info.get("name")  # image record / local env
    out.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        env_info["python"], "-u", "-m", "workflow_scripts.probe", "--calibrate",
        "--sizes", ",".join(map(str, sizes)), "--threads", threads,
        "--repeats", str(repeats), "--out", str(out.resolve()),
        "--imports", ",".join(probe.ENV_IMPORTS.get(env_name, [])),
    ]  # fmt: skip
    env = base_environment(env_info)
    name = None
    if in_container(env_info):
        name = f"study-calibrate-{os.getpid()}"
        mounts = [(str(REPO_ROOT), "ro"), (str(out.parent.resolve()), "rw")]
        cmd = images.run_prefix(
            env_info, name, mounts, container_base_environment(env_info),
            shm_size=env_info.get("shm_size", "2g"), workdir=str(REPO_ROOT),
        ) + cmd  # fmt: skip
        env = images.engine_env(env_info.get("engine_conf"))
    out.unlink(missing_ok=True)
    try:
        with open(log, "ab") as logf:
            logf.write(f"$ {' '.join(cmd)}\n".encode())
            logf.flush()
            subprocess.run(
                cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, check=True,
                timeout=1800,
            )  # fmt: skip
        result = json.loads(out.read_text())
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        # No reference: the experiments still run, only without noise reruns.
        result = {
            "kind": "calibration",
            "entries": [],
            "error": {"type": type(exc).__name__, "message": str(exc)[:2000], "tail": _tail(log)},
        }
    finally:
        if name is not None:
            images.remove_container(env_info, name)
    result["env_name"] = env_info.get("name")
    result["env_lock_sha256"] = env_info.get("requirements_sha256")
    result["provenance"] = {**sysinfo.collect(), **_image_provenance(env_info)}
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def calibrate_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="Measure the reference noise probe.")
    ap.add_argument("--env-json", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--log", required=True, type=Path)
    ap.add_argument("--sizes", default=str(probe.DEFAULT_SIZE), help="comma list of probe sizes")
    ap.add_argument(
        "--threads", default="auto", help="auto (1, 2, 4, ... all CPUs) or a comma list (0 = all)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    env_info = json.loads(args.env_json.read_text())
    sizes = _int_list(args.sizes) or [probe.DEFAULT_SIZE]
    result = calibrate(env_info, args.out, args.log, sizes, args.threads, args.repeats)
    if result.get("error"):
        print(f"[calibrate] no reference probe: {result['error']['message']}", flush=True)
        return 0
    print(
        f"[calibrate] reference probe: fp32 {result.get('fp32_gflops') or math.nan:.1f} GFLOP/s, "
        f"bf16 {result.get('bf16_gflops') or math.nan:.1f} GFLOP/s "
        f"(size {result.get('size')}, {result.get('threads')} threads)",
        flush=True,
    )
    return 0


def calibrate_rule(inputs, output, params, log, sizes: list[int]) -> int:
    """The calibrate rule's call, with Snakemake's objects. The probe sizes are not
    params: editing an experiment must not rerun the calibration."""
    env_json = inputs.get("image") or inputs.get("env")
    return calibrate_main(
        [f"--env-json={env_json}", f"--out={output.probe}", f"--log={log[0]}",
         f"--sizes={','.join(map(str, sizes))}", f"--threads={params.threads}",
         f"--repeats={params.repeats}"]
    )  # fmt: skip


def run_rule(inputs, output, params, wildcards, log, settings: dict) -> int:
    """The run_experiment rule's call, with Snakemake's objects. The noise settings come
    from the study settings, not from params: changing them reruns no experiment."""
    env_json = inputs.get("image") or inputs.get("env")
    return main(
        [f"--spec-json={params.spec}", f"--env-json={env_json}", f"--out={output.record}",
         f"--log={log[0]}", f"--trial={wildcards.trial}", f"--image-folder={params.image_folder}",
         f"--runtime={params.runtime}", f"--reference-probe={inputs.get('reference_probe', '')}",
         f"--max-retries={settings['noise_retries']}",
         f"--noise-threshold={settings['noise_threshold']}",
         f"--shm-size={settings['containers']['shm_size']}"]
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["calibrate"]:
        return calibrate_main(argv[1:])
    ap = argparse.ArgumentParser(description="Run one experiment trial; always write its record.")
    ap.add_argument("--spec-json", required=True)
    ap.add_argument("--env-json", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--log", required=True, type=Path)
    ap.add_argument("--trial", type=int, default=0)
    ap.add_argument("--image-folder", default=None)
    ap.add_argument("--runtime", default="local")
    ap.add_argument("--reference-probe", default="", help="reference probe JSON; none: no reruns")
    ap.add_argument("--max-retries", type=int, default=MAX_RETRIES, help="noisy reruns at most")
    ap.add_argument("--noise-threshold", type=float, default=NOISE_THRESHOLD)
    ap.add_argument("--retry-delay", type=float, default=RETRY_DELAY_S, help="seconds")
    ap.add_argument("--shm-size", default="2g", help="/dev/shm of a container run")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec_json)
    env_info = json.loads(args.env_json.read_text())
    env_info["shm_size"] = args.shm_size
    reference = read_reference(
        Path(args.reference_probe) if args.reference_probe else None, args.log
    )
    record = launch(
        spec, env_info, args.out, args.log, args.trial, args.image_folder, args.runtime,
        reference=reference, noise_threshold=args.noise_threshold,
        max_retries=args.max_retries, retry_delay_s=args.retry_delay,
    )  # fmt: skip
    print(progress_line(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
