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
