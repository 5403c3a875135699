"""Helpers shared by the report's table sections: seed means, CI cells, run preparation, row marks.

Conventions of every table (docs/design.md §7): verdict = prob ≥ frozen threshold; gate ρ = max(s, 1−s); a row with
several seeds shows the mean over seeds; 95 % CIs are percentile cluster-bootstrap intervals over base items,
every run of a table resampled with the same draws (:func:`sift.evaluation.analysis.bootstrap_vector`).
Every table function reads its runs as views of one aligned
:class:`~sift.evaluation.engine.PredictionTable`: its ``table`` argument (the report passes
``ReportContext.table``), or, when None, the table of the runs it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sift.evaluation.analysis import (
    NAN,
    Items,
    RunData,
    match_calibration,
    num,
)
from sift.evaluation.engine import PredictionTable
from sift.evaluation.predictions import Predictions
from sift.metrics.selective import SelectiveConfig


def as_list(x: Predictions | Sequence[Predictions]) -> list[Predictions]:
    return [x] if isinstance(x, Predictions) else list(x)


def ci_dict(est: float, low: float, high: float) -> dict[str, float | None]:
    return {"estimate": num(est), "low": num(low), "high": num(high)}


def prepare_runs(table: PredictionTable, rows: dict[str, list[Predictions]], axes: list[str], items: Items,
                 sel: SelectiveConfig | None, calib: dict[str, list[Predictions]] | None,
                 paired: bool = True) -> dict[str, list[RunData]]:
    """The table's views of each row's runs (with their pairs if ``paired``), SGR-certified with ``sel`` on the
    matching calibration run (in-sample without one) and indexed by ``items``."""
    out = {}
    for name, lst in rows.items():
        rds = []
        for p in lst:
            rd = table.run_data(p, axes, paired=paired)
            if sel is not None:
                cal = match_calibration(p, calib, name)
                rd.certify(sel, None if cal is None else table.run_data(cal, paired=False))
            rds.append(rd.index(items))
        out[name] = rds
    return out



def nz(x: Any) -> float:
    """None → NaN (for formatting numbers stored JSON-style)."""
    return NAN if x is None else float(x)


#: marks the rows of detectors whose seeds give identical predictions (deterministic fits)
DETERMINISTIC_MARK = "‡"
DETERMINISTIC_NOTE = ("deterministic: every seed gives identical predictions (a convex fit on the same training "
                      "data; the seed only drives initialisation and data order), so the seed-repeat floor is 0 by "
                      "construction. `detector.seed_resample=true` bootstraps the training set per seed to study "
                      "their seed variance.")


UNDERTRAINED_MARK = "⚠"


def undertrained(runs: Sequence[Predictions]) -> str | None:
    """``"undertrained (<preset>)"`` when a run of a row stopped at the epoch cap while still improving
    (``meta['converged'] is False``, from the run's training record) or its preset declares the detector too
    small to reach its full-preset AUROC (``meta['below_full']``), else None."""
    bad = [p for p in runs if p.meta.get("converged") is False or p.meta.get("below_full")]
    if not bad:
        return None
    preset = next((str(p.meta["preset"]) for p in bad if p.meta.get("preset")), "")
    return f"undertrained ({preset})" if preset else "undertrained"


def undertrained_note(labels: dict[str, str]) -> list[str]:
    if not labels:
        return []
    rows = ", ".join(f"{r} ({lab})" for r, lab in labels.items())
    return ["", f"{UNDERTRAINED_MARK} {rows}: training hit the preset's cap while the validation metric was "
                f"still improving (`training.converged = false` in the runs' results.json), or the preset's data "
                f"is too small for the detector to come within 0.05 AUROC of the `full` preset (its "
                f"`undertrained_detectors`, measured); these are the numbers of an undertrained detector, not of "
                f"the method. Use a larger preset for them."]


def deterministic_seeds(runs: Sequence[Predictions]) -> bool:
    """True when ≥ 2 seed runs of a detector give identical probabilities on the same traces."""
    seeded = [p for p in runs if p.seed is not None]
    if len(seeded) < 2:
        return False
    ref = dict(zip(seeded[0].trace_id.tolist(), seeded[0].prob.tolist()))
    for p in seeded[1:]:
        if len(p) != len(ref) or any(ref.get(t) != v for t, v in zip(p.trace_id.tolist(), p.prob.tolist())):
            return False
    return True
