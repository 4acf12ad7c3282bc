"""What this machine's noise probe ordinarily reads, from the study's own trials.

A trial's probe runs in a different moment from the calibration's (after its model and
data were set up, in a process of its own), and on a small VM it reads lower as a rule:
on a 2-vCPU Xeon the calibration's probe was 285.8 GFLOP/s and the quick study's trials
read 182-234 (0.64-0.82x) with nothing else running, so a fixed 0.85 of the calibration
called half of them disturbed. The evidence is the trials' own probes: every attempt of
every trial appends its probe rates to ``<results>/probes/<env>.jsonl`` (one short line,
appended whole), and a later trial's probe is judged against its *peers* there, those
measured the same way (probe size, threads, ranks, node type), other trials than its
own:

- with at least :data:`MIN_PEERS`, the peers' median is the ordinary level and their
  robust spread ``s`` (1.4826 x the median absolute deviation of the log rates) says
  how far an ordinary probe strays: a probe is disturbed when it is below
  ``min(noise_threshold, exp(-max(k(n) * s, OUTLIER_K * SPREAD_FLOOR)))`` x the level
  (never below :data:`COLD_START` x it), an outlier among its kind and a drop of at
  least ``1 - noise_threshold``. ``k(n)`` (:func:`outlier_k`) is :data:`OUTLIER_K`
  widened for the few peers there are: the median and the spread of n peers are
  themselves estimates, and with 3 spreads a probe as ordinary as its 4 peers fell
  below them 4 % of the time at a 10 % spread (7 % at 15 %), not the normal tail's
  0.13 % (on a 2-vCPU Xeon with AMX, a probe 0.82x the median of 4 peers that read
  241-326 ran a compiled trial again); a
  one-process trial whose probe before the steps reads below that probes again after
  a pause (:func:`floors`, rank/measure.py), up to three times, before it steps: a
  moment's disturbance then costs seconds, not a whole attempt run and discarded;
- with fewer, the calibration is the only level there is, and a probe is disturbed only
  below :data:`COLD_START` x it: on these machines another process busy on one of two
  cores halves a 2-thread probe, where an ordinary trial probe read 0.64-0.82x.

The log is a side file of the records, never a rule's input or output: deleting it only
restarts the evidence (a trial still runs, judged against the calibration).

A disturbance that outlasts a whole trial, its reruns too, is the machine's state for
now, not a moment's (:func:`persistent`): in a whole default study on a 2-vCPU EPYC, ten
trials in a row (17 min) were each run three times while another process took a third
of the CPUs, and nine kept their third attempt disturbed all the same. So where the trial
before it on this host ended disturbed after reruns of its own (or with its reruns
withheld too), within :data:`STREAK_S`, a disturbed attempt is not run again: it is kept,
flagged (``noise_check.rerun_withheld`` says why), and the first trial that runs clean
ends the streak. Each trial leaves how it ended in ``probes/last-trial-<host>.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path

from ..outliers import COLD_START as COLD_START
from ..outliers import FEW_K as FEW_K
from ..outliers import FEW_PEERS as FEW_PEERS
from ..outliers import MANY_C as MANY_C
from ..outliers import MIN_PEERS as MIN_PEERS
from ..outliers import OUTLIER_K as OUTLIER_K
from ..outliers import SPREAD_FLOOR as SPREAD_FLOOR
from ..outliers import bound as bound
from ..outliers import ordinary as ordinary
from ..outliers import outlier_k as outlier_k
from ..util import UnreadableFile, beside_records, finite, read_json, write_json_atomic

#: the most recent lines read (the log of a long study stays cheap to read)
RECENT = 400
#: the two probe signals' names in a log line
SIGNALS = ("before", "after")
#: how recent the end of the trial before counts for a disturbance outlasting it (s)
STREAK_S = 300.0


def log_path(out: Path, env: str) -> Path:
    """The probe log of environment ``env`` for the record ``out``
    (``<results>/records/<experiment>/trial<k>.json`` -> ``<results>/probes/<env>.jsonl``;
    a record elsewhere: ``probes/`` beside its folder)."""
    return beside_records(out, "probes") / f"{env}.jsonl"


def last_trial_path(out: Path) -> Path:
    """Where the trials on this host leave how the last of them ended (for the record
    ``out``): ``<results>/probes/last-trial-<host>.json``."""
    host = "".join(c if c.isalnum() or c in "-._" else "_" for c in socket.gethostname())
    return beside_records(out, "probes") / f"last-trial-{host or 'host'}.json"


def ended(path: Path, own: tuple[str, int], attempts: int, disturbed: bool, withheld: bool):
    """Leave how trial ``own`` ended (its attempts, whether the kept one was disturbed and
    whether its reruns were withheld); a file that cannot be written is no error."""
    line = {"experiment": own[0], "trial": own[1], "attempts": attempts,
            "disturbed": disturbed, "withheld": withheld, "at": time.time()}  # fmt: skip
    with contextlib.suppress(OSError):
        write_json_atomic(path, line)


def persistent(path: Path, own: tuple[str, int], started: float) -> str | None:
    """Why a disturbed attempt of trial ``own`` (started at ``started``, epoch seconds)
    is not run again: the trial before it on this host ended disturbed after reruns of
    its own, or with its reruns withheld too, at most :data:`STREAK_S` before; None
    otherwise (no such trial, or it ran clean)."""
    try:
        last = read_json(path)
    except UnreadableFile:
        return None
    if (last.get("experiment"), last.get("trial")) == own:
        return None
    at, attempts = last.get("at"), last.get("attempts")
    if not (finite(at) and isinstance(attempts, int)) or started - at > STREAK_S:
        return None
    if last.get("disturbed") is not True or not (attempts >= 2 or last.get("withheld")):
        return None
    how = "its reruns withheld too" if last.get("withheld") else f"after {attempts} attempts"
    return (f"the trial before it here ({last.get('experiment')}, trial {last.get('trial')}) "
            f"ended disturbed, {how}: the disturbance outlasts a trial")  # fmt: skip


def kind_of(probe: dict | None, world: int, node: str) -> dict | None:
    """How a probe was measured (its kind); None for no probe."""
    if not isinstance(probe, dict) or not finite(probe.get("fp32_gflops")):
        return None
    return {"size": probe.get("size"), "threads": probe.get("threads"), "world": world,
            "node": node}  # fmt: skip


def append(path: Path, line: dict) -> None:
    """Add one line to the log, whole (a single write with O_APPEND: lines of trials
    writing at once do not interleave); a log that cannot be written is no error."""
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        pass


def read(path: Path) -> list[dict]:
    """The log's last :data:`RECENT` lines that parse as mappings (a torn or edited line
    is skipped); none when there is no log."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 512 * RECENT))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    lines = text.splitlines()
    if size > 512 * RECENT:
        lines = lines[1:]  # the first may be cut
    out = []
    for raw in lines[-RECENT:]:
        try:
            item = json.loads(raw)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def peer_rates(lines: Iterable[dict], kind: dict, signal: str, own: tuple[str, int]) -> list[float]:
    """The ``signal`` rates of the lines of ``kind``, other trials' than ``own``."""
    rates = []
    for line in lines:
        if (line.get("experiment"), line.get("trial")) == own:
            continue
        if any(line.get(k) != v for k, v in kind.items()):
            continue
        rate = line.get(signal)
        if finite(rate) and rate > 0:
            rates.append(float(rate))
    return rates


