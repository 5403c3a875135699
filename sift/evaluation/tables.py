"""Report sections of the paper's main analyses (Tables 1, 2, 3, 4, 8 and Fig. 9), as :class:`sift.report.Section`.

Inputs are :class:`~sift.evaluation.predictions.Predictions` (one detector run's per-trace P(faithful) on one
split, threshold frozen on validation) and the verified :class:`~sift.evaluation.predictions.Pairs`:

* ``runs: dict[str, list[Predictions]]`` — detector name → its per-seed runs on the test split; ensembles are
  runs with ``seed=None`` (shown as ``"<name> (ensemble)"`` rows, see :func:`analysis.group_runs`).
* ``transfer: dict[str, dict[str, list[Predictions]]]`` — transfer setting (e.g. ``"cross-domain"``) →
  detector name → runs of the same detectors on that shifted split (optional).
* ``calib: dict[str, list[Predictions]]`` — the same runs on the calibration split (``"calib"``: validation
  items held out from checkpoint selection and the threshold, DESIGN §7), used to calibrate the SGR threshold
  (optional; without it SGR is computed in-sample on the evaluated split, as the paper's Table 3 does, and the
  report says that this is not a certificate).

Conventions (DESIGN §7): verdict = prob ≥ frozen threshold; gate ρ = max(s, 1−s); IVR per preserving axis and
their unweighted mean; AS over verified altering pairs; MFS = κ·2(1−IVR)·AS/((1−IVR)+AS) with κ = 1 ("full
coverage", as the paper's Table 8) and, on the certified subset (pairs whose both traces have ρ ≥ t*), with
κ = SGR coverage. A row with several seeds shows the mean over seeds; 95 % CIs are percentile cluster-bootstrap
intervals over base items (1,000 resamples by default), every run of a table resampled with the same draws,
and the SGR threshold held fixed (CIs are conditional on the calibration). Each section's ``results`` holds
every number shown.
"""

from __future__ import annotations

import itertools
import math
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from sift.errors import SiftError
from sift.evaluation.analysis import (NAN, Items, RunData, SelectiveConfig, bootstrap_vector, calibration_source,
                                      check_same_split, common_items, fmt, fmt_ci, group_runs,
                                      match_calibration, num, preserving_axes, split_strata)
from sift.evaluation.controls import (NOT_ABOVE, control_margins, is_control, margin_cell, order_rows,
                                      with_group_rows)
from sift.evaluation.predictions import Pairs, Predictions, average
from sift.metrics import (UndefinedMetricWarning, benjamini_hochberg, mcnemar, risk_upper_bound,
                          seed_repeat_decomposition, select_top)
from sift.metrics.classification import auroc_kernel
from sift.metrics.invariance import mfs_compute
from sift.report import Section, markdown_table

DEFAULT_COVERAGES = (0.05, 0.25, 0.45, 0.65, 0.85, 1.00)  # paper Table 3 (a)


def _as_list(x: Predictions | Sequence[Predictions]) -> list[Predictions]:
    return [x] if isinstance(x, Predictions) else list(x)


def _ci_dict(est: float, low: float, high: float) -> dict[str, float | None]:
    return {"estimate": num(est), "low": num(low), "high": num(high)}


def _prepare(rows: dict[str, list[Predictions]], pairs: Pairs | None, axes: list[str], items: Items,
             sel: SelectiveConfig | None, calib: dict[str, list[Predictions]] | None) -> dict[str, list[RunData]]:
    out = {}
    for name, lst in rows.items():
        rds = []
        for p in lst:
            rd = RunData(p, axes).attach_pairs(pairs)
            if sel is not None:
                rd.certify(sel, match_calibration(p, calib, name))
            rds.append(rd.index(items))
        out[name] = rds
    return out


def nz(x: Any) -> float:
    """None → NaN (for formatting numbers stored JSON-style)."""
    return NAN if x is None else float(x)


def _seed_mean(vals: list[float]) -> float:
    v = [x for x in vals if x is not None and not math.isnan(x)]
    return float(np.mean(v)) if v else NAN


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


def _undertrained_note(labels: dict[str, str]) -> list[str]:
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


