"""What a SLURM cluster's nodes have, and what SLURM said when it ended a job step.

A study run through the SLURM profile is planned for the nodes that run it, never for
the submit (login) host: the CPUs and memory of the partition's nodes come from
``sinfo`` (or from the ``cluster`` setting, which wins), the layouts and every job's
request are sized from them, and a study that does not fit is refused before any job.
Standard library only (and the SLURM executor plugin, whose status checks
:func:`bound_status_checks` bounds).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

#: what sinfo prints per node: name, partition (``*``: the default), CPUs, memory (MB),
#: features, state
SINFO_FORMAT = "%N|%P|%c|%m|%f|%T"
#: the environment variable that carries the node memory a study was planned for (MB)
NODE_MEM_VAR = "STUDY_NODE_MEM_MB"
#: the partition's nodes the study was planned on (comma-separated, sinfo's names), for
#: every job's process: the trials' blocks (cluster/sizing.block_node)
NODES_VAR = "STUDY_NODES"


class ClusterError(Exception):
    """The cluster cannot be asked, or has no node a study can run on."""


@dataclass(frozen=True)
class NodeType:
    """The nodes measured jobs run on: one type (CPUs and memory)."""

    partition: str
    cpus: int
    mem_mb: int
    nodes: tuple[str, ...]
    source: str  # "sinfo" or "config"

    def describe(self) -> str:
        where = f"partition {self.partition!r}" if self.partition else "the cluster"
        return (
            f"{where}: {len(self.nodes) or '?'} node(s) of {self.cpus} CPUs and "
            f"{self.mem_mb} MB ({self.source})"
        )


def parse_sinfo(text: str) -> list[dict]:
    """sinfo's ``-N -h -o SINFO_FORMAT`` lines -> one dict per node and partition."""
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6:
            continue
        name, partition, cpus, mem, features, state = parts
        try:
            rows.append(
                {
                    "name": name,
                    "partition": partition.rstrip("*"),
                    "default": partition.endswith("*"),
                    "cpus": int(cpus),
                    "mem_mb": int(re.sub(r"\D.*$", "", mem) or 0),
                    "features": set() if features in ("", "(null)") else set(features.split(",")),
                    "state": state,
                }
            )
        except ValueError:
            continue
    return rows


def node_type(
    rows: list[dict], partition: str | None = None, constraint: str | None = None
) -> NodeType:
    """The one node type of ``partition`` (None: the default partition) whose nodes
    carry every feature of ``constraint`` (``a&b`` or ``a,b``; None: any). Nodes that
    SLURM has down, drained or failed do not count. Several types: ClusterError (a
    study measures one node type; choose it with a partition or a constraint)."""
    if not rows:
        raise ClusterError("sinfo lists no node")
    if partition is None:
        defaults = {r["partition"] for r in rows if r["default"]}
        if not defaults:
            names = sorted({r["partition"] for r in rows})
            raise ClusterError(
                f"the cluster has no default partition; set cluster.partition (one of "
                f"{', '.join(names)})"
            )
        partition = defaults.pop()
    mine = [r for r in rows if r["partition"] == partition]
    if not mine:
        names = sorted({r["partition"] for r in rows})
        raise ClusterError(
            f"cluster.partition {partition!r} is not a partition of this cluster "
            f"(it has: {', '.join(names)})"
        )
    wanted = set(re.split(r"[&,]", constraint)) - {""} if constraint else set()
    usable = [
        r
        for r in mine
        if wanted <= r["features"] and not re.match(r"(down|drain|fail)", r["state"])
    ]
    if not usable:
        what = f" with features {constraint!r}" if constraint else ""
        raise ClusterError(f"partition {partition!r} has no usable node{what}")
    types = sorted({(r["cpus"], r["mem_mb"]) for r in usable})
    if len(types) > 1:
        listed = "; ".join(
            f"{c} CPUs {m} MB: "
            + ",".join(r["name"] for r in usable if (r["cpus"], r["mem_mb"]) == (c, m))
            for c, m in types
        )
        raise ClusterError(
            f"partition {partition!r} has nodes of {len(types)} types ({listed}); a study "
            "measures one node type: choose it with cluster.constraint (a node feature) "
            "or cluster.partition"
        )
    cpus, mem = types[0]
    return NodeType(partition, cpus, mem, tuple(r["name"] for r in usable), "sinfo")


