"""Other work on a run's CPUs while it trained: how much CPU time something else took.

The noise probe reads the machine before (and after) the timed steps; this reads it
*during* them. At the start and the end of the timed steps the harness takes a
:func:`snapshot`: the busy time of each CPU this process may run on (``/proc/stat``:
user, nice, system, irq, softirq and a hypervisor's steal) and the CPU time of this
process and all its descendants (its threads, DataLoader workers, compile workers:
``/proc/<pid>/stat``, with the time of children already reaped). What the CPUs spent
beyond the run's own time went to other work. Other work is a disturbance only where
it took CPU time the run's threads wanted: of ``n`` CPUs, a run of ``t`` threads
leaves ``n - t`` free, so

    share = max(0, other - (n - t) x wall) / (t x wall)

is the part of its threads' time that other work took: 0 on a machine to itself, about
0.5 with one busy process beside a 2-thread run on 2 CPUs. The trial policy compares
``1 - share`` with the noise threshold, as it compares the probe with the reference.

The same window also counts this process's own page faults and context switches
(``getrusage``, all its threads): what each step costs the kernel (a fresh mapping for
each large activation is faulted in at every step, and the number differs from one
process to the next) and how often its threads were switched out, so that two runs of
one step time can be told apart by them.

Linux only (None elsewhere); standard library only. ``/proc/stat`` is not namespaced,
so in a container it sees the host's CPUs and their other work, as it should.
"""

from __future__ import annotations

import os
import resource
import time

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
# windows shorter than this are not judged: /proc counts in ticks (10 ms), per CPU
MIN_WINDOW_S = 1.0
# /proc/stat columns after the cpu name: user nice system idle iowait irq softirq steal
_BUSY = (0, 1, 2, 5, 6, 7)
#: this process's counters in a window (getrusage's fields, all its threads)
COUNTERS = {
    "minor_faults": "ru_minflt",
    "major_faults": "ru_majflt",
    "voluntary_switches": "ru_nvcsw",
    "involuntary_switches": "ru_nivcsw",
}


def cpu_busy_s(cpus: set[int]) -> float | None:
    """Seconds the given CPUs have been busy since boot (None: no /proc/stat)."""
    total = 0.0
    try:
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *fields = line.split()
                if int(name[3:]) in cpus:
                    values = [int(v) for v in fields]
                    total += sum(values[i] for i in _BUSY if i < len(values))
    except (OSError, ValueError):
        return None
    return total * TICK_S


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children) of one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) "
    try:  # state ppid ... utime(11) stime(12) cutime(13) cstime(14)
        return int(fields[1]), sum(int(v) for v in fields[11:15]) * TICK_S
    except (IndexError, ValueError):
        return None


def tree_cpu_s(root: int | None = None) -> float | None:
    """CPU seconds of a process (this one by default) and all its live descendants,
    including the children they already reaped."""
    root = os.getpid() if root is None else root
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    stats = {int(p): s for p in pids if (s := _stat(p)) is not None}
    if root not in stats:
        return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


def snapshot() -> dict | None:
    """The counters at one moment (None where /proc cannot be read)."""
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    busy, own = cpu_busy_s(cpus), tree_cpu_s()
    if busy is None or own is None:
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    counters = {name: getattr(usage, field) for name, field in COUNTERS.items()}
    return {"t": time.perf_counter(), "cpus": sorted(cpus), "busy_s": busy, "own_s": own,
            "counters": counters}  # fmt: skip


def share(other_s: float, wall_s: float, cpus: int, threads: int) -> float:
    """The part of ``threads`` threads' time over ``wall_s`` that ``other_s`` CPU seconds
    of other work took, on ``cpus`` CPUs (see the module docstring)."""
    t = max(1, min(threads, cpus))
    free = (cpus - t) * wall_s
    return max(0.0, other_s - free) / (t * wall_s) if wall_s > 0 else 0.0


def measure(start: dict | None, end: dict | None, threads: int) -> dict | None:
    """What happened on the run's CPUs between two snapshots; ``share`` is None for a
    window too short to judge."""
    if not start or not end:
        return None
    wall = end["t"] - start["t"]
    cpus = len(start["cpus"])
    own = max(0.0, end["own_s"] - start["own_s"])
    other = max(0.0, (end["busy_s"] - start["busy_s"]) - own)
    judged = wall >= MIN_WINDOW_S
    counted = start.get("counters") or {}
    return {
        "wall_s": wall,
        "cpus": cpus,
        "threads": threads,
        "own_cpu_s": own,
        "other_cpu_s": other,
        "share": share(other, wall, cpus, threads) if judged else None,
        "judged": judged,
        # this process's own, over the window (absent from a snapshot without them)
        **{name: end["counters"][name] - counted[name]
           for name in COUNTERS if name in counted and name in end.get("counters", {})},
    }  # fmt: skip