# ================================================================================================ Table 1
def main_table(runs: dict[str, list[Predictions]], pairs: Pairs, *,
               transfer: Mapping[str, Mapping[str, Sequence[Predictions]]] | None = None,
               transfer_in_dist: Mapping[str, Mapping[str, Sequence[Predictions]]] | None = None,
               calib: dict[str, list[Predictions]] | None = None, selective: SelectiveConfig = SelectiveConfig(),
               n_resamples: int = 1000, seed: int = 0, key: str = "main_table",
               title: str = "Main results (Table 1)") -> Section:
    """Paper Table 1: (a) in-distribution vs transfer AUROC and gap, (b) per-axis IVR (macro mean over axes and
    pooled over pairs), (c) seed-repeat decomposition, (d) IVR, AS, MFS (full coverage) and SGR coverage with
    certified IVR/AS/MFS, (e) seed stability (mean ± std of in-distribution AUROC over seeds, sample std ddof = 1).

    Transfer gap (the paper's) = the main runs' in-distribution AUROC − mean of the transfer settings'
    AUROCs. Like-for-like gap = mean over settings of (the transfer run's own in-distribution test AUROC − its
    held-out AUROC); ``transfer_in_dist`` (setting → detector → the transfer runs' in-distribution test
    predictions) enables it. Certified columns: a seed whose SGR is infeasible certifies nothing, so it counts
    with coverage 0 and certified MFS 0; certified IVR/AS average the feasible seeds (n feasible/n shown). The
    bootstrap resamples the base items of the evaluated splits, stratified so that every replicate keeps each
    split's number of items. The seed-repeat
    decomposition (App. E.1) uses every unordered pair of seeds (i, j) of a detector on the preserving pairs
    (c, c'): S = 1[φ̂_i(c) ≠ φ̂_j(c)], T = 1[φ̂_i(c) ≠ φ̂_i(c')], averaged over seed pairs, with a
    cluster-bootstrap CI on the overlap; it needs ≥ 2 seeds.
    """
    check_same_split(runs)
    rows = order_rows(group_runs(runs))  # detectors, then the shortcut controls (sift.evaluation.controls)
    if not rows:
        raise SiftError("main_table: no runs")
    transfer = {k: group_runs({n: _as_list(v) for n, v in d.items()}) for k, d in (transfer or {}).items()}
    home = {k: group_runs({n: _as_list(v) for n, v in d.items()}) for k, d in (transfer_in_dist or {}).items()}
    settings = list(transfer)
    axes = preserving_axes(pairs)
    flat = lambda d: [p for l in d.values() for p in l]  # noqa: E731
    splits = [flat(rows), *[flat(transfer[s]) for s in settings], *[flat(home[s]) for s in home]]
    items = common_items(*splits)
    strata = split_strata(items, splits)
    data = _prepare(rows, pairs, axes, items, selective, calib)
    tdata = {s: _prepare(d, None, axes, items, None, None) for s, d in transfer.items()}
    hdata = {s: _prepare(d, None, axes, items, None, None) for s, d in home.items()}
    results: dict[str, Any] = {"axes": axes, "transfer_settings": settings, "n_resamples": n_resamples,
                               "alpha": selective.alpha, "delta": selective.delta, "bound": selective.bound,
                               "calibration": calibration_source(calib), "n_items": len(items),
                               "detectors": {}}
    names = ["in_dist_auroc", *[f"transfer_auroc/{s}" for s in settings], "gap",
             *[f"gap_like_for_like/{s}" for s in settings], "gap_like_for_like",
             *[f"ivr/{a}" for a in axes], "ivr", "ivr_pooled", "as", "mfs", "coverage", "cert_ivr", "cert_as",
             "cert_mfs"]
    tables = {"a": [], "b": [], "d": [], "c": [], "e": []}
    undefined_notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for row, rds in data.items():
            trds = {s: tdata[s].get(row, []) for s in settings}
            hrds = {s: hdata.get(s, {}).get(row, []) for s in settings}

            def vec(drawn: np.ndarray | None, rds=rds, trds=trds, hrds=hrds) -> np.ndarray:
                st = [rd.stats(drawn) for rd in rds]
                ind = _seed_mean([s["auroc"] for s in st])
                tr = [_seed_mean([t.stats(drawn)["auroc"] for t in trds[s]]) for s in settings]
                trv = [x for x in tr if not math.isnan(x)]
                gap = ind - float(np.mean(trv)) if trv and not math.isnan(ind) else NAN
                own = [_seed_mean([h.stats(drawn)["auroc"] for h in hrds[s]]) for s in settings]
                like = [o - t for o, t in zip(own, tr)]  # NaN where either side is missing
                likev = [x for x in like if not math.isnan(x)]
                per = np.array([s["ivr_axes"] for s in st], float) if axes else np.zeros((len(st), 0))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    per_mean = np.nanmean(per, axis=0) if len(st) else np.full(len(axes), NAN)
                return np.array([ind, *tr, gap, *like, float(np.mean(likev)) if likev else NAN, *per_mean,
                                 *[_seed_mean([s.get(k, NAN) for s in st]) for k in
                                   ("ivr", "ivr_pooled", "as_", "mfs", "coverage", "cert_ivr", "cert_as",
                                    "cert_mfs")]], float)

            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed, strata=strata)
            res = {n: _ci_dict(e, lo, hi) for n, e, lo, hi in zip(names, est, low, high)}
            aucs = [rd.stats()["auroc"] for rd in rds]
            seeds = [rd.pred.seed for rd in rds]
            std = float(np.std(aucs, ddof=1)) if len(aucs) > 1 else NAN
            res["seed_stability"] = {"seeds": seeds, "auroc_per_seed": [num(a) for a in aucs],
                                     "mean": num(np.nanmean(aucs)), "std": num(std)}
            res["sgr"] = [{"seed": rd.pred.seed, "threshold": num(rd.sgr.threshold), "coverage": num(rd.sgr.coverage),
                           "risk": num(rd.sgr.selective_risk), "bound": num(rd.sgr.bound_value),
                           "feasible": rd.sgr.feasible, "reason": rd.sgr.reason} for rd in rds if rd.sgr is not None]
            res["n_feasible"] = sum(x["feasible"] for x in res["sgr"])
            res["deterministic"] = deterministic_seeds([rd.pred for rd in rds])
            res["n_traces"] = [len(rd.pred) for rd in rds]
            res["n_pairs"] = [rd.n_pairs for rd in rds]
            by_reason: dict[str, list[str]] = {}
            for n, why in _undefined_reasons(res, rds, trds, names).items():
                res[n]["reason"] = why
                by_reason.setdefault(why, []).append(n)
            undefined_notes += [f"{row} · {', '.join(cols)}: {why}" for why, cols in by_reason.items()]
            dec = seed_repeat(rds, n_resamples, seed)
            res["seed_repeat"] = dec
            results["detectors"][row] = res
            g = lambda n: fmt_ci(*(res[n][k] if res[n][k] is not None else NAN for k in ("estimate", "low", "high")))
            res["undertrained"] = undertrained([rd.pred for rd in rds])
            mark = f" {DETERMINISTIC_MARK}" if res["deterministic"] else ""
            if res["undertrained"]:
                mark += f" {UNDERTRAINED_MARK} {res['undertrained']}"
            tables["a"].append([row + mark, g("in_dist_auroc"), *[g(f"transfer_auroc/{s}") for s in settings], g("gap"),
                                g("gap_like_for_like")])
            tables["b"].append([row + mark, *[g(f"ivr/{a}") for a in axes], g("ivr"), g("ivr_pooled")])
            tables["d"].append([row + mark, g("ivr"), g("as"), g("mfs"), g("coverage"), f"{res['n_feasible']}/{len(rds)}",
                                g("cert_ivr"), g("cert_as"), g("cert_mfs")])
            if dec.get("raw") is not None:
                ov = fmt_ci(*(dec.get(k) if dec.get(k) is not None else NAN for k in ("overlap", "overlap_low",
                                                                                       "overlap_high")), digits=4)
                tables["c"].append([row + mark, fmt(nz(dec.get("raw"))), fmt(nz(dec.get("floor"))),
                                    fmt(nz(dec.get("shift_attributable"))), ov,
                                    fmt(nz(dec.get("stochastic_fraction")), 2), dec.get("n_seed_pairs", 0)])
            tables["e"].append([row + mark, len(rds), f"{fmt(nz(res['seed_stability']['mean']))} ± "
                                f"{fmt(std)}"])
    margins = control_margins(rows, n_resamples, seed, items)  # detector − best control, paired bootstrap
    for i, row in enumerate(data):
        results["detectors"][row]["group"] = "controls" if is_control(row) else "detectors"
        if margins:
            results["detectors"][row]["margin_over_best_control"] = margins.get(row)
            tables["a"][i].append(margin_cell(margins.get(row)))
    tables = {k: with_group_rows(v) for k, v in tables.items()}
    md = [f"Test split; {n_resamples} cluster-bootstrap resamples over base items (95 % CI in brackets); "
          f"SGR α = {selective.alpha}, δ = {selective.delta} ({selective.bound}), calibrated "
          f"{results['calibration']}. Rows with several seeds: mean over seeds.", "",
          "**(a) In-distribution vs transfer AUROC**", "",
          markdown_table(["Detector", "In-dist", *[f"Transfer: {s}" for s in settings], "Gap",
                          "Gap (like-for-like)", *(["Δ AUROC vs best control"] if margins else [])], tables["a"]), "",
          "Gap = the main runs' in-distribution AUROC − mean transfer AUROC (the paper's); like-for-like = mean "
          "over settings of the transfer run's own in-distribution test AUROC − its held-out AUROC.", "",
          "**(b) Per-axis invariance violation rate** (mean = macro mean over axes, the paper's; pooled = all "
          "preserving pairs together)", "",
          markdown_table(["Detector", *axes, "Mean", "Pooled"], tables["b"]) if axes else "_no preserving pairs_",
          "",
          "**(c) Seed-repeat decomposition** (raw = floor + shift-attributable − overlap)", "",
          markdown_table(["Detector", "Raw IVR", "Seed floor", "Shift-attr.", "Overlap [95% CI]",
                          "Floor/raw", "Seed pairs"], tables["c"]) if tables["c"] else "_needs ≥ 2 seeds_", "",
          "**(d) Meta-faithfulness** (full coverage; certified = pairs with both traces ρ ≥ t*, κ = SGR coverage; "
          "a seed with infeasible SGR counts as κ = 0 and MFS cert = 0; IVR/AS cert average the feasible seeds)", "",
          markdown_table(["Detector", "IVR", "AS", "MFS", "Coverage κ", "SGR feasible", "IVR cert", "AS cert",
                          "MFS cert"], tables["d"]), "",
          "**(e) Seed stability** (in-distribution AUROC)", "",
          markdown_table(["Detector", "Seeds", "Mean ± std"], tables["e"])]
    det = [r for r, v in results["detectors"].items() if v["deterministic"]]
    if det:
        md += ["", f"{DETERMINISTIC_MARK} {', '.join(det)}: {DETERMINISTIC_NOTE}"]
    md += _undertrained_note({r: v["undertrained"] for r, v in results["detectors"].items() if v["undertrained"]})
    if margins:
        md += ["", "Δ AUROC vs best control: the detector's in-distribution AUROC minus that of the best shortcut "
               "control (text only or prompt only: text_bow, surface, prompt_probe) on the same test traces, paired "
               f"cluster-bootstrap 95 % CI; \"{NOT_ABOVE}\": the CI does not lie above 0."]
    if undefined_notes:  # every "—" above, with the reason (also under "reason" in results.json)
        md += ["", "**Undefined cells (—)**", "", *[f"- {line}" for line in undefined_notes]]
    return Section(key, title, "\n".join(md), results=results)


