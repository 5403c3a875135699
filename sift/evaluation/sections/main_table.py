"""Paper Table 1: in-distribution vs transfer AUROC, per-axis IVR, seed-repeat decomposition, IVR/AS/MFS
(full coverage and certified), seed stability."""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sift.detectors.registry import capacity_controls
from sift.errors import SiftError
from sift.evaluation.analysis import (
    NAN,
    RunData,
    bootstrap_vector,
    bound_unit,
    calibration_source,
    check_same_split,
    common_items,
    group_runs,
    is_ensemble_row,
    num,
    preserving_axes,
    seed_mean,
    split_strata,
)
from sift.evaluation.control_rows import (
    NOT_ABOVE,
    control_margins,
    is_control,
    margin_cell,
    order_rows,
    with_group_rows,
)
from sift.evaluation.engine import DEFAULT_OPTIONS, PredictionTable, ReportContext, ReportOptions, runs_table
from sift.evaluation.predictions import Pairs, Predictions
from sift.evaluation.sections.common import (
    DETERMINISTIC_MARK,
    DETERMINISTIC_NOTE,
    UNDERTRAINED_MARK,
    as_list,
    ci_dict,
    deterministic_seeds,
    nz,
    prepare_runs,
    undertrained,
    undertrained_note,
)
from sift.evaluation.sections.registry import ReportSection, register_section
from sift.metrics import (
    UndefinedMetricWarning,
    seed_repeat_decomposition,
)
from sift.report import Section, markdown_table
from sift.report.numbers import fmt, fmt_cell, fmt_ci


