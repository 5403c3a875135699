"""How the report writes a number: fixed decimals, a dash for an undefined value, an optional 95 % CI.

The built-in tables mark an undefined value with an em dash (the default); the appendix analyses pass an en
dash (``dash="–"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

EM_DASH = "—"
EN_DASH = "–"


def undefined(v: Any) -> bool:
    """None, NaN or ±inf."""
    return v is None or (isinstance(v, (float, np.floating)) and not math.isfinite(float(v)))


def fmt(v: Any, digits: int = 3, dash: str = EM_DASH) -> str:
    """A float with ``digits`` decimals, ``dash`` when undefined (None, NaN, inf), anything else as ``str``."""
    if undefined(v):
        return dash
    return f"{v:.{digits}f}" if isinstance(v, (float, np.floating)) else str(v)


def fmt_ci(estimate: Any, low: Any, high: Any, digits: int = 3, dash: str = EM_DASH) -> str:
    """``'0.123 [0.100, 0.150]'``; the estimate alone (or ``dash``) when the interval is undefined, and
    ``'– [0.000, 0.000]'`` when only the estimate is (e.g. no certified pair on the full data, some in the
    resamples)."""
    if undefined(low) or undefined(high):
        return fmt(estimate, digits, dash)
    return f"{fmt(estimate, digits, dash)} [{fmt(low, digits, dash)}, {fmt(high, digits, dash)}]"


def fmt_cell(cell: Mapping[str, Any], digits: int = 3, dash: str = EM_DASH) -> str:
    """:func:`fmt_ci` of a results cell ``{estimate, low, high}``."""
    return fmt_ci(cell.get("estimate"), cell.get("low"), cell.get("high"), digits, dash)