def _undefined_reasons(res: dict[str, Any], rds: list[RunData], trds: Mapping[str, list[RunData]],
                       names: Sequence[str]) -> dict[str, str]:
    """Why each main-table column without an estimate is undefined for one detector row."""
    out: dict[str, str] = {}
    sgr = [rd.sgr for rd in rds if rd.sgr is not None]
    for n in names:
        if res[n]["estimate"] is not None:
            continue
        if n.startswith("transfer_auroc/"):
            setting = n.split("/", 1)[1]
            out[n] = (f"no transfer run of this detector for {setting}" if not trds.get(setting)
                      else "AUROC undefined: the transfer split has one class only")
        elif n == "gap":
            out[n] = "no transfer AUROC to compare with"
        elif n.startswith("gap_like_for_like"):
            out[n] = "needs a transfer run's held-out AUROC and its own in-distribution test AUROC"
        elif n.startswith("ivr/"):
            out[n] = f"no verified {n[4:]} pairs whose both traces were evaluated"
        elif n.startswith("cert_"):
            if sgr and not any(r.feasible for r in sgr):
                out[n] = f"nothing certified (coverage 0): {sgr[0].reason}"
            else:
                out[n] = "no pair has both traces certified at the SGR threshold"
        elif n == "in_dist_auroc":
            out[n] = "AUROC undefined: the test split has one class only"
        else:
            out[n] = "undefined on these runs (no verified pairs of the needed kind)"
    return out


def seed_repeat(rds: list[RunData], n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Seed-repeat decomposition (App. E.1) over all unordered seed pairs of one detector's runs (see
    :func:`main_table`); pairs must have both traces in both runs."""
    rds = [rd for rd in rds if rd.pred.seed is not None]
    if len(rds) < 2:
        return {"reason": "needs >= 2 seed runs", "n_seed_pairs": 0}
    s1, s2, sh, grp = [], [], [], []
    for a, b in itertools.combinations(rds, 2):
        ib = b.pred.index()
        pres = a.p_axis >= 0
        src_ids = a.pred.trace_id[a.p_src[pres]]
        rows_b = np.array([ib.get(t, -1) for t in src_ids.tolist()], int)
        ok = rows_b >= 0
        s1.append(a.verdict[a.p_src[pres]][ok])
        s2.append(b.verdict[rows_b[ok]])
        sh.append(a.verdict[a.p_dst[pres]][ok])
        grp.append(a.p_items[pres][ok])
    s1c, s2c, shc = np.concatenate(s1), np.concatenate(s2), np.concatenate(sh)
    if s1c.size == 0:
        return {"reason": "no preserving pairs shared by the seed runs", "n_seed_pairs": len(s1)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        d = seed_repeat_decomposition(s1c, s2c, shc, groups=np.concatenate(grp).astype(str),
                                      n_resamples=max(n_resamples, 1), seed=seed)
    return {"floor": num(d.floor), "shift_attributable": num(d.shift_attributable), "overlap": num(d.overlap),
            "overlap_low": num(d.overlap_low) if n_resamples > 0 else None,
            "overlap_high": num(d.overlap_high) if n_resamples > 0 else None, "raw": num(d.raw),
            "stochastic_fraction": num(d.stochastic_fraction), "n": d.n, "n_seed_pairs": len(s1), "reason": d.reason}


# ================================================================================================ Table 8
def _ensemble_for(name: str, seeds: list[Predictions], val: dict[str, list[Predictions]] | None) -> Predictions:
    """Probability average of ``seeds``; threshold frozen on the averaged validation (selection) predictions
    when ``val`` has every member, else the mean of the members' thresholds (stated in ``meta``)."""
    from sift.detectors.thresholds import fit_threshold

    members = sorted(seeds, key=lambda p: p.seed)
    order = members[0].trace_id
    aligned = []
    for m in members:
        if not np.array_equal(m.trace_id, order):
            idx = m.index()
            m = m.subset(np.array([idx[t] for t in order.tolist()]))
        aligned.append(m)
    cal = [match_calibration(m, val, name) for m in members]
    if all(c is not None for c in cal) and cal:
        cal_avg = average(cal, f"{name} (ensemble)", 0.5)  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            thr = fit_threshold(cal_avg.prob, cal_avg.label, "youden")
        how = "youden on averaged validation predictions"
    else:
        thr = float(np.mean([m.threshold for m in members]))
        how = "mean of the members' thresholds (no validation predictions given)"
    ens = average(aligned, f"{name} (ensemble)", thr)
    ens.meta["threshold_from"] = how
    return ens


