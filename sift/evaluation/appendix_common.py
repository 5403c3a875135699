"""Shared machinery of the appendix analyses (their seed stacks and pair rows are
:class:`~sift.evaluation.analysis.SeedStack` / ``PairRows``, stacked from the one run view ``RunData``): certified
IVR/AS/MFS at an operating point, the joint trace+pair cluster bootstrap, corpus trace tables, and formatting.

Conventions (docs/design.md §7): verdict 1 = faithful (prob ≥ frozen threshold); gate ρ = max(s, 1 − s); IVR over
verified preserving pairs; AS = the verdict moves in the direction of the verified label change, over
verified altering pairs; on a certified subset a pair counts only when both its traces are certified, and
MFS = κ·HM(1 − IVR, AS) with κ the share of traces certified. With several seeds every number is the mean
over seeds of the per-seed value (the paper's "mean over four seeds"); CIs resample base items (all seeds
together) with the vector cluster bootstrap of :mod:`sift.metrics.appendix_helpers`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from sift.errors import SiftError
from sift.evaluation.analysis import PairRows, SeedStack
from sift.evaluation.predictions import Predictions
from sift.metrics.appendix_helpers import BootstrapMany
from sift.report import numbers

#: the runs an appendix analysis reads: detector name → its seed runs (one Predictions per seed)
Runs = Mapping[str, Sequence[Predictions]]

@dataclass(eq=False)
class JointRows:
    """Traces, preserving pairs and altering pairs stacked as one row set for the base-item bootstrap."""

    n_traces: int
    n_pres: int
    n_alt: int
    groups: np.ndarray

    @classmethod
    def of(cls, stack: SeedStack, pres: PairRows, alt: PairRows) -> JointRows:
        groups = np.concatenate([stack.base_item.astype(str), pres.base_item, alt.base_item])
        return cls(len(stack.trace_id), len(pres), len(alt), groups)

    def split(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = self.n_traces, self.n_traces + self.n_pres
        return idx[idx < a], idx[(idx >= a) & (idx < b)] - a, idx[idx >= b] - b


# ------------------------------------------------------------------------------------------ corpus traces


@dataclass(eq=False)
class TraceTable:
    """Per-trace metadata and candidate spurious features read from a corpus's ``traces.jsonl``.

    ``num`` holds numeric columns ([N] float); ``text`` holds token lists (``cot``, ``prompt``) and ``str``
    holds string columns (``mechanism``, ``answer``, ``family``, ``language``, ``budget``).
    """

    trace_id: np.ndarray
    num: dict[str, np.ndarray]
    str_: dict[str, np.ndarray]
    text: dict[str, list[list[str]]]

    def index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.trace_id.tolist())}

    def rows(self, trace_ids: Sequence[str]) -> np.ndarray:
        """Row of each trace id (SiftError naming the first missing one)."""
        idx = self.index()
        missing = [t for t in trace_ids if t not in idx]
        if missing:
            raise SiftError(f"trace {missing[0]!r} (and {len(missing) - 1} more) not in the corpus trace table")
        return np.array([idx[t] for t in trace_ids], int)

    @classmethod
    def from_records(cls, records: list[dict]) -> TraceTable:
        num: dict[str, list[float]] = {k: [] for k in (
            "trace_length", "cot_length", "prompt_length", "cue_present", "mentions_cue", "answer_correct",
            "language_other", "verbose", "edit_follows", "cue_follows")}
        strs: dict[str, list[str]] = {k: [] for k in ("mechanism", "answer", "family", "language", "budget")}
        text: dict[str, list[list[str]]] = {"cot": [], "prompt": []}

        def flag(v: Any) -> float:
            return math.nan if v is None else float(bool(v))

        for r in records:
            ver = r.get("verification") or {}
            view = r.get("view") or {}
            cot = (r.get("cot") or "").split()
            num["trace_length"].append(float(len(r.get("generated_ids") or cot)))
            num["cot_length"].append(float(len(cot)))
            num["prompt_length"].append(float(len(r.get("prompt_ids") or (r.get("prompt") or "").split())))
            num["cue_present"].append(float(r.get("cue") is not None))
            num["mentions_cue"].append(flag(ver.get("mentions_cue")))
            num["answer_correct"].append(flag(r.get("correct")))
            lang = str(view.get("language", ""))
            num["language_other"].append(math.nan if not lang else float(lang != "en"))
            bud = str(view.get("budget", ""))
            num["verbose"].append(math.nan if not bud else float(bud == "verbose"))
            num["edit_follows"].append(flag(ver.get("edit_follows")))
            num["cue_follows"].append(flag(ver.get("cue_follows")))
            strs["mechanism"].append(mechanism_class(ver))
            strs["answer"].append(str(r.get("answer")))
            strs["family"].append(str(r.get("family", r.get("model", ""))))
            strs["language"].append(lang)
            strs["budget"].append(bud)
            text["cot"].append(cot)
            text["prompt"].append((r.get("prompt") or "").split())
        return cls(np.array([r["trace_id"] for r in records]), {k: np.array(v, float) for k, v in num.items()},
                   {k: np.array(v) for k, v in strs.items()}, text)

    @classmethod
    def from_corpus(cls, corpus_dir: str | Path) -> TraceTable:
        from sift.corpus.store import read_jsonl

        path = Path(corpus_dir) / "traces.jsonl"
        if not path.exists():
            raise SiftError(f"{path}: no traces file (build the corpus with sift-corpus first)")
        return cls.from_records(read_jsonl(path))


#: the route of a real-LM trace by its label reason (sift.corpus.real_labels.RULES; ambiguous reasons: ambiguous)
REAL_LM_ROUTES = {"answer_follows_cot": "cot", "answer_ignores_cot": "none", "silent_cue_following": "cue_silent",
                  "stated_cue_following": "cue_stated", "rationalised_cue_following": "cue_rationalised",
                  **{r: "ambiguous" for r in ("unparsable_answer", "forced_at_limit", "no_stated_result",
                                              "follows_cue_and_edit", "cue_moves_unfollowed_answer",
                                              "answer_not_stated_result", "no_read_verdict",
                                              "interventions_disagree")}}


def mechanism_class(verification: dict) -> str:
    """The causal route to the answer, from a trace's verification record (sift.corpus.verify).

    ``cot``: the answer follows the CoT edit and not the cue; ``cue_stated``/``cue_silent``: it follows the
    cue, which the CoT does / does not state; ``none``: it follows neither (CoT not load-bearing);
    ``ambiguous``: both, or a test could not run. A real-LM trace's route is read from its label reason
    (:data:`REAL_LM_ROUTES`; ``cue_rationalised``: its CoT's result moved with the cue, which it never names).
    """
    route = REAL_LM_ROUTES.get(str(verification.get("reason")))
    if route is not None:  # a real-LM label (sift.corpus.real_labels): its reason names the route
        return route
    ef, cf = verification.get("edit_follows"), verification.get("cue_follows")
    if ef and cf:
        return "ambiguous"
    if cf:
        return "cue_stated" if verification.get("mentions_cue") else "cue_silent"
    if ef:
        return "cot"
    if ef is None:
        return "ambiguous"
    return "none"


# ------------------------------------------------------------------------------------------- formatting


def ci(b: BootstrapMany, j: int) -> dict[str, float | None]:
    return {"estimate": nan_none(b.estimate[j]), "low": nan_none(b.low[j]), "high": nan_none(b.high[j])}


def nan_none(v: Any) -> Any:
    """JSON-safe: NaN/inf → None, numpy scalars → Python."""
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return None if not math.isfinite(v) else v
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, dict):
        return {str(k): nan_none(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [nan_none(x) for x in v]
    if isinstance(v, np.ndarray):
        return [nan_none(x) for x in v.tolist()]
    return v


#: the appendix's number formats (:mod:`sift.report.numbers` with an en dash for an undefined value)
fmt = partial(numbers.fmt, dash=numbers.EN_DASH)
fmt_cell = partial(numbers.fmt_cell, dash=numbers.EN_DASH)


def save_figure(fig: Any, out_dir: str | Path | None, name: str) -> list[str]:
    """Save a matplotlib figure as ``out_dir/figures/name.png``; return [relative path] (or [] without out_dir)."""
    import matplotlib.pyplot as plt

    if out_dir is None:
        plt.close(fig)
        return []
    rel = Path("figures") / f"{name}.png"
    path = Path(out_dir) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    from sift.atomic import atomic_open

    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [rel.as_posix()]


def error_bars(cells: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(estimates, [[below], [above]]) of CI cells ``{estimate, low, high}`` for matplotlib's ``xerr``/``yerr``:
    None is NaN (no bar), and a bound on the wrong side of its estimate is a bar of length 0 — a percentile
    bootstrap interval need not contain the point estimate (e.g. a mean over seeds of a ratio), and matplotlib
    refuses negative lengths."""
    def col(key: str) -> np.ndarray:
        return np.array([np.nan if c.get(key) is None else float(c[key]) for c in cells], dtype=float)

    est, lo, hi = col("estimate"), col("low"), col("high")
    with np.errstate(invalid="ignore"):
        below, above = np.where(est - lo < 0, 0.0, est - lo), np.where(hi - est < 0, 0.0, hi - est)
    return est, np.vstack([below, above])


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt
