"""Theorem 4.6 against the data: the IVR lower bound from margins with γ estimated on preserving pairs
(paper App. C.8, Table 3b; Gaussian corollary eq. 30), the audit of its assumptions (App. I, Table 20), and
the spurious-feature correlations with verdict flips (App. C.6, Table 9).
"""

from __future__ import annotations

import difflib
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy.special import erf

from sift.errors import SiftError
from sift.evaluation.analysis import seed_mean
from sift.evaluation.appendix_common import (
    Runs,
    TraceTable,
    ci,
    fmt,
    fmt_cell,
    nan_none,
    pyplot,
    save_figure,
)
from sift.evaluation.engine import PredictionTable, runs_table
from sift.evaluation.predictions import Pairs
from sift.metrics import UndefinedMetricWarning
from sift.metrics.appendix_helpers import cluster_bootstrap_many, partial_correlation, pearson
from sift.metrics.bounds import ivr_floor, slope_through_origin
from sift.metrics.invariance import ivr_compute, ivr_update
from sift.metrics.significance import benjamini_hochberg
from sift.report import Section, markdown_table

#: Assumption-audit thresholds of paper Table 20 (diagnostic ≤ threshold ⇒ the assumption is taken to hold).
ASSUMPTION_THRESHOLDS = {"local_sensitivity": 0.10, "symmetry": 0.05, "independence": 0.20}
_BOUND_FIELDS = ("gamma", "bound_empirical", "bound_gaussian", "observed_ivr", "slack", "b_over_sigma",
                 "local_sensitivity", "symmetry", "independence", "share_unchanged", "n_pairs")


def _trace_feature(traces: TraceTable, name: str, trace_ids: np.ndarray,
                   extra: Mapping[str, Mapping[str, float]] | None = None) -> np.ndarray:
    """Per-trace values of a feature (a numeric TraceTable column or an ``extra`` mapping), NaN if unknown."""
    if extra and name in extra:
        m = extra[name]
        return np.array([float(m.get(t, math.nan)) for t in trace_ids.tolist()], float)
    if name not in traces.num:
        raise SiftError(f"unknown trace feature {name!r}; have {sorted(traces.num)}"
                        + (f" and extra {sorted(extra)}" if extra else ""))
    idx = traces.index()
    rows = np.array([idx.get(t, -1) for t in trace_ids.tolist()], int)
    out = np.full(rows.size, np.nan)
    out[rows >= 0] = traces.num[name][rows[rows >= 0]]
    return out


def _local_sensitivity(delta: np.ndarray, dd: np.ndarray) -> float:
    """Higher-order / first-order term at the smallest perturbation scale (App. I, Assumption 1).

    Fits dD = g1·Δ + g2·Δ² + g3·Δ³ (no intercept) on pairs with Δ ≠ 0 and returns
    RMS(g2·Δ² + g3·Δ³) / RMS(g1·Δ) over the pairs in the lowest tercile of |Δ|. NaN when fewer than
    3 distinct |Δ| values (a binary feature cannot separate the orders) or g1 = 0.
    """
    nz = delta != 0
    d, y = delta[nz], dd[nz]
    if np.unique(np.abs(d)).size < 3 or d.size < 4:
        return math.nan
    x = np.column_stack([d, d ** 2, d ** 3])
    g, *_ = np.linalg.lstsq(x, y, rcond=None)
    small = np.abs(d) <= np.quantile(np.abs(d), 1.0 / 3.0)
    first = np.sqrt(np.mean((g[0] * d[small]) ** 2))
    higher = np.sqrt(np.mean((g[1] * d[small] ** 2 + g[2] * d[small] ** 3) ** 2))
    return float(higher / first) if first > 0 else math.nan