def ensemble_table(runs: dict[str, list[Predictions]], pairs: Pairs, *,
                   val: dict[str, list[Predictions]] | None = None, build_missing: bool = True,
                   n_resamples: int = 1000, seed: int = 0, q: float = 0.05, key: str = "ensemble_comparison",
                   title: str = "Ensemble comparison (Table 8)") -> Section:
    """Paper Table 8: IVR, AS, MFS at full coverage of each detector's single-seed runs (mean over seeds) and of
    its seed ensemble, and the gain in MFS. Ensembles are the runs with ``seed=None`` (or detectors named
    ``"<name>_ensemble"``); with ``build_missing`` a detector with ≥ 2 seeds and no ensemble gets the
    probability average of its seeds (:func:`_ensemble_for`; ``val``: the validation predictions that freeze its
    threshold). A run with a seed is always a single-seed run of its own name (e.g. the per-seed
    ``instance_ensemble``). Per detector, a McNemar test compares the
    invariance (verdict kept) of the first seed and of the ensemble on the same preserving pairs, with
    Benjamini–Hochberg at FDR ``q`` across detectors.
    """
    check_same_split(runs)
    singles: dict[str, list[Predictions]] = {}
    ens: dict[str, Predictions] = {}
    for name, lst in runs.items():
        for p in _as_list(lst):
            if p.seed is not None:  # a single-seed run, whatever the name (e.g. the per-seed instance_ensemble)
                singles.setdefault(name, []).append(p)
    for name, lst in runs.items():
        for p in _as_list(lst):
            if p.seed is None:  # a seed ensemble: of `<base>` when named `<base>_ensemble` and `<base>` has seeds
                base = name[: -len("_ensemble")] if name.endswith("_ensemble") else name
                base = base if base in singles else name
                if base in ens:
                    raise SiftError(f"ensemble_table: two seed ensembles of {base!r} (give them distinct names)")
                ens[base] = p
    built = []
    if build_missing:
        for base, lst in singles.items():
            if base not in ens and len(lst) >= 2:
                ens[base] = _ensemble_for(base, lst, val)
                built.append(base)
    names = [n for n in singles if n in ens] + [n for n in ens if n not in singles]
    axes = preserving_axes(pairs)
    items = common_items([p for lst in singles.values() for p in lst] + list(ens.values()))
    results: dict[str, Any] = {"built_here": built, "detectors": {}, "n_resamples": n_resamples}
    rows, pvals, tests = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for name in names:
            sgl = [RunData(p, axes).attach_pairs(pairs).index(items) for p in singles.get(name, [])]
            e = RunData(ens[name], axes).attach_pairs(pairs).index(items)

            def vec(drawn, sgl=sgl, e=e):
                ss = [r.stats(drawn) for r in sgl]
                es = e.stats(drawn)
                single = [_seed_mean([s[k] for s in ss]) for k in ("ivr", "as_", "mfs", "auroc")]
                ensv = [es["ivr"], es["as_"], es["mfs"], es["auroc"]]
                return np.array([*single, *ensv, ensv[2] - single[2], ensv[3] - single[3]], float)

            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed)
            keys = ["single_ivr", "single_as", "single_mfs", "single_auroc", "ensemble_ivr", "ensemble_as",
                    "ensemble_mfs", "ensemble_auroc", "gain", "auroc_gain"]
            res = {k: _ci_dict(a, b, c) for k, a, b, c in zip(keys, est, low, high)}
            res["n_seeds"] = len(sgl)
            res["deterministic"] = deterministic_seeds(singles.get(name, []))
            res["undertrained"] = undertrained(singles.get(name, []) + [ens[name]])
            res["threshold_from"] = ens[name].meta.get("threshold_from", "frozen ensemble threshold")
            test = None
            if sgl:
                test = _invariance_mcnemar(sgl[0], e)
            res["mcnemar_invariance"] = test
            results["detectors"][name] = res
            if test is not None and test.get("p_value") is not None:
                pvals.append(test["p_value"])
                tests.append(name)
            g = lambda k: fmt_ci(*(v if v is not None else NAN for v in res[k].values()))
            mark = f" {DETERMINISTIC_MARK}" if res["deterministic"] else ""
            mark += f" {UNDERTRAINED_MARK} {res['undertrained']}" if res["undertrained"] else ""
            if sgl:
                rows.append([f"{name} (single, {len(sgl)} seeds){mark}", g("single_auroc"), g("single_ivr"),
                             g("single_as"), g("single_mfs"), "—", "—"])
            rows.append([f"{name} (ensemble{', built here' if name in built else ''}){mark}", g("ensemble_auroc"),
                         g("ensemble_ivr"), g("ensemble_as"), g("ensemble_mfs"), g("gain") if sgl else "—", name])
    if pvals:
        bh = benjamini_hochberg(pvals, q)
        for n, p_adj, rej in zip(tests, bh.p_adjusted, bh.reject):
            results["detectors"][n]["mcnemar_invariance"].update(p_bh=num(p_adj), reject_bh=bool(rej))
    for r in rows:
        n = r[-1]
        if n in results["detectors"] and results["detectors"][n].get("mcnemar_invariance"):
            t = results["detectors"][n]["mcnemar_invariance"]
            r[-1] = f"{fmt(t['p_value'] if t['p_value'] is not None else NAN)} (BH {fmt(nz(t.get('p_bh')))})"
        elif r[-1] != "—":
            r[-1] = "—"
    md = ("Full coverage (no abstention), mean over seeds for single runs; 95 % cluster-bootstrap CIs. AUROC of "
          "the seed ensemble = AUROC of the seeds' averaged probabilities. Gain = MFS(ensemble) − MFS(single). "
          "p: McNemar on per-pair invariance, first seed vs ensemble "
          f"(BH-adjusted at q = {q}).\n\n"
          + markdown_table(["Method", "AUROC", "IVR", "AS", "MFS", "Gain (MFS)", "p (invariance)"], with_group_rows(rows)))
    det = [n for n, r in results["detectors"].items() if r["deterministic"]]
    if det:
        md += ("\n\n" + DETERMINISTIC_MARK + " " + ", ".join(det) + ": " + DETERMINISTIC_NOTE
               + " Their seed ensemble therefore equals the single run (gain 0 by construction).")
    md += "\n".join(_undertrained_note({n: r["undertrained"] for n, r in results["detectors"].items()
                                        if r["undertrained"]}))
    return Section(key, title, md, results=results)


