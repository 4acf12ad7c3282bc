"""The one test for a missing value that every report module shares (NaN, None, NA)."""

from __future__ import annotations

from typing import Any

import pandas as pd


def isnan(x: Any) -> bool:
    """True for None, NaN and pandas' NA; False for anything else (junk included)."""
    try:
        return x is None or bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


#: what makes a spreadsheet read a cell as a formula (OWASP's CSV injection list)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _safe_cell(value: Any) -> Any:
    if not isinstance(value, str) or not value.startswith(FORMULA_START):
        return value
    try:
        float(value)  # a number written as text is no formula
        return value
    except ValueError:
        return "'" + value


def spreadsheet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every free-text cell that a spreadsheet would read as a formula
    (``=``, ``+``, ``-``, ``@``, a tab or carriage return first) quoted with ``'``, as a
    spreadsheet's own escape; numbers and other cells as they are."""
    out = frame.copy()
    for column in out.columns:
        kind = out[column].dtype
        if pd.api.types.is_object_dtype(kind) or pd.api.types.is_string_dtype(kind):
            out[column] = out[column].map(_safe_cell)
    return out
