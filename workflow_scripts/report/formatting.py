"""Text for numbers and table cells, shared by the plots' labels and the HTML tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .stats import percentile_ok
from .values import isnan


def fmt_num(x: Any, digits: int | None = None) -> str:
    if isnan(x):
        return ""
    x = float(x)
    if digits is None:
        digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    text = f"{x:,.{digits}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.,") else text  # no "-0.00"


def fmt_spread(median: Any, lo: Any, hi: Any, n: int, digits: int | None = None) -> str:
    if isnan(median):
        return ""
    text = fmt_num(median, digits)
    if n > 1 and not isnan(lo) and not isnan(hi):
        text += f" ({fmt_num(lo, digits)}–{fmt_num(hi, digits)})"
    return text


def fmt_speedup(s: Any, lo: Any = None, hi: Any = None, n: int = 1) -> str:
    if isnan(s):
        return ""
    text = f"{float(s):.2f}×"
    if n > 1 and not isnan(lo) and not isnan(hi):
        text += f" ({float(lo):.2f}–{float(hi):.2f})"
    return text


def fmt_int(x: Any) -> str:
    if isnan(x):
        return ""
    try:
        return str(int(x))
    except (TypeError, ValueError):
        return str(x)


def fmt_text(x: Any) -> str:
    if isnan(x):
        return ""
    if isinstance(x, bool):
        return "yes" if x else "no"
    return str(x)


def fmt_cv(cv: Any) -> str:
    """A coefficient of variation as a percentage ("" with fewer than two trials)."""
    return "" if isnan(cv) else f"{100 * float(cv):.1f}%"


def trials_text(row: Mapping) -> str:
    text = f"{row['n_ok']}/{row['n_trials']}"
    n_noisy = row.get("n_noisy", 0)
    if not isnan(n_noisy) and n_noisy:
        text += f" ({int(n_noisy)} noisy" + (", all used)" if row.get("noisy_used") else ")")
    return text


def used_count(row: Mapping) -> int:
    n = row.get("n_used", row.get("n_ok", 0))
    return 0 if isnan(n) else int(n)


def steps_text(row: Mapping) -> str:
    """``8``, or ``3 of 8 (time budget)`` for a run cut short, or ``n/a``."""
    timed, steps = row.get("steps_timed"), row.get("steps")
    epochs = row.get("epochs")
    if not isnan(epochs) and float(epochs or 0) > 0:
        return f"{int(timed)} ({int(epochs)} epochs)" if not isnan(timed) else "n/a"
    if isnan(timed):
        return "n/a" if isnan(steps) else f"{int(steps)} asked (not recorded)"
    text = str(int(timed))
    if not isnan(steps) and timed < steps:
        text += f" of {int(steps)} ({cut_reason(row)})"
    return text


def cut_reason(row: Mapping) -> str:
    """Why a run timed fewer steps than it asked for, in words."""
    reason = str(row.get("stop_reason") or "")
    if reason == "precision":
        return "step time known within step_precision"
    if reason == "far_from_baseline":
        return "already beyond far_stop of its baseline"
    return "time budget" if (row.get("n_budget_hit") or 0) else "stopped early"


def percentile_text(value: Any, name: str, row: Mapping, digits: int = 3) -> str:
    """A step-time percentile, or ``n/a (8 steps)`` when too few timed steps back it."""
    steps = row.get("steps_timed")
    if isnan(steps):
        steps = row.get("steps")
    if isnan(value):
        return "n/a"
    if not percentile_ok(name, steps):
        return f"n/a ({int(steps)} steps)"
    return fmt_num(value, digits)


def fmt_usd(value: Any) -> str:
    if isnan(value):
        return "n/a"
    return f"${float(value):,.2f}" if float(value) >= 0.1 else f"${float(value):.3g}"