def query_nodes(run=subprocess.run) -> list[dict]:
    """Every node of every partition, from sinfo; ClusterError when it cannot be asked."""
    cmd = ["sinfo", "-N", "-h", "-o", SINFO_FORMAT]
    try:
        proc = run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"cannot ask SLURM for its nodes ({' '.join(cmd)}): {exc}") from None
    if proc.returncode != 0:
        raise ClusterError(
            f"cannot ask SLURM for its nodes ({' '.join(cmd)}): {proc.stderr.strip()[-500:]}"
        )
    return parse_sinfo(proc.stdout)


def planned_node(settings: dict, run=subprocess.run) -> NodeType:
    """The node type a study on the cluster is planned for: the ``cluster`` setting's
    ``node_cpus`` and ``node_mem_mb`` where both are set, else sinfo's answer for its
    partition and constraint (a value set in the setting wins over sinfo's)."""
    c = settings["cluster"]
    if c["node_cpus"] and c["node_mem_mb"]:
        return NodeType(c["partition"] or "", c["node_cpus"], c["node_mem_mb"], (), "config")
    found = node_type(query_nodes(run), c["partition"], c["constraint"])
    return NodeType(
        found.partition,
        c["node_cpus"] or found.cpus,
        c["node_mem_mb"] or found.mem_mb,
        found.nodes,
        "sinfo" if not (c["node_cpus"] or c["node_mem_mb"]) else "sinfo and config",
    )


# ---- a job step that SLURM ended ----
#: what srun and slurmstepd print when SLURM ends a step, and the status it means (the
#: wordings of SLURM 19.05 to 24.x: cgroup's "oom-kill event(s)" and "oom_kill event",
#: jobacct_gather's "exceeded memory limit", srun's "task 0: Out Of Memory")
_ENDED_BY_SLURM = (
    (
        re.compile(
            r"exceeded (?:job |step )?memory limit|oom[-_ ]kill|task \d+: Out Of Memory",
            re.IGNORECASE,
        ),
        "oom",
    ),
    (re.compile(r"DUE TO TIME LIMIT"), "timeout"),
    (re.compile(r"DUE TO PREEMPTION"), "preempted"),
    (re.compile(r"DUE TO NODE FAIL|NODE_FAIL|Node failure", re.IGNORECASE), "node_fail"),
)
#: a line of srun's or slurmstepd's (``slurmstepd-<node>:`` too), after what may stand
#: before it: a timestamp (``[2026-11-25T10:00:01.123]``, as LogTimeFormat and srun
#: --verbose print), a task label (``srun --label``'s ``0:``) or a host name
_PREFIX = r"^(?:\[[^\]\n]*\] ?)?(?:\S+: )?"
_SLURM_LINE = re.compile(_PREFIX + r"(?:srun|slurmstepd(?:-\S+)?): .*$", re.MULTILINE)
#: slurmstepd's own lines where it logs with a timestamp and no name of its own (an
#: error line whose wording only SLURM prints: checked against _ENDED_BY_SLURM too)
_STEPD_LINE = re.compile(r"^\[\d{4}-\d\d-\d\dT[\d:.]+\] (?:error: |\*\*\* ).*$", re.MULTILINE)
_STEPD_WORDS = re.compile(
    r"oom[-_ ]kill event|exceeded (?:job |step )?memory limit|\*\*\* (?:STEP|JOB) \d",
    re.IGNORECASE,
)


def ended_by_slurm(output: str) -> tuple[str, str] | None:
    """(status, SLURM's own words) when srun's output says SLURM ended the step: over
    its memory (``oom``), at its time limit (``timeout``), preempted, or on a failed
    node; None otherwise."""
    lines = _SLURM_LINE.findall(output)
    lines += [line for line in _STEPD_LINE.findall(output) if _STEPD_WORDS.search(line)]
    for pattern, status in _ENDED_BY_SLURM:
        said = [line.strip() for line in lines if pattern.search(line)]
        if said:
            return status, "; ".join(dict.fromkeys(said))[:1000]
    return None


