"""Run one experiment trial in its backend environment and always leave a record.

Runs in the workflow's environment (standard library only). It builds the
command line (plain ``python -m workflow_scripts.harness`` or through
``torch.backends.xeon.run_cpu`` with the spec's allocator and OpenMP runtime),
the environment (threads, PJRT_DEVICE, the spec's extra variables) and the CPU
affinity, runs it with the spec's time limit, and turns whatever happened into
one JSON record: the harness's own result, or a ``crashed``/``timeout`` record
with the tail of the output when the process died without one.

    python -m workflow_scripts.launch --spec-json '{...}' --env-json results/envs/upstream.json \
        --out results/records/<id>/trial0.json --log logs/experiments/<id>/trial0.log [--trial 0]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import sysinfo

REPO_ROOT = Path(__file__).resolve().parent.parent
ENTRY = Path(__file__).resolve().parent / "run_trial.py"
SCHEMA_VERSION = 1


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


def environment(spec: dict, env_info: dict, base: dict | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    prefix = env_info["prefix"]
    env["VIRTUAL_ENV"] = prefix  # run_cpu looks for allocator/OpenMP libraries in $VIRTUAL_ENV/lib
    env["PATH"] = f"{prefix}/bin:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONHOME", None)
    for key in ("LD_PRELOAD", "OMP_NUM_THREADS", "MALLOC_CONF", "KMP_AFFINITY", "KMP_BLOCKTIME"):
        env.pop(key, None)  # only what the spec (or its launcher) asks for
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


def launch(
    spec: dict,
    env_info: dict,
    out: Path,
    log: Path,
    trial: int = 0,
    image_folder: str | None = None,
    runtime: str = "local",
) -> dict:
    out.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    result_path = out.with_name(out.stem + ".harness.json")
    result_path.unlink(missing_ok=True)
    cmd = command(spec, env_info["python"], result_path, image_folder)
    env = environment(spec, env_info)
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
            "image_digest": env_info.get("image_digest"),
            "command": cmd,
            "exit_code": returncode,
            "launched_at": launched_at,  # the trial's process lifetime, as the launcher saw it
            "ended_at": sysinfo.now("microseconds"),
            "process_wall_s": wall,
        }
    )
    prov.setdefault("versions", env_info.get("versions", {}))
    record["provenance"] = prov
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    os.replace(tmp, out)
    result_path.unlink(missing_ok=True)
    return record


def progress_line(record: dict) -> str:
    head = f"[experiment] {record['experiment']} trial {record.get('trial', 0)}:"
    if record["status"] == "ok":
        m = record["metrics"]
        return (
            f"{head} ok {m['samples_per_s']:.2f} samples/s "
            f"(step median {m['step_time_s']['median']:.3f} s, first step "
            f"{m['time_to_first_step_s']:.2f} s, peak RSS {m['peak_rss_mb']:.0f} MB)"
        )
    err = record.get("error") or {}
    return f"{head} {record['status']} {err.get('type', '')}: {err.get('message', '')}"[:400]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one experiment trial; always write its record.")
    ap.add_argument("--spec-json", required=True)
    ap.add_argument("--env-json", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--log", required=True, type=Path)
    ap.add_argument("--trial", type=int, default=0)
    ap.add_argument("--image-folder", default=None)
    ap.add_argument("--runtime", default="local")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec_json)
    env_info = json.loads(args.env_json.read_text())
    record = launch(spec, env_info, args.out, args.log, args.trial, args.image_folder, args.runtime)
    print(progress_line(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
