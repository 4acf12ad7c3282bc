"""The estimate as the lines a dry run and the start of a real run print (and the
progress line's durations: :func:`human`)."""

from __future__ import annotations

from collections.abc import Mapping


def human(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def format_estimate(est: Mapping, trials: int) -> str:
    """The lines a dry run and the start of a real run print."""
    lines = [
        f"[estimate] this study will take about {human(est['total_s'])} on this machine: "
        f"{human(est['trials_s'])} of trials ({_planned(est, trials)}) + "
        f"{human(est['setup_s'])} of calibrations, collectives and report "
        "(environment and image builds not included)"
    ]
    adaptive = est.get("adaptive")
    if adaptive:
        low = est.get("planned_trials", len(est["experiments"]) * trials)
        extra = est.get("adaptive_experiments", len(est["experiments"]))
        high = low + extra * (adaptive["max_trials"] - trials)
        lines.append(
            f"[estimate] adaptive rounds: {low} to {high} trials "
            f"({trials} to {adaptive['max_trials']} per experiment: more only where a "
            "comparison is still undecided or the headline's is not yet within the "
            f"margin), so about {human(est['total_s'])} to "
            f"{human(adaptive['total_s'])}"
        )
    resumed = est["remaining_trials_s"] < est["trials_s"]
    if resumed:
        lines.append(
            f"[estimate] trials without a record yet: about {human(est['remaining_trials_s'])}"
        )
    for name, g in sorted(est["groups"].items(), key=lambda kv: -kv[1]["seconds"]):
        n = g["trials"]
        text = f"[estimate]   {name}: {human(g['seconds'])} ({_trials(n)})"
        left = g.get("left_trials", n)
        if resumed and not left:
            text += ", every trial done"
        elif resumed and left < n:
            text += f", {human(g['left_s'])} of it left ({_trials(left)} without a record)"
        lines.append(text)
    slow = _bf16_line(est)
    if slow:
        lines.append(slow)
    lines.append(f"[estimate] basis: {'; '.join(est['basis'])} (rough: see the report)")
    return "\n".join(lines)


def _trials(n: int) -> str:
    return f"{n} trial{'' if n == 1 else 's'}"


def _bf16_line(est: Mapping) -> str | None:
    """Where bf16 trains slower than fp32 (as where it is emulated: no AVX-512 BF16 or
    AMX), what the bf16 runs cost of the trials, so that a user can leave them out to
    fit a budget."""
    bf16 = est.get("bf16") or {}
    ratio = bf16.get("ratio")
    if not ratio or ratio[0] <= 1 or not bf16.get("experiments"):
        return None
    low, high = (f"{r:.1f}x" if r < 10 else f"{r:.0f}x" for r in ratio)
    times = low if low == high else f"{low} to {high}"
    n = bf16["experiments"]
    why = "" if bf16.get("native") else ": emulated, this CPU has no AVX-512 BF16 or AMX"
    return (
        f"[estimate] bf16 trains slower than fp32 here (a step {times} fp32's{why}): "
        f"its {n} {'run takes' if n == 1 else 'runs take'} about {human(bf16['seconds'])} of the "
        f"{human(est['trials_s'])} of trials"
    )


def _planned(est: Mapping, trials: int) -> str:
    """``318 trials: 2 per experiment, 1 where ...``: what the trials' estimate counts."""
    n = est.get("planned_trials", len(est["experiments"]) * trials)
    text = f"{n} trials: {trials} per experiment"
    fewer = [e for e in est["experiments"].values() if e.get("trials", trials) < trials]
    if fewer:
        far_n = len(est.get("far") or ())
        text += f", fewer for {len(fewer)}"
        parts = []
        if far_n:
            parts.append(f"{far_n} predicted far slower than their baseline: 1 trial")
        if len(fewer) > far_n:
            parts.append("a seed sweep's seeds: its replicates")
        text += f" ({'; '.join(parts)})"
    return text
