"""Text for numbers and table cells, shared by the plots' labels and the HTML tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .stats import _isnan


def fmt_num(x: Any, digits: int | None = None) -> str:
    if _isnan(x):
        return ""
    x = float(x)
    if digits is None:
        digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    text = f"{x:,.{digits}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.,") else text  # no "-0.00"


def fmt_spread(median: Any, lo: Any, hi: Any, n: int, digits: int | None = None) -> str:
    if _isnan(median):
        return ""
    text = fmt_num(median, digits)
    if n > 1 and not _isnan(lo) and not _isnan(hi):
        text += f" ({fmt_num(lo, digits)}–{fmt_num(hi, digits)})"
    return text


def fmt_speedup(s: Any, lo: Any = None, hi: Any = None, n: int = 1) -> str:
    if _isnan(s):
        return ""
    text = f"{float(s):.2f}×"
    if n > 1 and not _isnan(lo) and not _isnan(hi):
        text += f" ({float(lo):.2f}–{float(hi):.2f})"
    return text


def fmt_int(x: Any) -> str:
    if _isnan(x):
        return ""
    try:
        return str(int(x))
    except (TypeError, ValueError):
        return str(x)


def fmt_text(x: Any) -> str:
    if _isnan(x):
        return ""
    if isinstance(x, bool):
        return "yes" if x else "no"
    return str(x)


def fmt_cv(cv: Any) -> str:
    """A coefficient of variation as a percentage ("" with fewer than two trials)."""
    return "" if _isnan(cv) else f"{100 * float(cv):.1f}%"


def _trials(row: Mapping) -> str:
    text = f"{row['n_ok']}/{row['n_trials']}"
    n_noisy = row.get("n_noisy", 0)
    if not _isnan(n_noisy) and n_noisy:
        text += f" ({int(n_noisy)} noisy" + (", all used)" if row.get("noisy_only") else ")")
    return text


def _n_used(row: Mapping) -> int:
    n = row.get("n_used", row.get("n_ok", 0))
    return 0 if _isnan(n) else int(n)
