"""The calibration of a backend environment, measured once with the machine to itself
(``probe --calibrate``), in the environment (or image) its trials run in, with the
environment's backend modules imported, as in its trials: the reference noise probe
(what a quiet probe reads) and the machine's dense matmul ceiling per dtype and thread
count (the best of the ``--ceiling-sizes``: what a run's % of peak divides by).

    python -m workflow_scripts.calibration --env-json results/envs/upstream.json \\
        --out results/calibration/upstream.json --log logs/calibration/upstream.log \\
        --sizes 1024 --threads auto --ceiling-sizes 1024,2048,4096
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from . import backends, runtimes, sysinfo
from .commands import Arg, Command
from .rank import probe
from .runtimes.measured import ENV_JSON, LIMIT_ARGS, Process, run_measured, with_limits
from .util import finite, int_list, read_json, tail, write_json_atomic

TIMEOUT_S = 1800


def calibrate(
    env_info: dict,
    out: Path,
    log: Path,
    sizes: list[int],
    threads: str = "auto",
    repeats: int = 3,
    ceiling_sizes: tuple[int, ...] = probe.CEILING_SIZES,
) -> dict:
    """Measure and write the reference probe; a failed measurement writes a reference
    without entries (the trials then run without noise reruns)."""
    env_name = env_info.get("env") or env_info.get("name")  # image record / local env
    out.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.probe").resolve()
    cmd = [
        env_info["python"], "-u", "-m", "workflow_scripts.rank.probe", "--calibrate",
        "--sizes", ",".join(map(str, sizes)), "--threads", threads,
        "--repeats", str(repeats), "--out", str(partial),
        "--ceiling-sizes", ",".join(map(str, ceiling_sizes)),
        "--imports", ",".join(backends.env_imports(env_name)),
    ]  # fmt: skip
    runtime = runtimes.for_env(env_info)
    try:
        process = Process(cmd, runtime.environment(), "calibrate",
                          mounts=[(str(out.parent.resolve()), "rw")])  # fmt: skip
        ran = run_measured(runtime, process, log=log, timeout_s=TIMEOUT_S, results=[partial])
        problem = ran.problem()
        if problem:
            raise RuntimeError(f"the probe: {problem[1]}")
        if not ran.clean:
            raise RuntimeError(f"the probe {ran.how}")
        if ran.results[0] is None:
            raise RuntimeError("the probe wrote no result")
        result = ran.results[0]
        # what starting a process costs here (interpreter, torch, the backend's imports,
        # a container's start): the part of the job's wall time before the measurements
        result["process_wall_s"] = ran.finished.wall_s
        # (the torch._dynamo import is measured apart: a trial pays it in its setup)
        measured = float(result.get("seconds") or 0.0) + float(result.get("dynamo_import_s") or 0.0)
        result["startup_s"] = max(0.0, ran.finished.wall_s - measured)
        warm = warm_start_s(env_info, runtime, log)
        if warm is not None:
            result["warm_startup_s"] = warm
    except (OSError, ValueError, RuntimeError) as exc:
        result = {
            "kind": "calibration",
            "entries": [],
            "error": {"type": type(exc).__name__, "message": str(exc)[:2000], "tail": tail(log)},
        }
    result["env_name"] = env_info.get("name")
    result["env_lock_sha256"] = env_info.get("requirements_sha256")
    result["provenance"] = {
        **sysinfo.collect(),
        **runtimes.image_provenance(env_info),
    }
    write_json_atomic(out, result)
    return result


def warm_start_s(env_info: dict, runtime, log: Path) -> float | None:
    """The wall time of a second start of the environment's interpreter (its container's
    too) importing torch and the backend's modules, right after the probe's: what a
    trial's process pays to start. The probe's own start is the first in this
    environment, its files not yet in the page cache (an IPEX image's 11.4 s in the
    quick preset's calibration, where its trials then ran whole in 6 s). None where it
    did not run cleanly."""
    env_name = env_info.get("env") or env_info.get("name")
    modules = ["torch", *backends.env_imports(env_name)]
    process = Process(
        [env_info["python"], "-c", "import " + ", ".join(modules)],
        runtime.environment(),
        "calibrate-start",
    )
    try:  # (a start that fails here costs the estimate a figure, never the calibration)
        ran = run_measured(runtime, process, log=log, timeout_s=TIMEOUT_S, results=[])
    except (OSError, ValueError, RuntimeError):
        return None
    if ran.problem() or not ran.clean or not finite(ran.finished.wall_s):
        return None
    return float(ran.finished.wall_s)


#: The calibrate rule's entry point. The probe sizes and the container limits come in
#: the settings, not in params: editing an experiment must not rerun the calibration.
COMMAND = Command(
    "Measure the reference noise probe.",
    (
        ENV_JSON,
        Arg("out", "output.probe", type=Path),
        Arg("log", "log", type=Path),
        Arg("sizes", lambda job: ",".join(map(str, job.settings["probe_sizes"])),
            default=str(probe.DEFAULT_SIZE), help="comma list of probe sizes"),
        Arg("threads", "params.threads", default="auto",
            help="auto (1, 2, 4, ... all CPUs) or a comma list (0 = all)"),
        Arg("repeats", "params.repeats", type=int, default=3),
        Arg("ceiling_sizes", "params.ceiling_sizes",
            default=",".join(map(str, probe.CEILING_SIZES)),
            help="comma list of matmul sizes for the ceiling (the best of them)"),
        *LIMIT_ARGS,
    ),
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = COMMAND.parse(argv, prog="python -m workflow_scripts.calibration")
    env_info = with_limits(read_json(args.env_json, want=None), args)
    sizes = int_list(args.sizes) or [probe.DEFAULT_SIZE]
    try:
        result = calibrate(
            env_info, args.out, args.log, sizes, args.threads, args.repeats,
            tuple(int_list(args.ceiling_sizes)),
        )  # fmt: skip
    except runtimes.Interrupted as exc:
        print(f"[calibrate] {exc}; no reference written", file=sys.stderr, flush=True)
        return exc.exit_code
    if result.get("error"):
        print(f"[calibrate] no reference probe: {result['error']['message']}", flush=True)
        return 0
    print(
        f"[calibrate] reference probe: fp32 {result.get('fp32_gflops') or math.nan:.1f} GFLOP/s, "
        f"bf16 {result.get('bf16_gflops') or math.nan:.1f} GFLOP/s "
        f"(size {result.get('size')}, {result.get('threads')} threads)",
        flush=True,
    )
    for c in result.get("ceiling") or []:
        emulated = " (emulated)" if (c.get("emulated") or {}).get("bf16") else ""
        print(
            f"[calibrate] matmul ceiling, {c.get('threads')} threads: "
            f"fp32 {c.get('fp32_gflops') or math.nan:.1f} GFLOP/s (size {c.get('fp32_size')}), "
            f"bf16 {c.get('bf16_gflops') or math.nan:.2f} GFLOP/s (size {c.get('bf16_size')})"
            f"{emulated}",
            flush=True,
        )
        for dtype, notes in (c.get("skipped") or {}).items():
            for size, note in notes.items():
                print(f"[calibrate]   {dtype} {size}: {note}", flush=True)
        for dtype, rates in (c.get("from_probes") or {}).items():
            for size, rate in rates.items():
                print(f"[calibrate]   {dtype} {size}: {rate:.1f} GFLOP/s, a reference probe's "
                      "(faster than the search there)", flush=True)  # fmt: skip
    print(
        f"[calibrate] {result.get('process_wall_s') or math.nan:.1f} s in all, of which "
        f"{result.get('startup_s') or math.nan:.1f} s starting the process",
        flush=True,
    )
    return 0


# ---- reading a calibration back (the trials' reference, the estimate) ----

#: a calibration's fields that hold lists of measurements, and those that hold mappings
#: (where they hold them: at the top or in a row of a list; deeper, the same name may
#: hold a number or a note, e.g. ``ceiling[].conv.fp32.pilot``, a pilot's GFLOP/s)
_LISTS = {"entries", "ceiling"}
_MAPPINGS = {
    "provenance",
    "train_proxy",
    "text_proxy",
    "sizes",
    "skipped",
    "emulated",
    "pilot",
    "notes",
    "from_probes",
}
_MAPPINGS_AT = ("", "entries[]", "ceiling[]")
_NUMBERS = {"size", "threads", "repeats", "default_threads"}
_NUMBER_SUFFIXES = ("_gflops", "_s", "_size", "_over_fp32")


def _clean(value: Any, where: str, dropped: list[str]) -> Any:
    """``value`` (a calibration, or part of one) without the fields whose type is not
    the one their name stands for (numbers, lists of mappings, mappings)."""
    if isinstance(value, list):
        return [_clean(v, f"{where}[]", dropped) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        at = f"{where}.{key}" if where else str(key)
        if key in _LISTS:
            if not isinstance(item, list):
                dropped.append(at)
                continue
            kept = [v for v in item if isinstance(v, dict)]
            if len(kept) < len(item):
                dropped.append(f"{at}[] (not mappings)")
            item = kept
        elif key in _MAPPINGS and where in _MAPPINGS_AT and not isinstance(item, dict | None):
            dropped.append(at)
            continue
        elif (key in _NUMBERS or key.endswith(_NUMBER_SUFFIXES)) and not (
            item is None or finite(item)
        ):
            dropped.append(at)
            continue
        out[key] = _clean(item, at, dropped)
    return out


def clean_calibration(data: dict) -> tuple[dict, list[str]]:
    """A calibration as its readers may use it, and the fields left out because their
    type was wrong (a hand edit, another version): a field a reader needs and cannot
    find means no judgement from it (no noise rerun, no ceiling), never a crash."""
    dropped: list[str] = []
    return _clean(data, "", dropped), dropped


if __name__ == "__main__":
    sys.exit(main())
