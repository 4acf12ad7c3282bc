"""The checks of a study that depend on the machine its experiments run on: CPUs,
memory and files. Made before any job, on the machine that runs the jobs (local and
container runtimes: this one); each problem names the experiment, the field, the
value and what this machine has."""

from __future__ import annotations

import math
import os
from pathlib import Path

from .. import workloads
from ..summary.machine_results import TooBig, result_files
from ..sysinfo import cpu_list_str, parse_cpu_list, plan_cpus
from .causes import given_fields, one_per_cause
from .config import Study, StudyConfigError
from .paths import folder_problem
from .schema import err

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}

MEMORY_WARN_FRACTION = 0.8


def input_size(spec: dict) -> str:
    """The spec's input size in words: ``224 px`` or ``128 tokens``."""
    if spec.get("seq_len"):
        return f"{spec['seq_len']} tokens"
    return f"{spec['image_size']} px"


def total_memory_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


#: entries a count of a data folder's images looks at, at most
COUNT_MAX_ENTRIES = 2_000_000


def count_images(folder: Path, enough: int | None = None) -> int:
    """The images under ``folder`` (links not followed), counted until ``enough`` (what
    the check needs: the largest batch) and over at most :data:`COUNT_MAX_ENTRIES`
    entries (ValueError beyond)."""
    n = seen = 0
    stack = [folder]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                seen += 1
                if seen > COUNT_MAX_ENTRIES:
                    raise ValueError(
                        f"more than {COUNT_MAX_ENTRIES} entries, {n} images among them"
                    )
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif Path(entry.name).suffix.lower() in IMAGE_SUFFIXES:
                    n += 1
                    if enough is not None and n >= enough:
                        return n
    return n


def memory_warning(spec: dict, memory: float | None, where: str = "this machine has") -> str | None:
    """``<experiment>.batch_size: ...`` when the rough estimate of the run's memory is
    near or beyond ``memory`` (MB, this machine's, or ``where``: a cluster node's);
    checked before any job, and again by each trial on the machine that runs it."""
    need = workloads.estimated_memory_mb(spec)
    if not memory or need <= MEMORY_WARN_FRACTION * memory:
        return None
    return (
        f"experiment {spec['id']}.batch_size: batch {spec['batch_size']} of "
        f"{spec['model']} at {input_size(spec)} needs roughly "
        f"{math.ceil(need / 1024)} GB (a rough estimate); {where} "
        f"{memory / 1024:.0f} GB: the run may be killed for memory"
    )


def cpu_problems(spec: dict, allowed: list[int]) -> list[str]:
    """What the CPUs this process may use (``allowed``) cannot give the experiment:
    its threads, its ranks' core blocks, its CPU list. Checked before any job, and again
    by each trial on the machine that runs it (a cluster node may differ)."""
    errors: list[str] = []
    at = f"experiment {spec['id']}"
    threads = spec["threads"]
    if threads and threads > len(allowed):
        errors.append(
            err(
                f"{at}.threads",
                f"{threads} is more than the {len(allowed)} CPUs this machine lets the "
                f"study use (affinity {cpu_list_str(allowed)})",
            )
        )
    n_ranks = spec["ranks"]
    if n_ranks > 1:
        pool = parse_cpu_list(spec["cpus"]) if spec["cpus"] else allowed
        need = n_ranks * (threads or 1)
        if need > len(pool):
            where = f"cpus {spec['cpus']!r}" if spec["cpus"] else "this machine"
            errors.append(
                err(
                    f"{at}.ranks",
                    f"{n_ranks} ranks x {threads or 1} thread(s) need {need} CPUs, one "
                    f"rank per core block, but {where} has {len(pool)} "
                    f"({cpu_list_str(pool)})",
                )
            )
    if spec["cpus"]:
        cpus = parse_cpu_list(spec["cpus"])
        outside = [c for c in cpus if c not in allowed]
        if outside:
            errors.append(
                err(
                    f"{at}.cpus",
                    f"{spec['cpus']!r} names CPUs {cpu_list_str(outside)} that this machine "
                    f"does not let the study use (allowed: {cpu_list_str(allowed)})",
                )
            )
        elif threads and threads > len(cpus):
            errors.append(
                err(
                    f"{at}.threads",
                    f"{threads} threads on the {len(cpus)} CPUs of cpus {spec['cpus']!r} "
                    "would oversubscribe them",
                )
            )
    return errors


#: DataLoader workers per CPU beyond which an experiment is refused
WORKERS_PER_CPU = 4