def main_table(runs: dict[str, list[Predictions]], pairs: Pairs, *,
               transfer: Mapping[str, Mapping[str, Sequence[Predictions]]] | None = None,
               transfer_in_dist: Mapping[str, Mapping[str, Sequence[Predictions]]] | None = None,
               calib: dict[str, list[Predictions]] | None = None, options: ReportOptions = DEFAULT_OPTIONS,
               key: str = "main_table", title: str = "Main results (Table 1)",
               table: PredictionTable | None = None) -> Section:
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
    selective, n_resamples, seed = options.selective, options.n_resamples, options.seed
    check_same_split(runs)
    rows = order_rows(group_runs(runs))  # detectors, then the shortcut controls (sift.evaluation.control_rows)
    if not rows:
        raise SiftError("main_table: no runs")
    transfer = {k: group_runs({n: as_list(v) for n, v in d.items()}) for k, d in (transfer or {}).items()}
    home = {k: group_runs({n: as_list(v) for n, v in d.items()}) for k, d in (transfer_in_dist or {}).items()}
    settings = list(transfer)
    axes = preserving_axes(pairs)
    flat = lambda d: [p for l in d.values() for p in l]  # noqa: E731
    splits = [flat(rows), *[flat(transfer[s]) for s in settings], *[flat(home[s]) for s in home]]
    items = common_items(*splits)
    strata = split_strata(items, splits)
    if table is None:
        table = runs_table(rows, pairs, [p for s in splits[1:] for p in s] + flat(calib or {}))
    data = prepare_runs(table, rows, axes, items, selective, calib)
    tdata = {s: prepare_runs(table, d, axes, items, None, None, paired=False) for s, d in transfer.items()}
    hdata = {s: prepare_runs(table, d, axes, items, None, None, paired=False) for s, d in home.items()}
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
                ind = seed_mean([s["auroc"] for s in st])
                tr = [seed_mean([t.stats(drawn)["auroc"] for t in trds[s]]) for s in settings]
                trv = [x for x in tr if not math.isnan(x)]
                gap = ind - float(np.mean(trv)) if trv and not math.isnan(ind) else NAN
                own = [seed_mean([h.stats(drawn)["auroc"] for h in hrds[s]]) for s in settings]
                like = [o - t for o, t in zip(own, tr)]  # NaN where either side is missing
                likev = [x for x in like if not math.isnan(x)]
                per = np.array([s["ivr_axes"] for s in st], float) if axes else np.zeros((len(st), 0))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    per_mean = np.nanmean(per, axis=0) if len(st) else np.full(len(axes), NAN)
                return np.array([ind, *tr, gap, *like, float(np.mean(likev)) if likev else NAN, *per_mean,
                                 *[seed_mean([s.get(k, NAN) for s in st]) for k in
                                   ("ivr", "ivr_pooled", "as_", "mfs", "coverage", "cert_ivr", "cert_as",
                                    "cert_mfs")]], float)

            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed, strata=strata)
            res = {n: ci_dict(e, lo, hi) for n, e, lo, hi in zip(names, est, low, high)}
            aucs = [rd.stats()["auroc"] for rd in rds]
            seeds = [rd.run.seed for rd in rds]
            std = float(np.std(aucs, ddof=1)) if len(aucs) > 1 else NAN
            res["seed_stability"] = {"seeds": seeds, "auroc_per_seed": [num(a) for a in aucs],
                                     "mean": num(np.nanmean(aucs)), "std": num(std)}
            res["sgr"] = [{"seed": rd.run.seed, "threshold": num(rd.sgr.threshold), "coverage": num(rd.sgr.coverage),
                           "risk": num(rd.sgr.selective_risk), "bound": num(rd.sgr.bound_value),
                           "feasible": rd.sgr.feasible, "reason": rd.sgr.reason} for rd in rds if rd.sgr is not None]
            res["n_feasible"] = sum(x["feasible"] for x in res["sgr"])
            res["deterministic"] = deterministic_seeds([rd.run for rd in rds])
            res["n_traces"] = [len(rd) for rd in rds]
            res["n_pairs"] = [rd.n_pairs for rd in rds]
            by_reason: dict[str, list[str]] = {}
            for n, why in _undefined_reasons(res, rds, trds, names).items():
                res[n]["reason"] = why
                by_reason.setdefault(why, []).append(n)
            undefined_notes += [f"{row} · {', '.join(cols)}: {why}" for why, cols in by_reason.items()]
            dec = seed_repeat(rds, n_resamples, seed)
            res["seed_repeat"] = dec
            results["detectors"][row] = res
            def g(n: str, res: dict[str, Any] = res) -> str:
                return fmt_cell(res[n])

            res["undertrained"] = undertrained([rd.run for rd in rds])
            mark = f" {DETERMINISTIC_MARK}" if res["deterministic"] else ""
            if res["undertrained"]:
                mark += f" {UNDERTRAINED_MARK} {res['undertrained']}"
            tables["a"].append([row + mark, g("in_dist_auroc"), *[g(f"transfer_auroc/{s}") for s in settings], g("gap"),
                                g("gap_like_for_like")])
            tables["b"].append([row + mark, *[g(f"ivr/{a}") for a in axes], g("ivr"), g("ivr_pooled")])
            tables["d"].append([row + mark, g("ivr"), g("as"), g("mfs"), g("coverage"),
                                f"{res['n_feasible']}/{len(rds)}", g("cert_ivr"), g("cert_as"), g("cert_mfs")])
            if dec.get("raw") is not None:
                ov = fmt_ci(*(dec.get(k) if dec.get(k) is not None else NAN for k in ("overlap", "overlap_low",
                                                                                       "overlap_high")), digits=4)
                tables["c"].append([row + mark, fmt(nz(dec.get("raw"))), fmt(nz(dec.get("floor"))),
                                    fmt(nz(dec.get("shift_attributable"))), ov,
                                    fmt(nz(dec.get("stochastic_fraction")), 2), dec.get("n_seed_pairs", 0)])
            tables["e"].append([row + mark, len(rds), f"{fmt(nz(res['seed_stability']['mean']))} ± "
                                f"{fmt(std)}"])
    # detector − best control, paired bootstrap with the table's split-stratified draws
    margins = control_margins(rows, n_resamples, seed, items, table, strata=strata)
    # against the same-capacity text model alone (the reference detector's network on the tokens)
    cap_rows = capacity_controls(rows)  # registry capacity_control (text_sift)
    cap_name = " / ".join(cap_rows)
    capacity = control_margins(rows, n_resamples, seed, items, table, strata=strata, among=cap_rows)
    for i, row in enumerate(data):
        results["detectors"][row]["group"] = "controls" if is_control(row) else "detectors"
        if margins:
            results["detectors"][row]["margin_over_best_control"] = margins.get(row)
            tables["a"][i].append(margin_cell(margins.get(row)))
        if capacity:
            results["detectors"][row]["margin_over_capacity_control"] = capacity.get(row)
            tables["a"][i].append(margin_cell(capacity.get(row), mark=f"✗ not above {cap_name}"))
    tables = {k: with_group_rows(v) for k, v in tables.items()}
    md = [f"Test split; 95 % CIs in brackets: percentile bootstrap over base items ({n_resamples} resamples; unit: "
          f"base item; a table that mixes splits resamples each split's items within it, so every replicate keeps "
          f"each split's item count). SGR α = {selective.alpha}, δ = {selective.delta}, {bound_unit(selective)}, "
          f"calibrated {results['calibration']}. Rows with several seeds: mean over seeds.", "",
          "**(a) In-distribution vs transfer AUROC**", "",
          markdown_table(["Detector", "In-dist", *[f"Transfer: {s}" for s in settings], "Gap",
                          "Gap (like-for-like)", *(["Δ AUROC vs best control"] if margins else []),
                          *([f"Δ AUROC vs {cap_name} (same capacity)"] if capacity else [])], tables["a"]), "",
          "Gap = the main runs' in-distribution AUROC − mean transfer AUROC (the paper's); like-for-like = mean "
          "over settings of the transfer run's own in-distribution test AUROC − its held-out AUROC.", "",
          "**(b) Per-axis invariance violation rate** (mean = macro mean over axes, the paper's; pooled = all "
          "preserving pairs together)", "",
          markdown_table(["Detector", *axes, "Mean", "Pooled"], tables["b"]) if axes else "_no preserving pairs_",
          "",
          "**(c) Seed-repeat decomposition** (raw = floor + shift-attributable − overlap; the overlap's CI "
          "resamples base items)", "",
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
    md += undertrained_note({r: v["undertrained"] for r, v in results["detectors"].items() if v["undertrained"]})
    if margins:
        ctrl = ", ".join(r for r, v in rows.items() if is_control(r) and not is_ensemble_row(v))
        md += ["", "Δ AUROC vs best control: the detector's in-distribution AUROC minus that of the best shortcut "
               f"control (text only or prompt only: {ctrl}) on the same test traces, paired "
               f"cluster-bootstrap 95 % CI with the table's split-stratified draws (unit: base item); "
               f"\"{NOT_ABOVE}\": the CI does not lie above 0."]
    if capacity:
        md += ["", f"Δ AUROC vs {cap_name} (same capacity): the same paired difference against "
               f"{cap_name} alone, the reference detector's own network, objective and schedule reading only "
               "the tokens: a detector above it reads the states for more than a text model of its size finds in "
               "the words."]
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
    rds = [rd for rd in rds if rd.run.seed is not None]
    if len(rds) < 2:
        return {"reason": "needs >= 2 seed runs", "n_seed_pairs": 0}
    s1, s2, sh, grp = [], [], [], []
    for a, b in itertools.combinations(rds, 2):
        ib = b.row_of()
        pres = a.p_axis >= 0
        src_ids = a.trace_id[a.p_src[pres]]
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


@register_section
class MainTable(ReportSection):
    """Table 1 of the detectors (:attr:`ReportContext.primary`), with transfer settings and SGR calibration."""

    name = "main_table"
    order = 10

    def build(self, ctx: ReportContext) -> list[Section]:
        return [main_table(ctx.primary, ctx.pairs, transfer=ctx.transfer or None, transfer_in_dist=ctx.home or None,
                           calib=ctx.calib, options=ctx.options, table=ctx.table)]