def _invariance_mcnemar(a: RunData, b: RunData) -> dict[str, Any] | None:
    """McNemar on 1[verdict kept] over the preserving pairs both runs have (matched by trace ids)."""
    pa = a.p_axis >= 0
    ka = {(s, d): int(a.verdict[i] == a.verdict[j]) for s, d, i, j in
          zip(a.pred.trace_id[a.p_src[pa]].tolist(), a.pred.trace_id[a.p_dst[pa]].tolist(), a.p_src[pa], a.p_dst[pa])}
    pb = b.p_axis >= 0
    kb = {(s, d): int(b.verdict[i] == b.verdict[j]) for s, d, i, j in
          zip(b.pred.trace_id[b.p_src[pb]].tolist(), b.pred.trace_id[b.p_dst[pb]].tolist(), b.p_src[pb], b.p_dst[pb])}
    common = [k for k in ka if k in kb]
    if not common:
        return None
    r = mcnemar([ka[k] for k in common], [kb[k] for k in common])
    return {"p_value": num(r.p_value), "statistic": num(r.statistic), "b": r.b, "c": r.c, "exact": r.exact,
            "n_pairs": len(common), "note": "b = pairs only the single seed keeps; c = only the ensemble keeps"}


# ================================================================================================ Table 3 / Fig. 9
def _risk_at(rho: np.ndarray, correct: np.ndarray, coverage: float) -> tuple[float, int, int]:
    if rho.size == 0:
        return NAN, 0, 0
    keep = select_top(rho, coverage)
    n = int(keep.sum())
    if n == 0:
        return NAN, 0, 0
    e = int(n - correct[keep].sum())
    return e / n, e, n


def _mfs_at(rd: RunData, prow: np.ndarray, trow: np.ndarray, coverage: float) -> float:
    """MFS at matched coverage: the ⌈κn⌉ most confident traces are certified; IVR/AS on pairs with both."""
    if trow.size == 0:
        return NAN
    keep = select_top(rd.rho[trow], coverage)
    certified = np.zeros(len(rd.pred), bool)
    certified[trow[keep]] = True
    sel = certified[rd.p_src[prow]] & certified[rd.p_dst[prow]]
    _, ivr, as_ = rd.pair_rates(prow, sel)
    return mfs_compute(ivr, as_, coverage)


