"""Paper Table 3 and Fig. 9: SGR operating points, selective risk by coverage, the coverage-matched
comparison and risk–coverage curves."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

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
    match_calibration,
    num,
    preserving_axes,
    seed_mean,
)
from sift.evaluation.control_rows import with_group_rows
from sift.evaluation.engine import DEFAULT_OPTIONS, PredictionTable, ReportContext, ReportOptions, runs_table
from sift.evaluation.predictions import Pairs, Predictions
from sift.evaluation.sections.common import (
    ci_dict,
    nz,
    prepare_runs,
)
from sift.evaluation.sections.registry import ReportSection, register_section
from sift.metrics import (
    UndefinedMetricWarning,
    benjamini_hochberg,
    risk_upper_bound,
    select_top,
)
from sift.metrics.operating import OperatingPoint
from sift.metrics.selective import SelectiveConfig, selection_counts, top_coverage_counts
from sift.report import Section, markdown_table
from sift.report.numbers import fmt, fmt_ci


def _risk_at(rho: np.ndarray, correct: np.ndarray, coverage: float) -> tuple[float, int, int]:
    if rho.size == 0:
        return NAN, 0, 0
    e, n = top_coverage_counts(rho, correct, coverage)
    return (e / n, e, n) if n else (NAN, 0, 0)


def _bound_at(rd: RunData, coverage: float, delta: float, selective: SelectiveConfig) -> float:
    """One-sided (1 − δ) upper bound on the selective risk of the ⌈κn⌉ most confident traces, with SGR's bound
    (over base items by default: the traces' items, M = the run's largest item; bets tuned at α)."""
    keep = select_top(rd.rho, coverage)
    most = selective.max_traces or int(np.unique(rd.item.astype(str), return_counts=True)[1].max())
    return risk_upper_bound(rd.correct[keep], delta, selective.bound, groups=rd.item[keep],  # type: ignore[arg-type]
                            max_traces=most, tune_at=selective.alpha)


def _excess(rd: RunData, threshold: float, alpha: float, selective: SelectiveConfig) -> str:
    """Why a certified run's selective risk on the evaluated split exceeds α: the one-sided 95 % lower bound on its
    risk over the split's base items (SGR's bound turned around) either reaches α or not."""
    keep = rd.rho >= threshold
    most = selective.max_traces or int(np.unique(rd.item.astype(str), return_counts=True)[1].max())
    low = 1.0 - risk_upper_bound(1 - rd.correct[keep], 0.05, selective.bound, groups=rd.item[keep],  # type: ignore
                                 max_traces=most, tune_at=1.0 - alpha)
    risk = float(np.mean(rd.correct[keep] == 0))
    if low <= alpha:
        return (f"risk {risk:.3f} > α, but its 95 % lower bound over the evaluated items, {low:.3f}, is ≤ α: "
                f"consistent with a population risk ≤ α (sampling noise of the evaluated split)")
    if "base item" in bound_unit(selective):
        return (f"risk {risk:.3f} > α and its 95 % lower bound over the evaluated items, {low:.3f}, is > α: the "
                f"certificate's failure event, of probability ≤ δ = {selective.delta} per certificate")
    return (f"risk {risk:.3f} > α and its 95 % lower bound, {low:.3f}, is > α: the trace-level bound does not "
            f"hold for clustered traces")


def _mfs_at(rd: RunData, prow: np.ndarray, trow: np.ndarray, coverage: float) -> float:
    """MFS at matched coverage κ (:mod:`sift.metrics.operating`: ρ ≥ the ⌈κn⌉-th largest ρ of the traces, ties
    included; κ in MFS is the realised share)."""
    if trow.size == 0:
        return NAN
    return rd.at(OperatingPoint.at_coverage(coverage), trow, prow).mfs


def selective_risk_section(runs: dict[str, list[Predictions]], pairs: Pairs | None = None, *,
                           calib: dict[str, list[Predictions]] | None = None,
                           options: ReportOptions = DEFAULT_OPTIONS, out_dir: str | Path | None = None,
                           q: float = 0.05, key: str = "selective_risk",
                           table: PredictionTable | None = None,
                           title: str = "Certified selective risk and risk–coverage (Table 3, Fig. 9)") -> Section:
    """Paper Table 3 (a), App. C.7.1/C.7.3 and Fig. 9, for every detector row (mean over seeds):

    * SGR at each α in ``selective.alphas`` (threshold t*, coverage, empirical risk, bound);
    * selective risk at fixed coverages (the coverage-κ operating point of :mod:`sift.metrics.operating`: ρ ≥ the
      ⌈κn⌉-th largest ρ, ties included) with its one-sided upper bound (SGR's bound) at δ split over the
      coverages (Bonferroni);
    * risk–coverage curves of all detectors (PNG ``risk_coverage.png`` in ``out_dir``);
    * the coverage-matched comparison at κ = ``selective.match_coverage``: selective
      risk and MFS of every detector, and a
      paired cluster-bootstrap test of R_ref(κ) − R_other(κ) for the ``reference`` detector (the report passes
      the registry's reference detector; default: the first row) against every other row. p = 2·min(P*(d ≤ 0),
      P*(d ≥ 0)) over the bootstrap replicates d (percentile bootstrap test, capped at 1), BH-adjusted.
      The paper smooths curves by monotone regression; here they are shown raw.
    """
    check_same_split(runs)
    selective, n_resamples, seed = options.selective, options.n_resamples, options.seed
    coverages, reference = options.coverages, options.reference
    alphas, match_coverage = selective.alphas, selective.match_coverage
    rows = group_runs(runs)
    axes = preserving_axes(pairs)
    items = common_items([p for lst in rows.values() for p in lst])
    if table is None:
        table = runs_table(rows, pairs, [p for v in (calib or {}).values() for p in v])
    data = prepare_runs(table, rows, axes, items, selective, calib)
    names = list(data)
    if reference is None:
        reference = names[0] if names else None
    elif reference not in data:
        raise SiftError(f"reference detector {reference!r} not among {names}")
    results: dict[str, Any] = {"alphas": list(alphas), "delta": selective.delta, "bound": selective.bound,
                               "coverages": list(coverages), "match_coverage": match_coverage,
                               "reference": reference, "calibration": calibration_source(calib),
                               "detectors": {}, "comparisons": {}}
    d_each = selective.delta / max(len(coverages), 1)
    sgr_rows, cov_rows, match_rows = [], [], []
    excess_notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for name, rds in data.items():
            res: dict[str, Any] = {"sgr": {}, "by_coverage": {}}
            for a in alphas:
                per = []
                for rd in rds:
                    cal = match_calibration(rd.run, calib, name)
                    cal_rd = rd if cal is None else table.run_data(cal, paired=False)
                    r = selective.run(cal_rd.rho, cal_rd.correct, cal_rd.item, a)
                    n_sel, e_sel = selection_counts(rd.rho, 1 - rd.correct, np.array([r.threshold]))
                    cov = float(n_sel[0] / rd.rho.size) if r.feasible else 0.0
                    risk = float(e_sel[0] / n_sel[0]) if n_sel[0] else NAN
                    per.append({"seed": rd.run.seed, "threshold": num(r.threshold), "coverage": num(cov),
                                "risk": num(risk), "bound": num(r.bound_value), "feasible": r.feasible,
                                "reason": r.reason, "n_items": r.n_items})
                    if r.feasible and risk > a:
                        per[-1]["above_alpha"] = _excess(rd, r.threshold, a, selective)
                        excess_notes.append(f"{name} seed {rd.run.seed}, α = {a}: {per[-1]['above_alpha']}")
                res["sgr"][str(a)] = {"runs": per,
                                      "coverage": num(seed_mean([x["coverage"] if x["coverage"] is not None
                                                                  else NAN for x in per])),
                                      "risk": num(seed_mean([x["risk"] if x["risk"] is not None else NAN
                                                              for x in per])),
                                      "bound": num(seed_mean([x["bound"] if x["bound"] is not None else NAN
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
                    r, _, n = _risk_at(rd.rho, rd.correct, c)
                    rr.append(r)
                    bb.append(_bound_at(rd, c, d_each, selective) if n else NAN)
                risks.append(seed_mean(rr))
                bounds.append(seed_mean(bb))
                res["by_coverage"][str(c)] = {"risk": num(risks[-1]), "bound": num(bounds[-1])}
            cov_rows.append([f"{name} risk", *[fmt(r) for r in risks]])
            cov_rows.append([f"{name} bound", *[fmt(b) for b in bounds]])
            grid = np.linspace(0.02, 1.0, 50)
            res["curve"] = {"coverage": grid.tolist(),
                            "risk": [num(seed_mean([_risk_at(rd.rho, rd.correct, c)[0] for rd in rds])) for c in grid]}

            def vec(drawn, rds=rds):
                rk, mf = [], []
                for rd in rds:
                    trow = rd.trace_index.rows(drawn)
                    prow = rd.pair_index.rows(drawn)
                    rk.append(_risk_at(rd.rho[trow], rd.correct[trow], match_coverage)[0])
                    mf.append(_mfs_at(rd, prow, trow, match_coverage))
                return np.array([seed_mean(rk), seed_mean(mf)])

            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed)
            point = OperatingPoint.at_coverage(match_coverage)  # the realised κ: ≥ the nominal one when ρ ties
            kappa = seed_mean([rd.at(point, np.arange(len(rd)), np.arange(rd.n_pairs)).coverage for rd in rds])
            res["matched"] = {"risk": ci_dict(est[0], low[0], high[0]), "mfs": ci_dict(est[1], low[1], high[1]),
                              "coverage": num(kappa)}
            match_rows.append([name, fmt(kappa), fmt_ci(est[0], low[0], high[0]), fmt_ci(est[1], low[1], high[1])])
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
                        return seed_mean([_risk_at(rd.rho[rd.trace_index.rows(drawn)],
                                                    rd.correct[rd.trace_index.rows(drawn)], match_coverage)[0]
                                           for rd in rds])
                    return np.array([r(ref) - r(other)])

                est, low, high = _paired(diff, len(items), n_resamples, seed)
                results["comparisons"][name] = {"difference": ci_dict(est["d"], low, high), "p_value": num(est["p"])}
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
    md = [f"SGR: δ = {selective.delta}, {bound_unit(selective)}, δ split over the candidate grid; the selective "
          f"risk is per trace; calibrated {calibration_source(calib)}; mean over seeds.", "",
          "**SGR operating points**", "",
          markdown_table(["Detector", "α", "Coverage", "Selective risk", "Bound", "Feasible"],
                         with_group_rows(sgr_rows)), "",
          *(["Certified runs whose evaluated-split selective risk exceeds α (the certificate bounds the population "
             "risk; the evaluated split is a finite sample of items):", "", *[f"- {n}" for n in excess_notes], ""]
            if excess_notes else []),
          f"**Selective risk by coverage** (ρ ≥ the ⌈κn⌉-th largest ρ, ties certified; bound = one-sided, SGR's "
          f"bound at δ/{len(coverages)}, unit: {'base item' if 'base item' in bound_unit(selective) else 'trace'}; "
          f"descriptive: the top κ are chosen on the same traces)", "",
          markdown_table(["Detector", *[f"κ={c:g}" for c in coverages]], with_group_rows(cov_rows)), "",
          f"**Coverage-matched comparison at κ = {match_coverage}** (ρ ≥ the ⌈κn⌉-th largest ρ, ties certified: "
          f"*Coverage* is the realised share, above κ for a detector whose scores tie; 95 % percentile bootstrap "
          f"CI over base items)", "",
          markdown_table(["Detector", "Coverage", "Selective risk", "MFS"], with_group_rows(match_rows))]
    if cmp_rows:
        md += ["", f"Paired bootstrap test of the risk difference over base items ({n_resamples} resamples; unit: "
                   f"base item; BH q = {q}):", "",
               markdown_table(["Difference", "Estimate [95% CI]", "p", "p (BH)"], cmp_rows)]
    return Section(key, title, "\n".join(md), figures=figures, results=results)


def _paired(fn, n_items: int, n_resamples: int, seed: int) -> tuple[dict[str, float], float, float]:
    """Bootstrap of a scalar difference: estimate, percentile CI and the two-sided bootstrap p-value."""
    from sift.metrics.bootstrap import bootstrap_p_value, cluster_bootstrap

    est = float(fn(None)[0])
    if n_resamples <= 0 or n_items == 0 or math.isnan(est):
        return {"d": est, "p": NAN}, NAN, NAN
    res = cluster_bootstrap(lambda idx: float(fn(idx)[0]), np.arange(n_items), n_resamples, seed,
                            keep_replicates=True)
    p = bootstrap_p_value(res.replicates)
    if math.isnan(p):
        return {"d": est, "p": NAN}, NAN, NAN
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


@register_section
class SelectiveRisk(ReportSection):
    """Table 3 / Fig. 9 of the detectors; the reference row is ``options.reference`` when it is a row."""

    name = "selective_risk"
    order = 30

    def build(self, ctx: ReportContext) -> list[Section]:
        o = ctx.options
        reference = o.reference if o.reference in group_runs(ctx.primary) else None
        return [selective_risk_section(ctx.primary, ctx.pairs, calib=ctx.calib,
                                       options=replace(o, reference=reference), out_dir=ctx.out_dir, table=ctx.table)]
