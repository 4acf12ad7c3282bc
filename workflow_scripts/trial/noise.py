"""Was the trial disturbed? The three noise signals (the probe before and after the
steps, against what such a probe ordinarily reads here: ``peers.py``; other work during
the steps), and the trial's share of the measured matmul ceiling."""

from __future__ import annotations

import statistics

from ..rank import probe
from ..util import beyond_ceiling, ceiling_threads, finite
from . import peers
from .reference import measured_on

PROBE_BEFORE = "probe before steps"
PROBE_AFTER = "probe after steps"
OTHER_WORK = "other work during steps"
#: the probe after the steps, the only signal, discards no attempt whose timed steps
#: (at least this many) show none of it: in the default study's records (2-vCPU EPYC,
#: 162 trials) 9 of the 10 attempts discarded on it alone had 0.91-1.15x the
#: throughput of the attempt kept in their place (median 1.06): what it read came after
#: the steps
STEADY_MIN_STEPS = 4


def probe_signal(
    name: str, result, reference: dict | None, threshold: float, level: dict | None = None
) -> dict | None:
    """A probe's fp32 rate against what such a probe ordinarily reads here: the median of
    its peers (``level``, :func:`peers.ordinary`) where there are enough of them, else
    the calibration's reference; None when there is nothing to compare. Its
    ``threshold`` is the share of that level below which it was disturbed
    (:func:`peers.bound`)."""
    rate = result.get("fp32_gflops") if isinstance(result, dict) else None
    if (reference is None and level is None) or not finite(rate):
        return None
    limit = peers.bound(level, threshold)
    if level is not None:
        ref = level["level"]
        how = (
            f"the median of {level['peers']} peer probes (this study's trials measured the "
            f"same way), spread {100 * level['spread']:.1f}%"
        )
        check = {"signal": name, "fp32_gflops": rate, "reference": how, "basis": "peers",
                 "peers": level["peers"], "spread": level["spread"]}  # fmt: skip
    else:
        ref, how = probe.reference_rate(reference, result.get("size"), result.get("threads"))
        check = {"signal": name, "fp32_gflops": rate, "reference": how, "basis": "calibration"}
    check["reference_node_type"] = measured_on(reference) if reference else None
    check["threshold"] = limit
    if ref is None or ref <= 0:
        return {**check, "reference_fp32_gflops": None, "ratio": None, "passed": None}
    ratio = rate / ref
    check.update(reference_fp32_gflops=ref, ratio=ratio, passed=ratio >= limit)
    against = (
        f"the median {ref:.1f} GFLOP/s of {level['peers']} peer probes (spread "
        f"{100 * level['spread']:.1f}%)"
        if level is not None
        else f"the reference {ref:.1f} GFLOP/s ({how})"
    )
    check["detail"] = (
        f"{name}: fp32 {rate:.1f} GFLOP/s = {ratio:.2f} x {against}, below {limit:.2f}"
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
        f"{work['threads']} threads' time, more than {1 - threshold:.2f}"
    )
    return {"signal": OTHER_WORK, "ratio": ratio, "passed": ratio >= threshold,
            "threshold": threshold, "detail": detail}  # fmt: skip


def steps_signal(record: dict, threshold: float) -> dict | None:
    """Did the timed steps slow down as a disturbance beginning during them would slow
    them? The median of their earlier half over their later half's, comparable with the
    probes' ratios (below ``threshold``: slowed); None with fewer than
    :data:`STEADY_MIN_STEPS` timed steps."""
    times = [float(t) for t in record.get("step_times_s") or [] if finite(t) and t > 0]
    if len(times) < STEADY_MIN_STEPS:
        return None
    half = len(times) // 2
    earlier, later = statistics.median(times[:half]), statistics.median(times[-half:])
    ratio = earlier / later
    return {"steps": len(times), "earlier_s": earlier, "later_s": later, "ratio": ratio,
            "passed": ratio >= threshold}  # fmt: skip