def selective_risk_section(runs: dict[str, list[Predictions]], pairs: Pairs | None = None, *,
                           calib: dict[str, list[Predictions]] | None = None,
                           selective: SelectiveConfig = SelectiveConfig(), alphas: Sequence[float] = (0.25, 0.30),
                           coverages: Sequence[float] = DEFAULT_COVERAGES, match_coverage: float = 0.70,
                           reference: str | None = None, out_dir: str | Path | None = None,
                           n_resamples: int = 1000, seed: int = 0, q: float = 0.05, key: str = "selective_risk",
                           title: str = "Certified selective risk and risk–coverage (Table 3, Fig. 9)") -> Section:
    """Paper Table 3 (a), App. C.7.1/C.7.3 and Fig. 9, for every detector row (mean over seeds):

    * SGR at each α in ``alphas`` (threshold t*, coverage, empirical risk, bound);
    * selective risk at fixed coverages (the ⌈κn⌉ most confident traces, ties by position) with its
      one-sided Clopper–Pearson/normal upper bound at δ split over the coverages (Bonferroni);
    * risk–coverage curves of all detectors (PNG ``risk_coverage.png`` in ``out_dir``);
    * the coverage-matched comparison at κ = ``match_coverage``: selective risk and MFS of every detector, and a
      paired cluster-bootstrap test of R_ref(κ) − R_other(κ) for the ``reference`` detector (default: the first
      row whose name starts with "sift", else the first) against every other row. p = 2·min(P*(d ≤ 0),
      P*(d ≥ 0)) over the bootstrap replicates d (percentile bootstrap test, capped at 1), BH-adjusted.
      The paper smooths curves by monotone regression; here they are shown raw.
    """
    check_same_split(runs)
    rows = group_runs(runs)
    axes = preserving_axes(pairs)
    items = common_items([p for lst in rows.values() for p in lst])
    data = _prepare(rows, pairs, axes, items, selective, calib)
    names = list(data)
    if reference is None:
        reference = next((n for n in names if n.lower().startswith("sift")), names[0] if names else None)
    elif reference not in data:
        raise SiftError(f"reference detector {reference!r} not among {names}")
    results: dict[str, Any] = {"alphas": list(alphas), "delta": selective.delta, "bound": selective.bound,
                               "coverages": list(coverages), "match_coverage": match_coverage,
                               "reference": reference, "calibration": calibration_source(calib),
                               "detectors": {}, "comparisons": {}}
    d_each = selective.delta / max(len(coverages), 1)
    sgr_rows, cov_rows, match_rows = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for name, rds in data.items():
            res: dict[str, Any] = {"sgr": {}, "by_coverage": {}}
            for a in alphas:
                per = []
                for rd in rds:
                    cal = match_calibration(rd.pred, calib, name) or rd.pred
                    r = selective.run(cal.confidence, cal.correct, a)
                    cov = float(np.mean(rd.rho >= r.threshold)) if r.feasible else 0.0
                    sel_ = rd.rho >= r.threshold
                    risk = float(1 - rd.correct[sel_].mean()) if sel_.any() else NAN
                    per.append({"seed": rd.pred.seed, "threshold": num(r.threshold), "coverage": num(cov),
                                "risk": num(risk), "bound": num(r.bound_value), "feasible": r.feasible,
                                "reason": r.reason})
                res["sgr"][str(a)] = {"runs": per,
                                      "coverage": num(_seed_mean([x["coverage"] if x["coverage"] is not None
                                                                  else NAN for x in per])),
                                      "risk": num(_seed_mean([x["risk"] if x["risk"] is not None else NAN
                                                              for x in per])),
                                      "bound": num(_seed_mean([x["bound"] if x["bound"] is not None else NAN
                                                               for x in per])),
                                      "n_feasible": sum(x["feasible"] for x in per)}
                s = res["sgr"][str(a)]
                sgr_rows.append([name, a, fmt(s["coverage"] if s["coverage"] is not None else NAN),
                                 fmt(s["risk"] if s["risk"] is not None else NAN),
                                 fmt(s["bound"] if s["bound"] is not None else NAN), f"{s['n_feasible']}/{len(per)}"])
            risks, bounds = [], []
            for c in coverages:
                rr, bb = [], []
                for rd in rds:
                    r, e, n = _risk_at(rd.rho, rd.correct, c)
                    rr.append(r)
                    bb.append(risk_upper_bound(e, n, d_each, selective.bound) if n else NAN)  # type: ignore[arg-type]
                risks.append(_seed_mean(rr))
                bounds.append(_seed_mean(bb))
                res["by_coverage"][str(c)] = {"risk": num(risks[-1]), "bound": num(bounds[-1])}
            cov_rows.append([f"{name} risk", *[fmt(r) for r in risks]])
            cov_rows.append([f"{name} bound", *[fmt(b) for b in bounds]])
            grid = np.linspace(0.02, 1.0, 50)
            res["curve"] = {"coverage": grid.tolist(),
                            "risk": [num(_seed_mean([_risk_at(rd.rho, rd.correct, c)[0] for rd in rds])) for c in grid]}

            def vec(drawn, rds=rds):
                rk, mf = [], []
                for rd in rds:
                    trow = rd.trace_index.rows(drawn)
                    prow = rd.pair_index.rows(drawn)
                    rk.append(_risk_at(rd.rho[trow], rd.correct[trow], match_coverage)[0])
                    mf.append(_mfs_at(rd, prow, trow, match_coverage))
                return np.array([_seed_mean(rk), _seed_mean(mf)])

            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed)
            res["matched"] = {"risk": _ci_dict(est[0], low[0], high[0]), "mfs": _ci_dict(est[1], low[1], high[1])}
            match_rows.append([name, fmt_ci(est[0], low[0], high[0]), fmt_ci(est[1], low[1], high[1])])
            results["detectors"][name] = res
        # paired tests against the reference
        comps, pv = [], []
        if reference is not None:
            ref = data[reference]
            for name in names:
                if name == reference:
                    continue
                other = data[name]

                def diff(drawn, ref=ref, other=other):
                    def r(rds):
                        return _seed_mean([_risk_at(rd.rho[rd.trace_index.rows(drawn)],
                                                    rd.correct[rd.trace_index.rows(drawn)], match_coverage)[0]
                                           for rd in rds])
                    return np.array([r(ref) - r(other)])

                est, low, high = _paired(diff, len(items), n_resamples, seed)
                results["comparisons"][name] = {"difference": _ci_dict(est["d"], low, high), "p_value": num(est["p"])}
                comps.append(name)
                pv.append(est["p"])
        if pv and not all(math.isnan(p) for p in pv):
            bh = benjamini_hochberg(pv, q)
            for n, pa, rj in zip(comps, bh.p_adjusted, bh.reject):
                results["comparisons"][n].update(p_bh=num(pa), reject_bh=bool(rj))
    figures = []
    if out_dir is not None and names:
        figures.append(_plot_risk_coverage(results, Path(out_dir), selective.alpha if not alphas else alphas[0]))
    cmp_rows = [[f"{reference} − {n}", fmt_ci(*(v if v is not None else NAN for v in c["difference"].values())),
                 fmt(c["p_value"] if c["p_value"] is not None else NAN), fmt(nz(c.get("p_bh")))]
                for n, c in results["comparisons"].items()]
    md = [f"SGR: δ = {selective.delta}, {selective.bound} bound, δ split over the candidate grid; calibrated "
          f"{calibration_source(calib)}; mean over seeds.", "",
          "**SGR operating points**", "",
          markdown_table(["Detector", "α", "Coverage", "Selective risk", "Bound", "Feasible"], with_group_rows(sgr_rows)), "",
          f"**Selective risk by coverage** (top-κ most confident; bound = one-sided {selective.bound} at "
          f"δ/{len(coverages)})", "",
          markdown_table(["Detector", *[f"κ={c:g}" for c in coverages]], with_group_rows(cov_rows)), "",
          f"**Coverage-matched comparison at κ = {match_coverage}** (95 % cluster-bootstrap CI)", "",
          markdown_table(["Detector", "Selective risk", "MFS"], with_group_rows(match_rows))]
    if cmp_rows:
        md += ["", f"Paired cluster-bootstrap test of the risk difference ({n_resamples} resamples, BH q = {q}):", "",
               markdown_table(["Difference", "Estimate [95% CI]", "p", "p (BH)"], cmp_rows)]
    return Section(key, title, "\n".join(md), figures=figures, results=results)


def _paired(fn, n_items: int, n_resamples: int, seed: int) -> tuple[dict[str, float], float, float]:
    """Bootstrap of a scalar difference: estimate, percentile CI and the two-sided bootstrap p-value."""
    from sift.metrics import cluster_bootstrap

    est = float(fn(None)[0])
    if n_resamples <= 0 or n_items == 0 or math.isnan(est):
        return {"d": est, "p": NAN}, NAN, NAN
    res = cluster_bootstrap(lambda idx: float(fn(idx)[0]), np.arange(n_items), n_resamples, seed,
                            keep_replicates=True)
    reps = res.replicates[~np.isnan(res.replicates)] if res.replicates is not None else np.zeros(0)
    if reps.size == 0:
        return {"d": est, "p": NAN}, NAN, NAN
    p = float(min(1.0, 2.0 * min(np.mean(reps <= 0), np.mean(reps >= 0))))
    return {"d": est, "p": p}, res.low, res.high


def _plot_risk_coverage(results: dict[str, Any], out_dir: Path, alpha: float) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    markers = "osD^vP*Xh<>"
    for i, (name, res) in enumerate(results["detectors"].items()):
        c = res["curve"]
        y = [v if v is not None else np.nan for v in c["risk"]]
        line, = ax.plot(c["coverage"], y, marker=markers[i % len(markers)], markevery=7, ms=4, label=name)
        op = res["sgr"].get(str(alpha))
        if op and op["coverage"] and op["risk"] is not None:
            ax.plot([op["coverage"]], [op["risk"]], marker="*", ms=12, color=line.get_color(), mec="k")
    ax.axhline(alpha, ls="--", color="grey", lw=1, label=f"α = {alpha}")
    ax.axvline(results["match_coverage"], ls=":", color="grey", lw=1)
    ax.set_xlabel("coverage κ")
    ax.set_ylabel("selective risk")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Risk–coverage (★ = SGR operating point)")
    fig.tight_layout()
    path = out_dir / "risk_coverage.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path.name


