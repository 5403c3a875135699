"""The shortcut controls in the report (docs/design.md §4 "Validity"; issue 11).

* Rows of the controls (the detectors whose registry entry declares ``control``: ``text_bow``, ``surface``,
  ``prompt_probe``, ``text_sift``; :func:`sift.detectors.registry.is_control`) come after the detectors in every
  table, under a group row **controls** (:func:`order_rows`, :func:`with_group_rows`).
* :func:`control_margins`: each detector's in-distribution AUROC minus the best control's (the control with the
  highest seed-mean AUROC on the evaluated split), on the traces both were evaluated on, with a paired
  cluster-bootstrap CI: every replicate resamples the base items once, stratified by split like Table 1's other
  columns (so the number of test items is the same in every replicate), and computes both AUROCs on that
  resample. A detector whose CI does not lie above 0 is flagged.
* :func:`matched_slice_section`: every detector's and control's AUROC, IVR, AS and MFS on the matched-text slice
  (the corpus's ``matched_slice`` flags, :func:`sift.corpus.audit.mark_matched_slice`): traces in the slice
  for the AUROC; pairs with at least one trace in
  the slice for IVR and AS.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sift.detectors.registry import is_control
from sift.evaluation.analysis import (
    NAN,
    Items,
    RunData,
    bootstrap_vector,
    common_items,
    group_runs,
    is_ensemble_row,
    num,
    preserving_axes,
)
from sift.evaluation.engine import PredictionTable, runs_table
from sift.evaluation.predictions import Pairs, Predictions
from sift.metrics import UndefinedMetricWarning
from sift.report import Section, markdown_table
from sift.report.numbers import fmt_cell

GROUP_ROW = "**controls**"
#: the marker of a detector that does not beat the best control (CI of the margin not above 0)
NOT_ABOVE = "✗ not above controls"


def order_rows(rows: Mapping[str, Any]) -> dict[str, Any]:
    """The same rows, detectors first and controls last (each group in its given order)."""
    return {**{k: v for k, v in rows.items() if not is_control(k)}, **{k: v for k, v in rows.items() if is_control(k)}}


def with_group_rows(table: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """Markdown rows with a group row **controls** before the first control row (first cell = row name)."""
    out: list[list[Any]] = []
    seen = False
    for r in table:
        if not seen and r and is_control(str(r[0])):
            if out:  # a table of controls only needs no separator
                out.append([GROUP_ROW] + [""] * (len(r) - 1))
            seen = True
        out.append(list(r))
    return out


def _seed_auc(rds: Sequence[RunData], drawn: np.ndarray | None) -> float:
    v = [rd.stats(drawn)["auroc"] for rd in rds]
    v = [x for x in v if not math.isnan(x)]
    return float(np.mean(v)) if v else NAN


def _common(runs: Sequence[Predictions], others: Sequence[Predictions]) -> np.ndarray:
    ids = None
    for p in [*runs, *others]:
        s = set(p.trace_id.tolist())
        ids = s if ids is None else ids & s
    return np.array(sorted(ids or ()), dtype=object)


def control_margins(rows: Mapping[str, Sequence[Predictions]], n_resamples: int = 1000, seed: int = 0,
                    items: Items | None = None, table: PredictionTable | None = None,
                    strata: np.ndarray | None = None, among: Sequence[str] | None = None
                    ) -> dict[str, dict[str, Any]]:
    """Per detector row: ``{estimate, low, high, best_control, n_traces, beats_controls, reason}`` for AUROC(row) −
    AUROC(best control), seed means, paired cluster bootstrap over base items (``items``: the table's list and
    ``strata`` its split strata (:func:`~sift.evaluation.analysis.split_strata`), so the draws are the table's:
    every replicate keeps each split's number of items; ``table``: the prediction table holding the runs, built
    from them when None; ``among``: the controls to choose the best from, all when None). Empty when there is no
    such control row; control rows get none."""
    ctrl = {k: v for k, v in rows.items() if is_control(k) and not is_ensemble_row(v) and (among is None or k in among)}
    if not ctrl:
        return {}
    items = items or common_items([p for v in rows.values() for p in v])
    if table is None:
        table = runs_table(rows)
    full = {k: _seed_auc([table.run_data(p, paired=False).index(items) for p in v], None) for k, v in ctrl.items()}
    valid = {k: a for k, a in full.items() if not math.isnan(a)}
    out: dict[str, dict[str, Any]] = {}
    for row, runs in rows.items():
        if is_control(row):
            continue
        if not valid:
            out[row] = {"estimate": None, "low": None, "high": None, "best_control": None, "n_traces": 0,
                        "beats_controls": None, "reason": "no control has a defined AUROC"}
            continue
        best = max(valid, key=lambda k: valid[k])
        ids = _common(runs, ctrl[best])
        keep = set(ids.tolist())

        def sub(p, keep=keep):
            kept = np.array([t in keep for t in p.trace_id.tolist()], bool)
            return table.run_data(p, paired=False, keep=kept).index(items)

        det = [sub(p) for p in runs]
        cdat = [sub(p) for p in ctrl[best]]

        def margin(d, det=det, cdat=cdat):
            return np.array([_seed_auc(det, d) - _seed_auc(cdat, d)])

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            est, low, high = bootstrap_vector(margin, len(items), n_resamples, seed, strata=strata)
        e, lo, hi = num(est[0]), num(low[0]), num(high[0])
        reason = None
        if e is None:
            reason = "AUROC undefined on the common traces (one class)"
        beats = None if e is None else bool((lo if lo is not None else e) > 0)
        out[row] = {"estimate": e, "low": lo, "high": hi, "best_control": best, "n_traces": int(len(ids)),
                    "beats_controls": beats, "reason": reason}
    return out


def margin_cell(m: Mapping[str, Any] | None, mark: str = NOT_ABOVE) -> str:
    """``+0.05 [0.01, 0.09] vs <control>`` or ``−0.02 [−0.06, 0.01] vs <control> ✗ not above controls`` (``mark``
    when the CI does not lie above 0; — for a control or undefined)."""
    if not m or m.get("estimate") is None:
        return "—"
    e, lo, hi = (NAN if m.get(k) is None else float(m[k]) for k in ("estimate", "low", "high"))
    s = f"{e:+.3f}" + ("" if math.isnan(lo) else f" [{lo:+.3f}, {hi:+.3f}]") + f" vs {m['best_control']}"
    return s if m.get("beats_controls") else f"{s} {mark}"


# ------------------------------------------------------------------------------------------- the matched slice
def slice_ids_from_corpus(corpus_dir: str | Path) -> set[str]:
    """Trace ids of the matched slice (the records' ``matched_slice`` flag, recomputed for older corpora)."""
    from sift.corpus.audit import in_matched_slice
    from sift.corpus.store import iter_jsonl

    return {str(r["trace_id"]) for _, r in iter_jsonl(Path(corpus_dir) / "traces.jsonl") if in_matched_slice(r)}


def matched_slice_section(runs: Mapping[str, Sequence[Predictions]], pairs: Pairs, slice_ids: set[str], *,
                          n_resamples: int = 1000, seed: int = 0, key: str = "matched_slice",
                          title: str = "Matched-text slice", table: PredictionTable | None = None) -> Section:
    """AUROC, IVR, AS, MFS (full coverage) of every detector and control on the matched slice, seed means with
    95 % cluster-bootstrap CIs over base items; undefined cells are null with their reason."""
    rows = order_rows(group_runs({k: list(v) for k, v in runs.items()}))
    axes = preserving_axes(pairs)

    def in_slice(ids: Any) -> np.ndarray:
        return np.array([str(t) in slice_ids for t in ids], bool)

    if len(pairs):
        either = in_slice(pairs.source_id) | in_slice(pairs.shifted_id)
        spairs = Pairs(*(getattr(pairs, f)[either] for f in ("axis", "kind", "source_id", "shifted_id", "phi_source",
                                                               "phi_shifted", "base_item")))
    else:
        spairs = pairs
    all_preds = [p for v in rows.values() for p in v]
    items = common_items(all_preds, pairs=spairs)
    if table is None:
        table = runs_table(rows, pairs)
    names = ["auroc", "ivr", "as", "mfs"]
    results: dict[str, Any] = {"definition": "cue present, cue ≠ gold answer, answer = cue (sift.corpus.audit)",
                               "pairs": "pairs with at least one trace in the slice", "n_resamples": n_resamples,
                               "detectors": {}}
    md_rows, notes = [], []
    for row, preds in rows.items():
        auc_rd = [table.run_data(p, paired=False, keep=in_slice(p.trace_id)).index(items) for p in preds]
        pair_rd = [table.run_data(p, axes, pairs=spairs).index(items) for p in preds]

        def vec(drawn, auc_rd=auc_rd, pair_rd=pair_rd):
            a = _seed_auc(auc_rd, drawn)
            st = [rd.stats(drawn) for rd in pair_rd]
            def m(k: str) -> float:
                return float(np.nanmean([s[k] for s in st])) if any(not math.isnan(s[k]) for s in st) else NAN

            ivr, as_ = m("ivr"), m("as_")
            return np.array([a, ivr, as_, float(np.nanmean([s["mfs"] for s in st]))
                             if any(not math.isnan(s["mfs"]) for s in st) else NAN])

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed)
        res: dict[str, Any] = {n: {"estimate": num(e), "low": num(lo), "high": num(hi)}
                               for n, e, lo, hi in zip(names, est, low, high)}
        n_tr = [len(rd) for rd in auc_rd]
        labels = np.concatenate([rd.label for rd in auc_rd]) if auc_rd else np.zeros(0)
        n_pres = [int((rd.p_axis >= 0).sum()) for rd in pair_rd]
        n_alt = [int(rd.p_alt.sum()) for rd in pair_rd]
        why = {"auroc": ("no trace of this split is in the slice" if not any(n_tr) else
                         "one φ* class only in the slice" if len(np.unique(labels)) < 2 else None),
               "ivr": None if any(n_pres) else "no verified preserving pair with a trace in the slice",
               "as": None if any(n_alt) else "no verified altering pair with a trace in the slice"}
        why["mfs"] = why["ivr"] or why["as"]
        for n in names:
            if res[n]["estimate"] is None:
                res[n]["reason"] = why[n] or "undefined on these traces"
                notes.append(f"{row} · {n}: {res[n]['reason']}")
        res.update(group="controls" if is_control(row) else "detectors", n_traces=n_tr, n_preserving_pairs=n_pres,
                   n_altering_pairs=n_alt)
        results["detectors"][row] = res
        md_rows.append([row, n_tr[0] if n_tr else 0, *(fmt_cell(res[n]) for n in ("auroc", "ivr", "as", "mfs"))])
    md = [f"Traces whose text looks alike for both mechanisms (organism: the twins, one prompt generated under both "
          f"mechanism latents, that wrote the same ids; real LM: a cue ≠ gold that the answer follows). "
          f"{len(slice_ids)} traces of the corpus are in the slice; "
          f"AUROC on the slice's traces of the evaluated split, IVR/AS/MFS (full coverage) on verified pairs with at "
          f"least one trace in it; {n_resamples} cluster-bootstrap resamples over base items (95 % CI).", "",
          markdown_table(["Detector", "Traces", "AUROC", "IVR", "AS", "MFS"], with_group_rows(md_rows))]
    if notes:
        md += ["", "**Undefined cells (—)**", "", *[f"- {n}" for n in notes]]
    return Section(key, title, "\n".join(md), results=results)