def bound_quantities(prob_src: np.ndarray, prob_dst: np.ndarray, threshold: float, delta: np.ndarray) -> np.ndarray:
    """The Table 3b / Table 20 numbers of one seed on one set of preserving pairs (see theorem_bound_audit)."""
    n = prob_src.size
    if n == 0:
        return np.full(len(_BOUND_FIELDS), np.nan)
    m = prob_src - threshold  # margin m(c) = D(c) − τ of the source trace
    dd = prob_dst - prob_src  # D(c') − D(c)
    # |LS slope through the origin|; when the feature never changes (all Δ = 0) γ is undefined but the band
    # γ|Δ| is 0 whatever γ is, so the floor is ½·P̂[m = 0] (no first-order push)
    gamma = abs(slope_through_origin(delta, dd))
    band = gamma * np.abs(delta) if not math.isnan(gamma) else np.zeros(n)
    sigma = float(np.std(m, ddof=1)) if n > 1 else math.nan
    gauss, emp = ivr_floor(m, band, sigma)
    verdict_src, verdict_dst = prob_src >= threshold, prob_dst >= threshold
    _, ivr = ivr_compute(*ivr_update(verdict_src, verdict_dst))
    slack = ivr / emp if emp and emp > 0 else math.nan
    nz = delta != 0
    pos, neg = int(np.sum(delta > 0)), int(np.sum(delta < 0))
    sym = abs(pos - neg) / (pos + neg) if pos + neg else math.nan
    ind = abs(pearson(np.abs(delta), np.abs(m)))
    b_sigma = float(np.mean(band)) / sigma if sigma > 0 else math.nan
    return np.array([gamma, emp, gauss, ivr, slack, b_sigma, _local_sensitivity(delta, dd), sym, ind,
                     float(np.mean(~nz)), float(n)])