# ================================================================================================ Table 2
#: the test set of a held-out run's own training distribution (its in-distribution test split)
IN_DIST = "in-distribution"


def transfer_matrix(preds: Mapping[tuple[str, str], Predictions | Sequence[Predictions]], *,
                    families: Mapping[str, str] | None = None, order: Sequence[str] | None = None,
                    out_dir: str | Path | None = None, n_resamples: int = 1000, seed: int = 0,
                    key: str = "transfer_matrix", title: str = "Transfer matrix (Table 2)",
                    setting: str = "train → test") -> Section:
    """Paper Table 2: AUROC of a detector trained on ``train_on`` (rows) and tested on ``test_on`` (columns),
    ``preds[(train_on, test_on)]`` = its run(s) (mean over seeds; 95 % cluster-bootstrap CI per cell, each
    cell resampling the base items of its own test split).

    Two layouts. *Square*: the test names are among the train names (e.g. train on domain A, test on B); a
    row's in-distribution cell is its diagonal. *Held-out*: rows such as ``"all but boolean"``, columns
    ``"in-distribution"`` (:data:`IN_DIST`, the run's own in-distribution test split) and the held-out
    names; a row's in-distribution cell is its ``"in-distribution"`` column. Per row: mean transfer = mean of
    the row's other (held-out) cells, gap = in-distribution − mean transfer. ``families`` (name → family)
    adds within-family vs cross-family mean transfer (Table 2 (b)). A heatmap ``<key>.png`` goes to ``out_dir``.
    """
    if not preds:
        raise SiftError("transfer_matrix: no predictions")
    train_names = {a for a, _ in preds}
    test_names = {b for _, b in preds}
    rows_n = list(order) if order else sorted(train_names)
    square = test_names <= set(rows_n)
    if square:
        cols_n = rows_n
    else:
        if IN_DIST in train_names:
            raise SiftError(f"transfer_matrix: {IN_DIST!r} is a test name, not a training set")
        rest = test_names - {IN_DIST}
        cols_n = ([IN_DIST] if IN_DIST in test_names else []) + [c for c in (order or []) if c in rest] + sorted(
            rest - set(order or []))
    n_r, n_c = len(rows_n), len(cols_n)
    home = np.zeros((n_r, n_c), dtype=bool)  # each row's in-distribution cell
    for i, a in enumerate(rows_n):
        js = [j for j, b in enumerate(cols_n) if b == a or b == IN_DIST]
        if len(js) > 1:
            raise SiftError(f"transfer_matrix: row {a!r} has two in-distribution cells ({a!r} and {IN_DIST!r})")
        home[i, js] = True
    mat = np.full((n_r, n_c), NAN)
    lo_m, hi_m = np.full((n_r, n_c), NAN), np.full((n_r, n_c), NAN)
    cells: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for (tr, te), v in preds.items():
            runs = _as_list(v)
            items = common_items(runs)
            idx = [items.index(r.base_item) for r in runs]

            def vec(drawn, runs=runs, idx=idx):
                vals = []
                for r, ix in zip(runs, idx):
                    rows = ix.rows(drawn)
                    vals.append(auroc_kernel(r.prob[rows], r.label[rows]) if rows.size else NAN)
                return np.array([_seed_mean(vals)])

            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed)
            if tr not in rows_n:
                raise SiftError(f"transfer_matrix: training set {tr!r} is not in order={list(order or [])}")
            i, j = rows_n.index(tr), cols_n.index(te)
            mat[i, j], lo_m[i, j], hi_m[i, j] = est[0], low[0], high[0]
            cells[f"{tr}->{te}"] = {**_ci_dict(est[0], low[0], high[0]), "n_seeds": len(runs),
                                    "n_traces": [len(r) for r in runs], "n_items": len(items)}
    rows_md, per_row = [], {}
    for i, a in enumerate(rows_n):
        ind = float(mat[i][home[i]][0]) if home[i].any() else NAN
        tv = mat[i][~home[i]]
        tv = tv[~np.isnan(tv)]
        mt = float(tv.mean()) if tv.size else NAN
        gap = ind - mt if not (math.isnan(ind) or math.isnan(mt)) else NAN
        per_row[a] = {"in_dist": num(ind), "mean_transfer": num(mt), "gap": num(gap)}
        rows_md.append([a, *[fmt_ci(mat[i, j], lo_m[i, j], hi_m[i, j]) for j in range(n_c)], fmt(mt), fmt(gap)])
    diag, offv = mat[home], mat[~home]
    summary = {"mean_in_dist": num(np.nanmean(diag)) if np.any(~np.isnan(diag)) else None,
               "mean_transfer": num(np.nanmean(offv)) if np.any(~np.isnan(offv)) else None}
    summary["gap"] = num(summary["mean_in_dist"] - summary["mean_transfer"]) if None not in summary.values() else None
    layout = "square" if square else "held-out"
    results: dict[str, Any] = {"layout": layout, "train_on": rows_n, "test_on": cols_n,
                               "auroc": [[num(x) for x in r] for r in mat], "cells": cells,
                               "rows": per_row, "summary": summary, "n_resamples": n_resamples}
    where = ("diagonal = in-distribution" if layout == "square" else
             f"'{IN_DIST}' = each run's own in-distribution test split, other columns = held out")
    md = [f"AUROC, rows = trained on, columns = tested on ({setting}); {where}; 95 % cluster-bootstrap CI over "
          f"the base items of each cell's test split. Mean transfer = mean of a row's held-out cells; gap = "
          f"in-distribution − mean transfer.", "",
          markdown_table(["Train \\ Test", *cols_n, "Mean transfer", "Gap"], rows_md), "",
          f"Mean in-distribution {fmt(nz(summary['mean_in_dist']))}, mean transfer "
          f"{fmt(nz(summary['mean_transfer']))}, gap {fmt(summary['gap'] if summary['gap'] is not None else NAN)}."]
    if families:
        fam_rows = []
        fam = lambda nm: families.get(nm)  # noqa: E731
        offc = [(i, j) for i in range(n_r) for j in range(n_c) if not home[i, j] and not math.isnan(mat[i, j])]
        within = [mat[i, j] for i, j in offc if fam(rows_n[i]) is not None and fam(rows_n[i]) == fam(cols_n[j])]
        cross = [mat[i, j] for i, j in offc if fam(rows_n[i]) is not None and fam(cols_n[j]) is not None
                 and fam(rows_n[i]) != fam(cols_n[j])]
        results["families"] = {"within_family": num(np.mean(within)) if within else None,
                               "cross_family": num(np.mean(cross)) if cross else None,
                               "n_within": len(within), "n_cross": len(cross)}
        for f in sorted(set(families.values())):
            w = [mat[i, j] for i, j in offc if fam(rows_n[i]) == f and fam(cols_n[j]) == f]
            c = [mat[i, j] for i, j in offc if fam(rows_n[i]) == f and fam(cols_n[j]) not in (f, None)]
            results["families"][f] = {"within": num(np.mean(w)) if w else None, "cross": num(np.mean(c)) if c else None}
            fam_rows.append([f, fmt(float(np.mean(w)) if w else NAN), fmt(float(np.mean(c)) if c else NAN)])
        md += ["", "**By source family** (mean off-diagonal AUROC)", "",
               markdown_table(["Family", "Within family", "Cross family"], fam_rows)]
    figures = []
    if out_dir is not None:
        figures.append(_plot_matrix(mat, rows_n, cols_n, Path(out_dir), f"{key}.png", title))
    return Section(key, title, "\n".join(md), figures=figures, results=results)