def settings_ceilings(study: Study, memory: float | None) -> list[str]:
    """What the study's settings would ask of this machine beyond what it has: the
    generated image folder's disk space (its uncompressed size, an upper bound) and the
    allreduce benchmark's largest message on every rank (three buffers each)."""
    import shutil

    errors = []
    folder = study.settings["image_folder"]
    images = folder["classes"] * folder["images_per_class"]
    need = images * folder["size"] ** 2 * 3
    where = study.path(study.results)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    uses_folder = any(s["data"] == "image_folder" and not s["data_dir"] for s in study.experiments)
    if uses_folder and need > free:
        errors.append(
            err(
                "image_folder",
                f"{images} images of {folder['size']} px need up to {need / 2**30:.1f} GiB; "
                f"{where} has {free / 2**30:.1f} GiB free",
            )
        )
    c = study.settings["collectives"]
    if c["variants"] and memory:
        counts = c["ranks"] if isinstance(c["ranks"], list) else [c["ranks"]]
        ranks = max(len(plan_cpus()) if n == "all" else n for n in counts)
        need_mb = max(c["sizes_kb"], default=0) / 1024 * 3 * ranks / max(c["nodes"], 1)
        if need_mb > memory:
            errors.append(
                err(
                    "collectives.sizes_kb",
                    f"{max(c['sizes_kb'])} KiB on each of {ranks} ranks needs about "
                    f"{need_mb / 1024:.0f} GB; a node has {memory / 1024:.0f} GB",
                )
            )
    return errors


def path_problems(study: Study) -> list[str]:
    """The folders the study builds in, each a folder that is or can be made and written
    (:func:`.paths.folder_problem`): ``envs_root``, ``containers.wheelhouse`` and
    ``containers.archive``."""
    settings, containers = study.settings, study.settings["containers"]
    folders = {
        "envs_root": settings["envs_root"],
        "containers.wheelhouse": containers["wheelhouse"],
        "containers.archive": containers["archive"],
    }
    errors = []
    for where, value in folders.items():
        if value:
            problem = folder_problem(study.path(value), write=True, create=True)
            if problem:
                errors.append(err(where, problem))
    return errors


def check_machine(study: Study, memory_mb: float | None = None) -> None:
    """Raise StudyConfigError with every problem at once; add warnings to the study.
    The CPUs are those it is planned on (a cluster's nodes' on a cluster), the memory
    ``memory_mb`` (the nodes') or this machine's."""
    errors: list[str] = []
    allowed = plan_cpus()
    memory = memory_mb or total_memory_mb()
    python = study.settings["python"]
    if python and not Path(python).expanduser().exists():
        errors.append(err("python", f"{python!r} does not exist on this machine"))
    folder = study.settings["image_folder"]
    generated = folder["classes"] * folder["images_per_class"]
    errors += settings_ceilings(study, memory)
    errors += path_problems(study)
    for i, machine in enumerate(study.settings["report"]["machines"]):
        results = study.path(machine["results"])
        problem = folder_problem(results, write=False, create=False, file_ok=True)
        if problem:
            errors.append(err(f"report.machines[{i}].results", problem))
            continue
        try:
            result_files(results)
        except (TooBig, OSError) as exc:
            errors.append(err(f"report.machines[{i}].results", str(exc)))
    counted: dict[Path, int] = {}
    over_memory = study.settings["limits"]["over_memory"]
    for spec in study.experiments:
        at = f"experiment {spec['id']}"
        errors += cpu_problems(spec, allowed)
        workers = spec["num_workers"] if spec["data"] != "synthetic" else 0
        too_many = workers > WORKERS_PER_CPU * len(allowed)
        if too_many:  # (and their memory is no second cause)
            errors.append(
                err(
                    f"{at}.num_workers",
                    f"{workers} DataLoader workers on the {len(allowed)} CPUs the study may "
                    f"use: more than {WORKERS_PER_CPU} per CPU only contend (and each holds "
                    "a copy of the loader's memory)",
                )
            )
        if spec["data"] == "image_folder":
            if spec["data_dir"]:
                path = study.path(spec["data_dir"])
                problem = folder_problem(path, write=False, create=False)
                if problem:
                    errors.append(err(f"{at}.data_dir", f"{problem} here"))
                    continue
                if path not in counted:
                    enough = max(
                        x["batch_size"]
                        for x in study.experiments
                        if x["data_dir"] == spec["data_dir"]
                    )
                    try:
                        counted[path] = count_images(path, enough)
                    except ValueError as exc:
                        errors.append(err(f"{at}.data_dir", f"{str(path)!r}: {exc}"))
                        continue
                n = counted[path]
                where = f"the {n} images of {str(path)!r}"
            else:
                n = generated
                where = f"the generated folder's {n} images (image_folder)"
            if spec["batch_size"] > n:
                errors.append(
                    err(
                        f"{at}.batch_size",
                        f"{spec['batch_size']} is more than {where}: no full batch to train on",
                    )
                )
        where = "each node has" if memory_mb else "this machine has"
        warning = None if too_many else memory_warning(spec, memory, where)
        if warning and workloads.estimated_memory_mb(spec) > memory and not over_memory:
            errors.append(
                f"config error at {warning.replace('the run may be killed', 'it would be killed')}"
                "; refused (limits: {over_memory: true} runs it anyway)"
            )
        elif warning:
            study.warnings.append(f"config warning at {warning}")
    total = len(study.experiments)
    given = given_fields(study.defaults)
    study.warnings[:] = one_per_cause(study.warnings, study.ids, given, total, kind="warning")
    if errors:  # (one line per cause: a default wrong for every experiment, once)
        errors = one_per_cause(errors, study.ids, given, total)
        raise StudyConfigError("\n".join(errors))