def theorem_bound_audit(
    runs: Runs,
    pairs: Pairs,
    traces: TraceTable,
    out_dir: str | Path | None = None,
    *,
    features: Sequence[str] = ("trace_length", "prompt_length"),
    extra_features: Mapping[str, Mapping[str, float]] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    table: PredictionTable | None = None,
) -> Section:
    """Theorem 4.6 bound versus observed IVR, and the audit of its assumptions (paper App. C.8, App. I).

    For each detector, candidate spurious feature s (a numeric :class:`TraceTable` column such as
    ``trace_length``, the paper's choice, or an ``extra_features`` mapping trace id → value, e.g. a
    trajectory statistic) and preserving axis (and all axes pooled), over the verified preserving pairs
    (c, c′) with s known on both traces:

    - Δ = (s(c′) − s(c)) / SD(s), the standardised change (SD over the detector's evaluated traces);
    - γ = |Σ Δ·(D(c′) − D(c)) / Σ Δ²|, the least-squares slope of eq. 10 / eq. 49 through the origin
      (:func:`sift.metrics.estimate_gamma`, ``"slope"``), D = the detector's P(faithful);
    - margins m(c) = D(c) − τ (frozen threshold) of the pair's source trace;
    - the bound of eq. 12 as its plug-in ½·P̂[|m| ≤ γ|Δ|] ("empirical floor") and the Gaussian corollary
      (eq. 30 averaged over pairs) ½·E[erf(γ|Δ|/(√2σ))] with σ = SD of the margins
      (:func:`sift.metrics.ivr_lower_bound`); the observed IVR on the same pairs; slack = IVR / floor;
    - App. I diagnostics: local sensitivity = higher-order / first-order term at the smallest |Δ| tercile
      of a cubic fit (reconstruction of the paper's under-specified "ratio of first-order to higher-order
      residual variance at the smallest perturbation scale"), symmetry = |n(Δ>0) − n(Δ<0)| / n(Δ≠0),
      independence = |corr(|Δ|, |m(c)|)|, each judged against the paper's thresholds 0.10 / 0.05 / 0.20;
      and the share of pairs whose feature did not change (Δ = 0, no first-order push at all).

    Numbers are seed means with 95 % base-item bootstrap CIs (γ re-estimated in every replicate).
    """
    res: dict = {}
    rows, arows = [], []
    scatter = []
    if table is None:
        table = runs_table(runs, pairs)
    for name, preds in runs.items():
        st = table.stack(name, preds)
        pres = st.pair_rows("preserving")
        res[name] = {}
        for feat in features:
            s = _trace_feature(traces, feat, st.trace_id, extra_features)
            sd = float(np.nanstd(s, ddof=1)) if np.sum(~np.isnan(s)) > 1 else math.nan
            sd = 1.0 if sd == 0 else sd  # a constant feature: Δ = 0 on every pair (floor ½·P̂[m = 0])
            ok = ~np.isnan(s[pres.src]) & ~np.isnan(s[pres.dst])
            pr = pres.subset(ok)
            if len(pr) == 0 or not sd > 0:
                res[name][feat] = {"reason": f"feature {feat!r} unknown on the preserving pairs"}
                continue
            delta = (s[pr.dst] - s[pr.src]) / sd
            groups = sorted(set(pr.axis.tolist())) + ["all"]
            sel = {g: (pr.axis == g) if g != "all" else np.ones(len(pr), bool) for g in groups}
            k = len(_BOUND_FIELDS)

            def stat(idx, st=st, pr=pr, delta=delta, groups=groups, sel=sel, k=k):
                out = []
                for g in groups:
                    j = idx[sel[g][idx]]
                    per = np.array([bound_quantities(st.prob[s_, pr.src[j]], st.prob[s_, pr.dst[j]],
                                                     st.threshold[s_], delta[j]) for s_ in range(st.n_seeds)])
                    out.append([seed_mean(per[:, q]) for q in range(k)])
                return np.concatenate(out)

            b = cluster_bootstrap_many(stat, pr.base_item, n_resamples, seed)
            fres = {}
            for gi, g in enumerate(groups):
                d = {f: ci(b, gi * k + q) for q, f in enumerate(_BOUND_FIELDS)}
                est = {f: d[f]["estimate"] for f in _BOUND_FIELDS}
                d["n_pairs"] = int(b.estimate[gi * k + k - 1])
                d["bound_holds"] = (None if est["observed_ivr"] is None or est["bound_empirical"] is None
                                    else bool(est["observed_ivr"] >= est["bound_empirical"]))
                d["assumptions_hold"] = {a: (None if est[a] is None else bool(est[a] <= t))
                                         for a, t in ASSUMPTION_THRESHOLDS.items()}
                fres[g] = d
                rows.append([name, feat, g, d["n_pairs"], fmt_cell(d["gamma"]), fmt_cell(d["bound_empirical"]),
                             fmt_cell(d["bound_gaussian"]), fmt_cell(d["observed_ivr"]), fmt(est["slack"], 1) + "×"
                             if est["slack"] is not None else "–",
                             {True: "yes", False: "NO", None: "–"}[d["bound_holds"]]])
                flags = d["assumptions_hold"]
                mark = {k: "" if flags[k] in (True, None) else " ✗" for k in flags}
                arows.append([name, feat, g, fmt(est["local_sensitivity"]) + mark["local_sensitivity"],
                              fmt(est["symmetry"]) + ("" if flags["symmetry"] in (True, None) else " ✗"),
                              fmt(est["independence"]) + ("" if flags["independence"] in (True, None) else " ✗"),
                              fmt(est["share_unchanged"])])
                scatter.append((name, feat, g, est["bound_empirical"], est["bound_gaussian"], est["observed_ivr"],
                                est["b_over_sigma"]))
            res[name][feat] = fres
    md = ["Theorem 4.6: IVR ≥ ½·P[|m(c)| ≤ γ|Δ|] with γ fitted on the preserving pairs themselves "
          f"(paper App. C.8, Table 3b; eq. 30 for the Gaussian form). Seed means; 95 % CIs from {n_resamples} "
          "base-item resamples. Slack = observed IVR / empirical floor.", "",
          markdown_table(["detector", "feature s", "axis", "pairs", "γ", "floor ½P̂[|m|≤γ|Δ|]", "Gaussian floor",
                          "observed IVR", "slack", "IVR ≥ floor"], rows), "",
          "Assumption audit (paper App. I, Table 20; ✗ = above the paper's threshold "
          f"{ASSUMPTION_THRESHOLDS['local_sensitivity']} / {ASSUMPTION_THRESHOLDS['symmetry']} / "
          f"{ASSUMPTION_THRESHOLDS['independence']}). Local sensitivity: higher-/first-order term at the smallest "
          "|Δ| tercile of a cubic fit (NaN for features with < 3 distinct |Δ|).", "",
          markdown_table(["detector", "feature s", "axis", "local sensitivity", "symmetry", "independence",
                          "share Δ = 0"], arows)]
    figs = []
    if out_dir is not None and scatter:
        plt = pyplot()
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
        for name, feat, g, emp, _gauss, ivr, _ in scatter:
            if emp is None or ivr is None:
                continue
            ax1.scatter(emp, ivr, s=40 if g == "all" else 12, marker="o" if g == "all" else ".",
                        color=f"C{list(runs).index(name) % 10}",
                        label=name if g == "all" and feat == features[0] else None)
        hi = max([v for t in scatter for v in (t[3], t[5]) if v is not None] + [0.05])
        ax1.plot([0, hi], [0, hi], "k--", lw=0.8)
        ax1.set_xlabel("Theorem 4.6 floor ½P̂[|m| ≤ γ|Δ|]"), ax1.set_ylabel("observed IVR")
        ax1.set_title("bound vs observed (large = all axes)"), ax1.legend(fontsize=7)
        x = np.linspace(0, 3, 200)
        ax2.plot(x, 0.5 * erf(x / math.sqrt(2)), "k-", lw=1, label="½ erf(b/(√2σ)) (eq. 30)")
        for name, feat, g, _emp, _gauss, ivr, bs in scatter:
            if g == "all" and bs is not None and ivr is not None:
                ax2.scatter(min(bs, 3), ivr, color=f"C{list(runs).index(name) % 10}", s=25)
                ax2.annotate(f"{name}/{feat}", (min(bs, 3), ivr), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax2.set_xlabel("b/σ = γ·mean|Δ| / SD(m)"), ax2.set_ylabel("IVR"), ax2.legend(fontsize=7)
        ax2.set_title("Gaussian corollary and observed IVR")
        figs = save_figure(fig, out_dir, "appendix_theorem_bound")
    results = nan_none({"features": list(features), "thresholds": ASSUMPTION_THRESHOLDS, "n_resamples": n_resamples,
                        "detectors": res})
    return Section("appendix_theorem_bound", "Theorem 4.6 bound and assumption audit (App. C.8, I)", "\n".join(md),
                   figs, results)


# ============================================================================ spurious features (C.6)


def _jaccard_change(a: list[str], b: list[str]) -> float:
    sa, sb = set(a), set(b)
    return 1.0 - len(sa & sb) / len(sa | sb) if sa | sb else 0.0


_VALUE_WORDS = {"true", "false", "a", "b", "c", "d"}  # sift.organism.source value spaces besides numbers


def _values(words: list[str]) -> list[str]:
    """The value tokens of a CoT (numbers, truth values, option labels), as the organism's CoT edit sees them
    (sift.organism.source.value_space, re-stated here to keep torch out of the analysis imports)."""
    return [w for w in words if w.isdigit() or w in _VALUE_WORDS]


#: The candidate pair features (name → description) computed from a corpus TraceTable.
PAIR_FEATURES = {
    "trace length change": "|Δ generated tokens|",
    "CoT length change": "|Δ CoT words|",
    "prompt length change": "|Δ prompt tokens|",
    "lexical change (CoT)": "1 − Jaccard of the CoT word sets (paper: lexical overlap)",
    "lexical change (prompt)": "1 − Jaccard of the prompt word sets",
    "CoT sequence change": "1 − difflib ratio of the CoT word sequences (proxy for syntactic structure)",
    "computed-value change": "1 − Jaccard of the value tokens the CoT states (proxy for semantic content)",
    "answer change": "1[final answers differ]",
    "cue-mention change": "|Δ CoT mentions the cue|",
}


def pair_features(traces: TraceTable, src_ids: Sequence[str], dst_ids: Sequence[str],
                  extra: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, np.ndarray]:
    """Candidate spurious-feature changes of each pair (:data:`PAIR_FEATURES`, plus |Δ| of each ``extra``
    per-trace feature, e.g. hidden-state magnitude or attention stability from the trajectories)."""
    a, b = traces.rows(list(src_ids)), traces.rows(list(dst_ids))
    num, txt, strs = traces.num, traces.text, traces.str_
    out = {
        "trace length change": np.abs(num["trace_length"][b] - num["trace_length"][a]),
        "CoT length change": np.abs(num["cot_length"][b] - num["cot_length"][a]),
        "prompt length change": np.abs(num["prompt_length"][b] - num["prompt_length"][a]),
        "lexical change (CoT)": np.array([_jaccard_change(txt["cot"][i], txt["cot"][j]) for i, j in zip(a, b)]),
        "lexical change (prompt)": np.array([_jaccard_change(txt["prompt"][i], txt["prompt"][j])
                                             for i, j in zip(a, b)]),
        "CoT sequence change": np.array([1.0 - difflib.SequenceMatcher(None, txt["cot"][i], txt["cot"][j],
                                                                       autojunk=False).ratio() for i, j in zip(a, b)]),
        "computed-value change": np.array([_jaccard_change(_values(txt["cot"][i]), _values(txt["cot"][j]))
                                           for i, j in zip(a, b)]),
        "answer change": (strs["answer"][a] != strs["answer"][b]).astype(float),
        "cue-mention change": np.abs(num["mentions_cue"][b] - num["mentions_cue"][a]),
    }
    for name, m in (extra or {}).items():
        va = np.array([float(m.get(t, math.nan)) for t in src_ids])
        vb = np.array([float(m.get(t, math.nan)) for t in dst_ids])
        out[f"{name} change"] = np.abs(vb - va)
    return out


def spurious_feature_correlations(
    runs: Runs,
    pairs: Pairs,
    traces: TraceTable,
    out_dir: str | Path | None = None,
    *,
    extra_features: Mapping[str, Mapping[str, float]] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    table: PredictionTable | None = None,
) -> Section:
    """Correlation of candidate spurious-feature changes with verdict flips on preserving pairs (App. C.6, Table 9).

    Over the verified preserving pairs, per detector: the flip indicator 1[φ̂(c) ≠ φ̂(c′)] of each seed
    (the shift-attributable T(c) of App. E) against each pair feature of :func:`pair_features` — what sift
    can measure on its corpus in place of the paper's lexical overlap, syntactic structure and semantic
    content shift (proxies named in :data:`PAIR_FEATURES`); attention-pattern change and hidden-state
    magnitude enter through ``extra_features`` (trace id → value). Reported: the point-biserial (Pearson)
    correlation ρ, the partial correlation controlling for the other non-constant features (OLS
    residualisation), both as seed means with 95 % base-item bootstrap CIs, the two-sided bootstrap
    p-value of ρ (clustered; the paper's p-values ignore the clustering) and Benjamini–Hochberg q over the
    features of a detector. Pairs with an unknown feature value are left out. A feature constant on the
    pairs has NaN correlations.
    """
    res: dict = {}
    rows = []
    cache: dict[tuple[str, str], dict[str, float]] = {}
    if table is None:
        table = runs_table(runs, pairs)
    for name, preds in runs.items():
        st = table.stack(name, preds)
        pres = st.pair_rows("preserving")
        todo = [(s, t) for s, t in zip(pres.source_id.tolist(), pres.shifted_id.tolist()) if (s, t) not in cache]
        if todo:
            f = pair_features(traces, [s for s, _ in todo], [t for _, t in todo], extra_features)
            for i, key in enumerate(todo):
                cache[key] = {k: float(v[i]) for k, v in f.items()}
        fnames = list(cache[(pres.source_id[0], pres.shifted_id[0])]) if len(pres) else []
        if not fnames:
            raise SiftError(f"{name}: no preserving pairs on its traces")
        x = np.array([[cache[(s, t)][k] for k in fnames] for s, t in zip(pres.source_id.tolist(),
                                                                          pres.shifted_id.tolist())])
        ok = ~np.isnan(x).any(axis=1)
        x, pr = x[ok], pres.subset(ok)
        vs, vd = st.verdict[:, pr.src], st.verdict[:, pr.dst]
        flips = (vs != vd).astype(float)  # [S, P]: the per-pair outcome of the regressions

        # controls of a feature's partial correlation: the other features, except constant ones and those
        # (near-)collinear with it on the full data (e.g. trace and CoT length differ by a constant)
        with np.errstate(invalid="ignore", divide="ignore"):
            cmat = np.abs(np.corrcoef(x, rowvar=False)) if len(x) > 1 else np.zeros((len(fnames),) * 2)
        cmat = np.atleast_2d(np.nan_to_num(cmat, nan=1.0))

        def stat(idx, x=x, flips=flips, cmat=cmat, fnames=fnames):
            xs = x[idx]
            var = xs.std(axis=0) > 0
            out = []
            for j in range(len(fnames)):
                rho = [pearson(xs[:, j], flips[s, idx]) for s in range(flips.shape[0])]
                others = [q for q in range(len(fnames)) if q != j and var[q] and cmat[j, q] < 0.999]
                part = [partial_correlation(xs[:, j], flips[s, idx], xs[:, others]) if var[j] else math.nan
                        for s in range(flips.shape[0])]
                out += [seed_mean(rho), seed_mean(part)]
            return np.array(out)

        b = cluster_bootstrap_many(stat, pr.base_item, n_resamples, seed)
        pv = b.p_value()
        p_rho = pv[0::2]
        with warnings.catch_warnings():  # constant features have NaN p-values, left out of the family
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            q = benjamini_hochberg(p_rho).p_adjusted
        d_res = {"n_pairs": int(len(pr)), "flip_rate": ivr_compute(*ivr_update(vs.ravel(), vd.ravel()))[1],
                 "features": {}}
        for j, fn in enumerate(fnames):
            d = {"rho": ci(b, 2 * j), "partial_rho": ci(b, 2 * j + 1), "p_bootstrap": nan_none(p_rho[j]),
                 "q_bh": nan_none(q[j]), "mean_change": float(x[:, j].mean())}
            d_res["features"][fn] = d
            rows.append([name, fn, fmt(d["mean_change"]), fmt_cell(d["rho"]), fmt_cell(d["partial_rho"]),
                         fmt(d["p_bootstrap"]), fmt(d["q_bh"])])
        res[name] = d_res
    md = ["Correlation between changes of candidate spurious features and verdict flips over verified preserving "
          f"pairs (paper App. C.6, Table 9). Seed means; 95 % CIs and p-values from {n_resamples} base-item "
          "resamples; q = Benjamini–Hochberg over a detector's features. Feature definitions: "
          + "; ".join(f"*{k}* = {v}" for k, v in PAIR_FEATURES.items()) + ".", "",
          markdown_table(["detector", "feature change", "mean", "ρ with flip", "partial ρ", "p (boot)", "q (BH)"],
                         rows)]
    figs = []
    if out_dir is not None and res:
        plt = pyplot()
        names = list(res)
        fnames = list(next(iter(res.values()))["features"])
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(fnames)), 4))
        w = 0.8 / len(names)
        for i, n in enumerate(names):
            est = [res[n]["features"][f]["rho"]["estimate"] for f in fnames]
            est = np.array([np.nan if v is None else v for v in est])
            ax.bar(np.arange(len(fnames)) + i * w, est, w, label=n)
        ax.set_xticks(np.arange(len(fnames)) + 0.4 - w / 2, fnames, rotation=30, ha="right", fontsize=8)
        ax.axhline(0, color="k", lw=0.8), ax.set_ylabel("ρ(feature change, verdict flip)"), ax.legend(fontsize=7)
        figs = save_figure(fig, out_dir, "appendix_spurious_features")
    results = nan_none({"feature_definitions": PAIR_FEATURES, "n_resamples": n_resamples, "detectors": res})
    return Section("appendix_spurious_features", "Spurious-feature correlations (App. C.6)", "\n".join(md), figs,
                   results)


__all__ = ["ASSUMPTION_THRESHOLDS", "PAIR_FEATURES", "bound_quantities", "pair_features",
           "spurious_feature_correlations", "theorem_bound_audit"]