def _plot_matrix(mat: np.ndarray, rows: list[str], cols: list[str], out_dir: Path, fname: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    n_r, n_c = mat.shape
    fig, ax = plt.subplots(figsize=(1.6 + 0.8 * n_c, 0.8 + 0.7 * n_r))
    im = ax.imshow(np.ma.masked_invalid(mat), vmin=0.4, vmax=1.0, cmap="viridis")
    for i in range(n_r):
        for j in range(n_c):
            if not math.isnan(mat[i, j]):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if mat[i, j] < 0.75 else "black")
    ax.set_xticks(range(n_c), cols, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(n_r), rows, fontsize=8)
    ax.set_xlabel("tested on")
    ax.set_ylabel("trained on")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="AUROC")
    fig.tight_layout()
    fig.savefig(out_dir / fname, dpi=120)
    plt.close(fig)
    return fname


# ================================================================================================ Table 4
def ablation_table(ablations: Mapping[str, Sequence[Predictions]], pairs: Pairs, *,
                   transfer: Mapping[str, Sequence[Predictions]] | None = None,
                   calib: dict[str, list[Predictions]] | None = None, reference: str | None = None,
                   selective: SelectiveConfig = SelectiveConfig(), n_resamples: int = 1000, seed: int = 0,
                   key: str = "ablations", title: str = "Ablations (Table 4)") -> Section:
    """Paper Table 4 (a): per variant (ablation name → its seed runs on the test split): in-distribution
    AUROC, IVR, AS, MFS (full coverage), SGR coverage and certified MFS, and — with ``transfer`` (variant →
    runs on the shifted split) — transfer AUROC and gap; relative change of IVR and MFS against ``reference``
    (default: the variant named ``full``/``none``/``Full SIFT``, else the first). Mean over seeds, 95 %
    cluster-bootstrap CIs. ``calib`` (variant → validation runs) calibrates SGR.
    """
    if not ablations:
        raise SiftError("ablation_table: no variants")
    variants = list(ablations)
    if reference is None:
        reference = next((v for v in variants if v.lower() in ("full", "none", "full sift", "sift")), variants[0])
    elif reference not in ablations:
        raise SiftError(f"reference variant {reference!r} not among {variants}")
    axes = preserving_axes(pairs)
    rows = {v: _as_list(ablations[v]) for v in variants}
    trows = {v: _as_list(transfer[v]) for v in variants if transfer and v in transfer}
    splits = [[p for l in rows.values() for p in l], [p for l in trows.values() for p in l]]
    items = common_items(*splits)
    strata = split_strata(items, splits)
    data = _prepare(rows, pairs, axes, items, selective, calib)
    tdata = _prepare(trows, None, axes, items, None, None)
    keys = ["in_dist_auroc", "ivr", "as", "mfs", "coverage", "cert_mfs", "transfer_auroc", "gap"]
    results: dict[str, Any] = {"reference": reference, "variants": {}, "n_resamples": n_resamples}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for v, rds in data.items():
            tr = tdata.get(v, [])

            def vec(drawn, rds=rds, tr=tr):
                st = [rd.stats(drawn) for rd in rds]
                ind = _seed_mean([s["auroc"] for s in st])
                ta = _seed_mean([t.stats(drawn)["auroc"] for t in tr]) if tr else NAN
                return np.array([ind, *[_seed_mean([s[k] for s in st]) for k in
                                        ("ivr", "as_", "mfs", "coverage", "cert_mfs")], ta,
                                 ind - ta if tr else NAN], float)

            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed, strata=strata)
            results["variants"][v] = {k: _ci_dict(a, b, c) for k, a, b, c in zip(keys, est, low, high)}
            results["variants"][v]["n_seeds"] = len(rds)
            results["variants"][v]["undertrained"] = undertrained([rd.pred for rd in rds])
    ref = results["variants"][reference]
    md_rows = []
    for v, res in results["variants"].items():
        for k, rk in (("ivr", "ivr_change"), ("mfs", "mfs_change")):
            a, b = res[k]["estimate"], ref[k]["estimate"]
            res[rk] = num((a - b) / b) if a is not None and b not in (None, 0) else None
        g = lambda k: fmt_ci(*(x if x is not None else NAN for x in res[k].values()))
        pct = lambda x: "—" if x is None else f"{100 * x:+.0f}%"
        lab = f"{v} {UNDERTRAINED_MARK} {res['undertrained']}" if res["undertrained"] else v
        md_rows.append([lab, res["n_seeds"], g("in_dist_auroc"), g("ivr"), pct(res["ivr_change"]), g("as"), g("mfs"),
                        pct(res["mfs_change"]), g("coverage"), g("cert_mfs"),
                        *([g("transfer_auroc"), g("gap")] if trows else [])])
    header = ["Variant", "Seeds", "In-dist", "IVR", "ΔIVR", "AS", "MFS", "ΔMFS", "Coverage κ", "MFS cert",
              *(["Transfer", "Gap"] if trows else [])]
    md = (f"Mean over seeds, 95 % cluster-bootstrap CIs; Δ relative to **{reference}**; MFS at full coverage, "
          f"MFS cert at SGR coverage (α = {selective.alpha}).\n\n" + markdown_table(header, md_rows)
          + "\n".join(_undertrained_note({v: r["undertrained"] for v, r in results["variants"].items()
                                          if r["undertrained"]})))
    return Section(key, title, md, results=results)