def _after_alone_and_steady(record: dict, signals: list[dict], threshold: float) -> None:
    """Where the probe after the steps is the only signal that failed, the probe before
    them passed and other work during them was judged and passed: the steps decide
    (:func:`steps_signal`). Steady steps keep the attempt: that probe's signal passes,
    with ``kept_by_steps`` and a ``note`` saying why."""
    by = {x["signal"]: x for x in signals}
    after, before, work = by.get(PROBE_AFTER), by.get(PROBE_BEFORE), by.get(OTHER_WORK)
    if not after or after["passed"] is not False:
        return
    if not before or before["passed"] is not True or not work or work["passed"] is not True:
        return
    steps = steps_signal(record, threshold)
    if not steps or not steps["passed"]:
        return
    after["passed"] = True
    after["kept_by_steps"] = steps
    after["note"] = (
        f"{after['detail']}; kept: its {steps['steps']} timed steps show none of it (the "
        f"later half's median {steps['later_s']:.3g} s, the earlier half's "
        f"{steps['earlier_s']:.3g} s), with the probe before them and the other work "
        "during them ordinary"
    )


def noise_check(
    record: dict, reference: dict | None, threshold: float, levels: dict | None = None
) -> dict | None:
    """Every noise signal of an ok record; None when none can be judged (a failed run,
    no probes and no /proc). ``levels``: the ordinary level of each probe signal
    (``before``, ``after``: :func:`peers.ordinary`; absent: judged by the calibration).
    ``passed`` is False when any signal failed, and ``caught_by`` names those; the
    probe before the steps keeps its fields at the top. The probe after the steps
    alone does not fail an attempt whose steps were steady
    (:func:`_after_alone_and_steady`)."""
    if record.get("status") != "ok":
        return None
    levels = levels or {}
    before = probe_signal(
        PROBE_BEFORE, record.get("probe"), reference, threshold, levels.get("before")
    )
    after = probe_signal(
        PROBE_AFTER, record.get("probe_after"), reference, threshold, levels.get("after")
    )
    work = work_signal(record.get("other_work"), threshold)
    signals = [x for x in (before, after, work) if x]
    if not signals:
        return None
    _after_alone_and_steady(record, signals, threshold)
    judged = [x["passed"] for x in signals if x["passed"] is not None]
    check = {
        "threshold": threshold,
        "signals": signals,
        "caught_by": [x["signal"] for x in signals if x["passed"] is False],
        "passed": all(judged) if judged else None,
    }
    if before:
        keys = ("fp32_gflops", "reference", "reference_fp32_gflops", "ratio",
                "reference_node_type", "basis")  # fmt: skip
        check.update({k: before[k] for k in keys})
    return check


def noise_reason(check: dict) -> str:
    return "; ".join(x["detail"] for x in check["signals"] if x["passed"] is False)


def with_ceiling(record: dict, reference: dict | None) -> dict:
    """Put the calibrated ceiling and the run's share of it in an ok record's metrics:
    ``ceiling_gflops`` (of the run's dtype, for all its threads: per rank x ranks),
    ``ceiling_dtype``, ``ceiling_source`` and ``pct_of_peak``; a share above 100 is
    no result but a ``measurement_error`` (``pct_of_peak_measured`` keeps the value)."""
    m = record.get("metrics")
    if record.get("status") != "ok" or not isinstance(m, dict):
        return record
    spec = record.get("spec") or {}
    total = ceiling_threads(record)
    rate, dtype, how = probe.ceiling_rate(reference, spec.get("precision", "fp32"), total)
    m.update(ceiling_gflops=rate, ceiling_dtype=dtype, ceiling_source=how, pct_of_peak=None)
    achieved = m.get("achieved_gflops")
    if rate and finite(achieved):
        pct = 100.0 * achieved / rate
        if pct <= 100.0:
            m["pct_of_peak"] = pct
        else:
            m["pct_of_peak_measured"] = pct
            m["measurement_error"] = beyond_ceiling(pct, rate, how)
    return record