# ---- a job lost whole: its next attempt asks the accounting what became of it ----
#: how a job's end in sacct makes the trial's record: its state -> the error's type
#: (whose status is trial.outcome's: timeout, oom, preempted, node_fail, failed)
JOB_ENDS = {
    "TIMEOUT": "SlurmTimeLimit",
    "DEADLINE": "SlurmTimeLimit",
    "OUT_OF_MEMORY": "SlurmOutOfMemory",
    "PREEMPTED": "SlurmPreempted",
    "NODE_FAIL": "SlurmNodeFailure",
    "BOOT_FAIL": "SlurmNodeFailure",
    "CANCELLED": "SlurmCancelled",
    "FAILED": "SlurmJobFailed",
}
SACCT_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Elapsed", "Timelimit", "End")


class NoAccounting(Exception):
    """sacct cannot answer (a cluster without accounting, or no sacct): what became of
    an earlier job is unknown."""


def job_end(job_id: str, run=subprocess.run) -> dict | None:
    """The accounting's record of a job (its allocation's line): state, exit code, node,
    elapsed and time limit, end; None when it knows no such job. Raises
    :class:`NoAccounting` when sacct cannot answer."""
    cmd = ["sacct", "-X", "-n", "-P", "-j", str(job_id), f"--format={','.join(SACCT_FIELDS)}"]
    try:
        proc = run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoAccounting(f"{' '.join(cmd)}: {exc}") from None
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise NoAccounting(f"{' '.join(cmd)}: {said[-1] if said else f'exit {proc.returncode}'}")
    for line in proc.stdout.splitlines():
        values = line.split("|")
        if len(values) == len(SACCT_FIELDS) and values[0] == str(job_id):
            return dict(zip(("job_id", "state", "exit_code", "nodes", "elapsed", "time_limit",
                             "end"), values))  # fmt: skip
    return None


def lost_job(job: dict) -> tuple[str, str] | None:
    """(error type, SLURM's words) of a job that ended without its trial's record, from its
    accounting record; None while it has not ended (or ended as one that completed)."""
    state = job.get("state", "")
    kind = JOB_ENDS.get(state.split(" ")[0])
    if kind is None:
        return None
    words = (
        f"SLURM's accounting: job {job['job_id']} {state} on {job.get('nodes') or '?'} after "
        f"{job.get('elapsed') or '?'} (time limit {job.get('time_limit') or '?'}, exit code "
        f"{job.get('exit_code') or '?'}, ended {job.get('end') or '?'})"
    )
    return kind, words


#: the wait between job-status checks where Snakemake does not say one
#: (its ``--seconds-between-status-checks`` default)
STATUS_CHECKS_S = 10.0


def bound_status_checks() -> bool:
    """Wait at most Snakemake's ``--seconds-between-status-checks`` (the executor's own
    remote execution settings, as the executor interface reads them;
    :data:`STATUS_CHECKS_S` where they do not say) between the SLURM executor plugin's
    job-status checks.

    The pinned plugin (2.8) reads no such option: after every check that found no job
    ended it waits 10 s longer, up to 180 s, so a job that ends after a quiet spell is
    seen minutes late, and whatever waits on it (the next round of trials, the report)
    waits too; on the test cluster, jobs of 10-30 s were seen 16-20 s after they ended.
    Bounded, its backoff still runs below the bound, from the interval it starts again
    at once a job ends (``slurm-init-seconds-before-status-checks``, where that is
    lower). False where the plugin is not installed (the bound is then nobody's)."""
    try:
        from snakemake_executor_plugin_slurm import Executor
    except ImportError:
        return False

    def most(executor) -> float:
        settings = getattr(executor.workflow, "remote_execution_settings", None)
        said = getattr(settings, "seconds_between_status_checks", None)
        return float(said) if isinstance(said, (int, float)) and said > 0 else STATUS_CHECKS_S

    def get(self):
        value = self._next_seconds_between_status_checks
        return most(self) if value is None else min(value, most(self))

    def put(self, value):  # (the plugin sets numbers; its base class starts at None)
        self._next_seconds_between_status_checks = min(value, most(self))

    Executor.next_seconds_between_status_checks = property(get, put)
    return True
