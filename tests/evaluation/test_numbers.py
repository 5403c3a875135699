"""The report's one number formatter (sift.report.numbers)."""

import math

from sift.report.numbers import EN_DASH, fmt, fmt_cell, fmt_ci


def test_fmt():
    assert fmt(0.12345) == "0.123" and fmt(0.12345, 1) == "0.1"
    assert fmt(None) == "—" and fmt(math.nan) == "—" and fmt(math.inf, dash=EN_DASH) == "–"
    assert fmt(3) == "3" and fmt("x") == "x"


def test_fmt_ci_and_cell():
    assert fmt_ci(0.5, 0.4, 0.6) == "0.500 [0.400, 0.600]"
    assert fmt_ci(0.5, None, None) == "0.500" and fmt_ci(0.5, math.nan, 0.6, 2) == "0.50"
    assert fmt_ci(math.nan, math.nan, math.nan) == "—"
    assert fmt_ci(None, 0.0, 0.0, dash=EN_DASH) == "– [0.000, 0.000]"
    assert fmt_cell({"estimate": 0.25, "low": 0.125, "high": 0.5}, 2) == "0.25 [0.12, 0.50]"
    assert fmt_cell({"estimate": None, "low": None, "high": None}) == "—"