def floors(
    lines: Iterable[dict], size, node: str, own: tuple[str, int], threshold: float
) -> dict[str, float]:
    """Per thread count, the fp32 rate below which a one-process probe of ``size``
    before the steps was disturbed (its peers' level x :func:`bound`): the trial probes
    again while below it (rank/measure.py). Only where there are enough peers: before
    that, the probe is judged against the calibration after the attempt, as ever."""
    out: dict[str, float] = {}
    if not size:
        return out
    for threads in sorted({line.get("threads") for line in lines} - {None}, key=str):
        kind = {"size": size, "threads": threads, "world": 1, "node": node}
        level = ordinary(peer_rates(lines, kind, "before", own))
        if level is not None:
            out[str(threads)] = level["level"] * bound(level, threshold)
    return out


def line_for(record: dict, experiment: str, trial: int, attempt: int, node: str) -> dict | None:
    """The log line of one attempt (None when it ran no probe)."""
    world = (record.get("checks") or {}).get("world_size") or 1
    kind = kind_of(record.get("probe"), world, node) or kind_of(
        record.get("probe_after"), world, node
    )
    if kind is None:
        return None
    rates = {}
    for signal, key in zip(SIGNALS, ("probe", "probe_after"), strict=True):
        probe = record.get(key)
        rate = probe.get("fp32_gflops") if isinstance(probe, dict) else None
        rates[signal] = float(rate) if finite(rate) else None
    return {**kind, **rates, "experiment": experiment, "trial": trial, "attempt": attempt}
