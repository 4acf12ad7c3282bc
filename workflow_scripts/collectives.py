"""The collectives microbenchmark, a job of its own per process-group variant:
allreduce latency and bus bandwidth from small to large messages, N ranks started by
torchrun (``rank/distributed/allreduce_bench.py``), in the variant's environment or image.

A variant is named like the study's distributed fields: ``gloo``, ``ccl-shm``,
``ccl-tcp``, with ``-offload`` for oneCCL's worker thread (``ccl_worker_offload``).
Runs in the workflow's environment (standard library only). Always writes its JSON
(``status`` ok, or failed with the tail of the log).

    python -m workflow_scripts.collectives --variant ccl-shm --env-json results/envs/oneccl.json \\
        --ranks 2,4 --sizes-kb 1,1024,102400 --out results/collectives/ccl-shm.json \\
        --log logs/collectives/ccl-shm.log
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

from . import backends, launchers, runtimes, sysinfo
from .commands import Arg, Command
from .runtimes.measured import (
    ENV_JSON,
    LIMIT_ARGS,
    Process,
    Ran,
    environment,
    run_measured,
    with_limits,
)
from .util import read_json, tail, write_json_atomic

PROGRAM = Path(__file__).resolve().parent / "rank" / "distributed" / "allreduce_bench.py"
VARIANT = re.compile(r"^(gloo|ccl-(shm|tcp))(-offload)?$")
#: the training backend whose environment (and image) a gloo variant runs in; the
#: launcher moves a ccl variant to oneccl's, as it does a ccl trial
BACKEND = "eager"


#: seconds the benchmark of one variant may take
TIMEOUT_S = 900


def variant_spec(variant: str, ranks: int, timeout_s: int, nodes: int = 1) -> dict:
    """The distributed fields of a variant name (a spec the layouts' launcher reads)."""
    m = VARIANT.match(variant)
    if not m or (m.group(1) == "gloo" and m.group(3)):
        raise ValueError(
            f"collectives variant {variant!r}: allowed are gloo, ccl-shm, ccl-tcp, "
            "and ccl-shm-offload / ccl-tcp-offload"
        )
    backend = "gloo" if m.group(1) == "gloo" else "ccl"
    return {
        "launcher": launchers.layout_launcher().name,
        "backend": BACKEND,
        "nodes": nodes,
        "ranks": ranks,
        "dist_backend": backend,
        "ccl_impl": "study",
        "ccl_transport": m.group(2) or "shm",
        "ccl_worker_offload": bool(m.group(3)),
        "threads": None,
        "cpus": None,
        "timeout_s": timeout_s,
    }


def env_of(variant: str) -> str:
    spec = variant_spec(variant, 2, 60)
    return launchers.layout_launcher().env(spec, backends.get(BACKEND))


def image_of(variant: str) -> str:
    spec = variant_spec(variant, 2, 60)
    return launchers.layout_launcher().image(spec, backends.get(BACKEND))


def rank_counts(setting, cpus: int, nodes: int = 1) -> list[int]:
    """The rank counts (per node) of the ``collectives.ranks`` setting: a count, a list,
    or ``all`` (2, 4, 8, ... up to ``cpus``, and ``cpus`` itself; 2 on a machine of
    fewer; from 1 when the benchmark spans several nodes)."""
    if setting == "all":
        if nodes > 1:
            return sorted({2**k for k in range(cpus.bit_length())} | {cpus})
        n = max(cpus, 2)
        return sorted({2**k for k in range(1, n.bit_length())} | {n})
    if isinstance(setting, list):
        return sorted({int(n) for n in setting})
    return [int(setting)]


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """What the microbenchmark times at each rank count: the message sizes (KiB), the
    dtypes, the timed calls per size, its time limit, and the nodes its ranks span."""

    sizes_kb: list[float]
    dtypes: list[str]
    iterations: int = 20
    timeout_s: int = TIMEOUT_S
    nodes: int = 1


def run(
    variant: str, env_info: dict, out: Path, log: Path, ranks: int | list[int], bench: Benchmark
) -> dict:
    """The benchmark at each rank count (per node, on ``nodes`` nodes) in turn (a run
    of its own each, the machine to itself), in one record: every result row says its
    ``ranks`` and ``nodes``; ``by_ranks`` the status of each count. Failed if any
    count failed (the others' rows stay)."""
    counts = [ranks] if isinstance(ranks, int) else list(ranks)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = []
    for n in counts:  # (the ranks' result files are named after out and the count)
        where = out.with_name(f".{out.stem}.r{n}{out.suffix}")
        runs.append((n, run_one(variant, env_info, where, log, n, bench)))
    record = combine(runs)
    record.update(variant=variant, env_name=env_info.get("name"), nodes=bench.nodes)
    write_json_atomic(out, record)
    return record


def combine(runs: list[tuple[int, dict]]) -> dict:
    """One record from the runs at each rank count (see :func:`run`)."""
    record = dict(next((r for _, r in runs if r.get("status") == "ok"), runs[0][1]))
    record["ranks"] = [n for n, _ in runs]
    record["results"] = [
        {**row, "ranks": n, "nodes": r.get("nodes", 1)}
        for n, r in runs
        if r.get("status") == "ok"
        for row in r.get("results") or []
    ]
    record["by_ranks"] = [
        {"ranks": n, "status": r.get("status"), "error": r.get("error"),
         "process_wall_s": r.get("process_wall_s"), "command": r.get("command")}
        for n, r in runs
    ]  # fmt: skip
    failed = [(n, r) for n, r in runs if r.get("status") != "ok"]
    if failed:
        why = "; ".join(f"{n} ranks: {(r.get('error') or {}).get('message')}" for n, r in failed)
        tail_ = (failed[0][1].get("error") or {}).get("tail")
        record.update(status="failed", error={"message": why, "tail": tail_})
    else:
        record.update(status="ok", error=None)
    record["process_wall_s"] = sum(r.get("process_wall_s") or 0 for _, r in runs)
    return record


def run_one(
    variant: str, env_info: dict, out: Path, log: Path, ranks: int, bench: Benchmark
) -> dict:
    """The benchmark at one rank count per node (its record, not written; ``out``
    names the ranks' result files)."""
    spec = variant_spec(variant, ranks, bench.timeout_s, bench.nodes)
    launcher = launchers.get(spec["launcher"])
    template, paths = launchers.result_paths(out, launcher.ranks(spec))
    args = [
        "--spec-json", json.dumps(spec, sort_keys=True),
        "--sizes-kb", ",".join(f"{kb:g}" for kb in bench.sizes_kb),
        "--dtypes", ",".join(bench.dtypes), "--iterations", str(bench.iterations),
        "--out", template,
    ]  # fmt: skip
    runtime = runtimes.for_env(env_info)
    starter = launchers.starter(launcher, spec, runtime.name)
    cmd = launcher.command(spec, env_info["python"], args, program=PROGRAM, starter=starter)
    process = Process(cmd, environment(spec, runtime, starter), f"collectives-{variant}",
                      mounts=[(str(out.parent.resolve()), "rw")])  # fmt: skip
    ran = run_measured(runtime, process, log=log, timeout_s=bench.timeout_s, results=paths)
    record = merge(ran, log)
    record.update(
        kind="collectives",
        variant=variant,
        ranks=ranks,
        nodes=bench.nodes,
        env_name=env_info.get("name"),
        runtime=runtime.name,
        command=ran.cmd,
        process_wall_s=ran.finished.wall_s,
    )
    record.setdefault("provenance", sysinfo.collect())
    record["provenance"].update(runtimes.image_provenance(env_info))
    return record


def merge(ran: Ran, log: Path) -> dict:
    """The benchmark's record from its ranks' results: rank 0's figures (every rank
    times the same collectives), failed when the run left nothing usable or any rank
    failed or wrote nothing. (Not the launcher's ``merge``: that one merges training
    steps.)"""
    results = ran.results
    record = dict(results[0]) if results and results[0] else {}
    # where each rank ran (several nodes: several hosts)
    record["rank_hosts"] = [((res or {}).get("provenance") or {}).get("hostname")
                            for res in results]  # fmt: skip
    bad = [r for r, res in enumerate(results) if not res or res.get("status") != "ok"]
    problem = ran.problem()
    if problem:
        why = problem[1]
    elif bad:
        why = "; ".join(
            f"rank {r}: "
            + ((results[r] or {}).get("error") or {}).get("message", f"wrote no result ({ran.how})")
            for r in bad
        )
    else:
        return record
    record.update(status="failed", error={"message": why, "tail": tail(log)})
    return record


def loop_latency_s(result: dict) -> float:
    """A size's latency: per iteration of the timed loop (records before the loop: the
    median of calls timed one at a time)."""
    lat = result["latency_s"]
    return lat["loop"] if "loop" in lat else lat["median"]


def summary_line(record: dict) -> str:
    head = f"[collectives] {record['variant']} x{','.join(map(str, record['ranks']))}:"
    if record.get("status") != "ok":
        return f"{head} failed: {record['error']['message']}"[:400]
    parts = []
    for r in record["results"]:
        if r["dtype"] == "float32":
            parts.append(
                f"{r['ranks']} ranks {r['bytes'] / 1024:g} KiB "
                f"{loop_latency_s(r) * 1e3:.3f} ms {r['busbw_GBps']:.2f} GB/s"
            )
    return f"{head} " + ", ".join(parts)


def _benchmark(job) -> dict:
    return json.loads(job.params.settings)


def _rank_counts(job) -> str:
    c = _benchmark(job)
    counts = rank_counts(c["ranks"], len(sysinfo.plan_cpus()), c.get("nodes") or 1)
    return ",".join(map(str, counts))


#: The collectives rule's entry point (the benchmark's settings are a param: editing
#: them reruns it; the container limits come in the study settings, as a trial's).
COMMAND = Command(
    __doc__.splitlines()[0],
    (
        Arg("variant", "wildcards.variant"),
        ENV_JSON,
        Arg("out", "output.result", type=Path),
        Arg("log", "log", type=Path),
        Arg("ranks", _rank_counts, default="2", help="rank counts, comma-separated (e.g. 2,4)"),
        Arg("sizes_kb", lambda job: ",".join(f"{kb:g}" for kb in _benchmark(job)["sizes_kb"]),
            default="1,1024,102400"),
        Arg("dtypes", lambda job: ",".join(_benchmark(job)["dtypes"]),
            default="float32,bfloat16"),
        Arg("iterations", lambda job: _benchmark(job)["iterations"], type=int, default=20),
        Arg("nodes", lambda job: _benchmark(job).get("nodes") or 1, type=int, default=1,
            help="nodes the ranks span"),
        Arg("timeout", type=int, default=TIMEOUT_S),
        *LIMIT_ARGS,
    ),
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    env_info = with_limits(read_json(args.env_json, want=None), args)
    try:
        bench = Benchmark(
            [float(x) for x in args.sizes_kb.split(",")], args.dtypes.split(","),
            args.iterations, args.timeout, args.nodes,
        )  # fmt: skip
        ranks = [int(n) for n in str(args.ranks).split(",")]
        record = run(args.variant, env_info, args.out, args.log, ranks, bench)
    except runtimes.Interrupted as exc:
        print(f"[collectives] {args.variant}: {exc}; no result written", file=sys.stderr)
        return exc.exit_code
    print(summary_line(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
