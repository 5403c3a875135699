"""Appendix analyses on detector outputs: factorial decomposition (paper App. F), stability–sensitivity
(App. G), label-noise sensitivity (App. C.8.1), abstained-versus-committed traces (App. C.7.2) and the
decision-theoretic optimal coverage (App. C.7.4). Each returns a :class:`sift.report.Section`.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from sift.errors import SiftError
from sift.evaluation.analysis import SeedStack, ensemble_row, ensemble_threshold, match_calibration, seed_mean
from sift.evaluation.appendix_common import (
    JointRows,
    Runs,
    TraceTable,
    ci,
    error_bars,
    fmt,
    fmt_cell,
    nan_none,
    pyplot,
    save_figure,
)
from sift.evaluation.engine import PredictionTable, runs_table
from sift.evaluation.predictions import Pairs, Predictions
from sift.metrics import UndefinedMetricWarning
from sift.metrics.appendix_helpers import cluster_bootstrap_many, expected_cost_curve
from sift.metrics.classification import auroc_kernel
from sift.metrics.operating import OperatingPoint, operating_metrics
from sift.metrics.selective import DEFAULT_SGR, SelectiveConfig
from sift.metrics.significance import benjamini_hochberg
from sift.report import Section, markdown_table

# ============================================================================ factorial (paper App. F)

_EFFECTS = ("architecture", "objective", "ensemble", "architecture×objective", "architecture×ensemble",
            "objective×ensemble", "architecture×objective×ensemble")


def _common_traces(stacks: list[SeedStack]) -> list[SeedStack]:
    """Restrict stacks to the traces all of them cover (the first stack's order)."""
    common = set(stacks[0].trace_id.tolist())
    for s in stacks[1:]:
        common &= set(s.trace_id.tolist())
    out = []
    ref = [t for t in stacks[0].trace_id.tolist() if t in common]
    for s in stacks:
        idx = s.index()
        rows = np.array([idx[t] for t in ref], int)
        out.append(s.subset(rows))
    return out


def factorial_decomposition(
    runs: Runs,
    pairs: Pairs,
    out_dir: str | Path | None = None,
    *,
    design: Mapping[str, tuple[str, str]] | None = None,
    ensembles: Mapping[str, Predictions] | None = None,
    val: Mapping[str, Sequence[Predictions]] | None = None,
    coverage: float | None = DEFAULT_SGR.match_coverage,
    n_resamples: int = 1000,
    seed: int = 0,
    table: PredictionTable | None = None,
) -> Section:
    """2×2×2 factorial decomposition of MFS at matched coverage (paper App. F, Table 17, Fig. 18).

    Factors as in the paper: architecture (instance-level MLP vs SIFT), training objective (ERM vs
    IRM+DANN) and ensembling (single seed vs probability average of the seeds). ``design`` maps four keys
    of ``runs`` to (architecture level, objective level); the first level met in ``design`` order is the
    "low" level. The main job builds it from the detector registry
    (:func:`sift.detectors.registry.factorial_designs`: e.g. ``instance_level`` / ``instance_level_irm_dann`` /
    ``sift_erm`` / ``sift``).
    A single-seed cell is the mean over seeds of the per-seed MFS; its ensemble cell is
    ``ensembles[name]`` if given (threshold frozen by whoever built it), else the probability average of
    the run's seeds at the threshold of :func:`sift.evaluation.analysis.ensemble_threshold` (the rule of Table 8's
    ensembles: Youden's J on the averaged validation predictions of ``val[name]``, else the seeds' mean threshold).

    MFS is taken at matched coverage κ (default: the packaged ``sgr.match_coverage``; ρ ≥ the ⌈κn⌉-th largest ρ
    of each detector and seed is certified, ties included, a pair counts when both its traces are;
    :mod:`sift.metrics.operating`; ``coverage=None``: full coverage). Effects use
    ±1 contrast coding: main effect = mean(high cells) − mean(low cells), interactions likewise, and each
    effect's share of the between-cell variance is SS_e/SS_total with SS_e = 2·effect² (one value per
    cell). "Share of gain" = main effect / sum of the three main effects (the paper's 50 / 37.5 / 12.5 %
    split of cell F − cell A). All numbers carry 95 % base-item cluster-bootstrap CIs from one joint set of
    replicates. Runs must cover the same traces (the analysis uses those all cover).
    """
    if not design:
        raise SiftError("factorial: no design (it needs two detectors whose registry entries declare factorial, "
                        "each trained with both objectives: factorial_seeds)")
    design = dict(design)
    missing = [k for k in design if k not in runs]
    if missing:
        raise SiftError(f"factorial design: runs {missing} missing (have {sorted(runs)}); pass design=...")
    arch_levels = list(dict.fromkeys(v[0] for v in design.values()))
    obj_levels = list(dict.fromkeys(v[1] for v in design.values()))
    if len(arch_levels) != 2 or len(obj_levels) != 2 or len({tuple(v) for v in design.values()}) != 4:
        raise SiftError(f"factorial design must cross 2 architectures × 2 objectives in 4 runs, got {design}")
    names = list(design)
    if table is None:
        table = runs_table({n: runs[n] for n in names}, pairs, (ensembles or {}).values())
    stacks = [table.stack(n, runs[n]) for n in names]
    ens_stacks = []
    for n, st in zip(names, stacks):
        if ensembles and n in ensembles:
            e = table.stack(ensemble_row(n), [ensembles[n]])
        else:
            if st.n_seeds < 2:
                raise SiftError(f"factorial: run {n!r} has {st.n_seeds} seed; the ensemble factor needs ≥ 2 "
                                "(or pass ensembles=)")
            thr, _ = ensemble_threshold(runs[n], [match_calibration(m, dict(val or {}), n) for m in runs[n]])
            e = st.with_prob(st.prob.mean(axis=0), np.array([thr]), ensemble_row(n))
        ens_stacks.append(e)
    aligned = _common_traces(stacks + ens_stacks)
    stacks, ens_stacks = aligned[:4], aligned[4:]
    ref = stacks[0]
    pres, alt = ref.pair_rows("preserving"), ref.pair_rows("altering")
    joint = JointRows.of(ref, pres, alt)
    point = OperatingPoint.full() if coverage is None else OperatingPoint.at_coverage(coverage)

    # cells in the paper's letters: (arch, objective, ensemble) with 0 = low, 1 = high
    letters = {(0, 0, 0): "A", (0, 0, 1): "B", (1, 0, 0): "C", (1, 0, 1): "D", (1, 1, 0): "E", (1, 1, 1): "F",
               (0, 1, 0): "G", (0, 1, 1): "H"}
    cell_of = {}
    for n, st, es in zip(names, stacks, ens_stacks):
        a, o = arch_levels.index(design[n][0]), obj_levels.index(design[n][1])
        cell_of[(a, o, 0)] = (n, st)
        cell_of[(a, o, 1)] = (n, es)
    keys = sorted(cell_of, key=lambda k: letters[k])
    signs = {"architecture": lambda k: 2 * k[0] - 1, "objective": lambda k: 2 * k[1] - 1,
             "ensemble": lambda k: 2 * k[2] - 1}
    contrasts = {}
    for e in _EFFECTS:
        parts = e.split("×")
        contrasts[e] = np.array([np.prod([signs[p](k) for p in parts]) for k in keys], float)

    def stat(idx: np.ndarray) -> np.ndarray:
        it, ip, ia = joint.split(idx)
        cells = []
        for k in keys:
            st = cell_of[k][1]
            v, r = st.verdict, st.rho
            pp, pa = pres.arrays(ip), alt.arrays(ia)
            per = np.array([operating_metrics(point, r[s][it], v[s], r[s], pp, pa).as_tuple()
                            for s in range(st.n_seeds)])
            cells.append([seed_mean(per[:, j]) for j in range(4)])
        cells = np.array(cells)  # [8, (ivr, as, kappa, mfs)]
        y = cells[:, 3]
        eff = np.array([contrasts[e] @ y / 4.0 for e in _EFFECTS])
        ss = 2.0 * eff ** 2
        ss_share = ss / ss.sum() if ss.sum() > 0 else np.full(ss.shape, np.nan)
        main = eff[:3]
        gain_share = main / main.sum() if abs(main.sum()) > 1e-12 else np.full(3, np.nan)
        total = y[keys.index((1, 1, 1))] - y[keys.index((0, 0, 0))]
        return np.concatenate([cells.ravel(), eff, ss_share, gain_share, [total]])

    b = cluster_bootstrap_many(stat, joint.groups, n_resamples, seed)
    n_cells = len(keys)
    cell_res, rows = {}, []
    for i, k in enumerate(keys):
        name, st = cell_of[k]
        d = {m: ci(b, i * 4 + j) for j, m in enumerate(("ivr", "as", "coverage", "mfs"))}
        d.update(architecture=arch_levels[k[0]], objective=obj_levels[k[1]],
                 ensemble="ensemble" if k[2] else "single", run=name, n_seeds=int(stacks[names.index(name)].n_seeds))
        cell_res[letters[k]] = d
        rows.append([letters[k], d["architecture"], d["objective"],
                     f"{d['n_seeds']}-seed avg" if k[2] else "single (seed mean)",
                     fmt_cell(d["ivr"]), fmt_cell(d["as"]), fmt(d["coverage"]["estimate"]), fmt_cell(d["mfs"])])
    off = n_cells * 4
    eff_res, erows = {}, []
    for j, e in enumerate(_EFFECTS):
        d = {"effect": ci(b, off + j), "ss_share": ci(b, off + 7 + j)}
        if j < 3:
            d["share_of_gain"] = ci(b, off + 14 + j)
        eff_res[e] = d
        erows.append([e, fmt_cell(d["effect"]), fmt_cell(d["ss_share"]),
                      fmt_cell(d["share_of_gain"]) if j < 3 else ""])
    total = ci(b, off + 17)
    kappa_txt = "full coverage" if coverage is None else f"matched coverage κ = {coverage:.2f}"
    md = [f"MFS of the 2×2×2 design at {kappa_txt} (paper App. F, Table 17); single-seed cells are seed means, "
          f"ensemble cells average the seeds' probabilities. 95 % CIs: {n_resamples} base-item resamples "
          f"({len(np.unique(joint.groups))} items, {len(pres)} preserving / {len(alt)} altering pairs).", "",
          markdown_table(["cell", "architecture", "objective", "ensemble", "IVR", "AS", "κ", "MFS"], rows), "",
          "Effects (contrast coding: mean of high-level cells − mean of low-level cells); share of the "
          "between-cell sum of squares; main effect / sum of main effects.", "",
          markdown_table(["effect", "ΔMFS", "share of SS", "share of gain"], erows), "",
          f"Cell F − cell A = {fmt_cell(total)}."]
    figs = []
    if out_dir is not None:
        plt = pyplot()
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
        est, err = error_bars([cell_res[letters[k]]["mfs"] for k in keys])
        ax1.bar([letters[k] for k in keys], est, yerr=err, capsize=3,
                color=["#4c72b0" if k[0] else "#dd8452" for k in keys])
        ax1.set_ylabel("MFS"), ax1.set_title("cells (blue = SIFT architecture)")
        def effect(part: str) -> np.ndarray:
            return np.array([np.nan if eff_res[e]["effect"][part] is None else eff_res[e]["effect"][part]
                             for e in _EFFECTS])

        e_est, e_lo, e_hi = effect("estimate"), effect("low"), effect("high")
        ax2.barh(range(7), e_est, xerr=[e_est - e_lo, e_hi - e_est], capsize=3, color="#55a868")
        short = [e.replace("architecture", "arch").replace("objective", "obj").replace("ensemble", "ens")
                 for e in _EFFECTS]
        ax2.set_yticks(range(7), short)
        ax2.axvline(0, color="k", lw=0.8), ax2.set_xlabel("effect on MFS"), ax2.invert_yaxis()
        ax2.set_title("factorial effects (95 % CI)")
        figs = save_figure(fig, out_dir, "appendix_factorial")
    results = nan_none({"coverage": coverage, "design": {k: list(v) for k, v in design.items()},
                        "cells": cell_res, "effects": eff_res, "f_minus_a": total, "n_resamples": n_resamples,
                        "n_preserving_pairs": len(pres), "n_altering_pairs": len(alt)})
    return Section("appendix_factorial", "Factorial decomposition (App. F)", "\n".join(md), figs, results)


# ============================================================================ stability–sensitivity (App. G)


def _seed_agreement(verdict: np.ndarray, it: np.ndarray) -> float:
    """1 − mean over seed pairs of P(verdicts differ) on traces ``it`` (NaN with one seed)."""
    s = verdict.shape[0]
    if s < 2 or it.size == 0:
        return math.nan
    return 1.0 - float(np.mean([np.mean(verdict[i, it] != verdict[j, it])
                                for i, j in itertools.combinations(range(s), 2)]))


def _pareto(points: dict[str, tuple[float, float]]) -> list[str]:
    """Names not dominated (≥ on both coordinates, > on one) by another point; NaN points excluded."""
    ok = {k: p for k, p in points.items() if not any(math.isnan(x) for x in p)}
    front = []
    for k, (x, y) in ok.items():
        if not any((x2 >= x and y2 >= y and (x2 > x or y2 > y)) for k2, (x2, y2) in ok.items() if k2 != k):
            front.append(k)
    return sorted(front, key=lambda k: ok[k][0])


def stability_sensitivity(
    runs: Runs,
    pairs: Pairs,
    out_dir: str | Path | None = None,
    *,
    coverages: Sequence[float | None] = (None, DEFAULT_SGR.match_coverage),
    n_resamples: int = 1000,
    seed: int = 0,
    table: PredictionTable | None = None,
) -> Section:
    """Joint stability (1 − IVR) and alteration sensitivity (AS) per detector (paper App. G, Table 18, Fig. 19).

    For each detector (key of ``runs``; ensembles can be passed as their own key with one Predictions)
    and each operating point in ``coverages`` (None = full coverage, κ = matched coverage), the seed-mean
    stability 1 − IVR, AS and the balanced score √((1 − IVR)·AS), with base-item bootstrap CIs; the Pareto
    frontier of the detectors on (stability, AS); and, beside it, the seed agreement
    1 − P(φ̂_seed i ≠ φ̂_seed j) on all traces (mean over seed pairs; the seed-repeat floor the paper's
    "seed stability" wording refers to, where a run has ≥ 2 seeds). The paper quantifies stability as
    1 − IVR; both are shown.
    """
    res: dict = {}
    tables = []
    if table is None:
        table = runs_table(runs, pairs)
    for cov in coverages:
        key = "full" if cov is None else f"kappa_{cov:.2f}"
        res[key] = {}
        rows = []
        for name, preds in runs.items():
            st = table.stack(name, preds)
            pres, alt = st.pair_rows("preserving"), st.pair_rows("altering")
            joint = JointRows.of(st, pres, alt)
            v, r = st.verdict, st.rho

            def stat(idx, v=v, r=r, st=st, pres=pres, alt=alt, joint=joint, cov=cov):
                it, ip, ia = joint.split(idx)
                point = OperatingPoint.full() if cov is None else OperatingPoint.at_coverage(cov)
                pp, pa = pres.arrays(ip), alt.arrays(ia)
                per = np.array([operating_metrics(point, r[s][it], v[s], r[s], pp, pa).as_tuple()
                                for s in range(st.n_seeds)])
                stab = 1.0 - per[:, 0]
                bal = np.sqrt(np.clip(stab * per[:, 1], 0, None))
                return np.array([seed_mean(stab), seed_mean(per[:, 1]), seed_mean(bal), seed_mean(per[:, 2]),
                                 _seed_agreement(v, it)])

            b = cluster_bootstrap_many(stat, joint.groups, n_resamples, seed)
            d = {"stability": ci(b, 0), "as": ci(b, 1), "balanced": ci(b, 2), "coverage": ci(b, 3),
                 "seed_agreement": ci(b, 4), "n_seeds": st.n_seeds}
            res[key][name] = d
            rows.append([name, fmt_cell(d["stability"]), fmt_cell(d["as"]), fmt_cell(d["balanced"]),
                         fmt(d["coverage"]["estimate"]), fmt_cell(d["seed_agreement"])])
        pts = {n: (np.nan if d["stability"]["estimate"] is None else d["stability"]["estimate"],
                   np.nan if d["as"]["estimate"] is None else d["as"]["estimate"]) for n, d in res[key].items()}
        front = _pareto(pts)
        res[key]["_pareto_front"] = front
        label = "full coverage" if cov is None else f"matched coverage κ = {cov:.2f}"
        tables += [f"**{label}** (Pareto frontier: {', '.join(front) or '–'})", "",
                   markdown_table(["detector", "stability 1−IVR", "AS", "√((1−IVR)·AS)", "κ", "seed agreement"],
                                  rows), ""]
    md = ["Stability (1 − IVR over certified preserving pairs) against alteration sensitivity (paper App. G); "
          f"seed means, 95 % CIs from {n_resamples} base-item resamples. A detector that suppresses all variation "
          "has high stability and low AS; the useful corner is the upper right.", ""] + tables
    figs = []
    if out_dir is not None:
        plt = pyplot()
        fig, axes = plt.subplots(1, len(coverages), figsize=(5.2 * len(coverages), 4.4), squeeze=False)
        for ax, cov in zip(axes[0], coverages):
            key = "full" if cov is None else f"kappa_{cov:.2f}"
            g = np.linspace(0.01, 1, 200)
            for c in (0.5, 0.75):
                ax.plot(g, np.where(c ** 2 / g <= 1, c ** 2 / g, np.nan), ls="--", color="grey", lw=0.8)
            for name, d in res[key].items():
                if name.startswith("_") or d["stability"]["estimate"] is None or d["as"]["estimate"] is None:
                    continue
                (x,), xerr = error_bars([d["stability"]])
                (y,), yerr = error_bars([d["as"]])
                ax.errorbar(x, y, xerr=np.nan_to_num(xerr), yerr=np.nan_to_num(yerr), fmt="o", capsize=2)
                ax.annotate(name, (x, y), fontsize=8, xytext=(3, 3), textcoords="offset points")
            fr = [res[key][n] for n in res[key]["_pareto_front"]]
            if len(fr) > 1:
                ax.plot([d["stability"]["estimate"] for d in fr], [d["as"]["estimate"] for d in fr], color="C1", lw=1)
            ax.set_xlim(0, 1.02), ax.set_ylim(0, 1.02)
            ax.set_xlabel("stability 1 − IVR"), ax.set_ylabel("alteration sensitivity AS")
            ax.set_title("full coverage" if cov is None else f"κ = {cov:.2f}")
        figs = save_figure(fig, out_dir, "appendix_stability_sensitivity")
    results = nan_none({**res, "n_resamples": n_resamples})
    return Section("appendix_stability_sensitivity", "Stability–sensitivity trade-off (App. G)", "\n".join(md),
                   figs, results)


# ============================================================================ label noise (App. C.8.1)

_NOISE_METRICS = ("auroc", "accuracy", "ivr", "as", "mfs", "sgr_coverage", "ivr_certified", "as_certified",
                  "mfs_certified")


def _flip(y: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
    """Labels with exactly round(ε·n) of them flipped (chosen uniformly without replacement)."""
    out = y.copy()
    k = int(round(eps * y.size))
    if k:
        out[rng.choice(y.size, size=k, replace=False)] ^= 1
    return out


def _noise_metrics(st: SeedStack, pres, alt, it, ip, ia, y_noisy, selective: SelectiveConfig, reverify
                   ) -> np.ndarray:
    v, r = st.verdict, st.rho
    pl = (y_noisy[alt.src], y_noisy[alt.dst])
    pres_mask = (y_noisy[pres.src] == y_noisy[pres.dst]) if reverify else None
    alt_mask = ((pl[0] == alt.phi_src) & (pl[1] == alt.phi_dst)) if reverify else None
    pp, pa = pres.arrays(ip, mask=pres_mask), alt.arrays(ia, labels=pl, mask=alt_mask)
    out = []
    for s in range(st.n_seeds):
        yt = y_noisy[it]
        auc = auroc_kernel(st.prob[s, it], yt) if it.size else math.nan
        acc = float(np.mean(v[s, it] == yt)) if it.size else math.nan
        ivr, as_, _, m = operating_metrics(OperatingPoint.full(), r[s][it], v[s], r[s], pp, pa).as_tuple()
        gate = (selective.threshold(r[s, it], (v[s, it] == yt).astype(int), st.base_item[it])
                if it.size else math.inf)
        point = OperatingPoint.sgr(gate, math.isfinite(gate))  # infeasible: nothing certified, κ = 0, MFS = 0
        ivr_c, as_c, cov, m_c = operating_metrics(point, r[s][it], v[s], r[s], pp, pa).as_tuple()
        out.append([auc, acc, ivr, as_, m, cov, ivr_c, as_c, m_c])
    out = np.array(out)
    return np.array([seed_mean(out[:, j]) for j in range(out.shape[1])])


def label_noise_sensitivity(
    runs: Runs,
    pairs: Pairs,
    out_dir: str | Path | None = None,
    *,
    noise_rates: Sequence[float] = (0.0, 0.025, 0.05, 0.10, 0.15, 0.20),
    n_draws: int = 20,
    selective: SelectiveConfig = DEFAULT_SGR,
    reverify: bool = False,
    n_resamples: int = 200,
    seed: int = 0,
    table: PredictionTable | None = None,
) -> Section:
    """Metrics recomputed after flipping a fraction ε of the verified labels (paper App. C.8.1, Fig. 10).

    For each ε, exactly round(ε·N) trace labels are flipped uniformly at random (one draw is shared by all
    detectors and seeds) and every label-dependent number is recomputed: AUROC and accuracy at the frozen
    threshold, AS (altering pairs scored against the noisy label change; pairs whose noisy labels no
    longer differ drop out, doubly flipped pairs count as reversed), IVR / AS / MFS at full coverage, and
    the SGR certified operating point (``selective``: the report's α, δ, bound and candidates) re-calibrated on the
    noisy labels with the
    certified IVR / AS / MFS (an infeasible SGR certifies nothing: κ = 0, MFS = 0). The calibration is
    in-sample (on the evaluated split), unlike the paper's held-out calibration set.

    ``reverify=True`` also re-runs pair verification on the noisy labels (preserving pairs need equal noisy
    labels, altering pairs the declared flip). Sift's pair kind comes from the axis, so, without
    re-verification, IVR at full coverage cannot move with label noise; it moves only through the
    re-calibrated certified subset, which is where the paper's "IVR inflation" can arise here.

    Estimates are means over ``n_draws`` noise draws; 95 % CIs come from a base-item cluster bootstrap
    in which each replicate also draws fresh noise (so they cover item sampling and noise); the default
    200 resamples (not 1000) keep the cost down, since every replicate re-runs SGR per seed and ε.
    Rank ordering: detectors ranked by mean MFS (full coverage and certified) at each ε, Kendall τ with
    the ε = 0 ranking, and the largest ε up to which the ranking is unchanged.
    """
    names = list(runs)
    if table is None:
        table = runs_table(runs, pairs)
    stacks = _common_traces([table.stack(n, runs[n]) for n in names])
    ref = stacks[0]
    pres, alt = ref.pair_rows("preserving"), ref.pair_rows("altering")
    joint = JointRows.of(ref, pres, alt)
    y = ref.label.astype(int)
    k = len(_NOISE_METRICS)
    curves: dict = {n: {m: [] for m in _NOISE_METRICS} for n in names}
    for ei, eps in enumerate(noise_rates):
        rng = np.random.default_rng([seed, ei, 0])
        draws = [_flip(y, eps, rng) for _ in range(max(1, n_draws if eps > 0 else 1))]
        it, ip, ia = joint.split(np.arange(joint.groups.size))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns (nothing certified) stay NaN
            means = {n: np.nanmean([_noise_metrics(st, pres, alt, it, ip, ia, yd, selective, reverify)
                                    for yd in draws], axis=0) for n, st in zip(names, stacks)}
        brng = np.random.default_rng([seed, ei, 1])

        def stat(idx, eps=eps, brng=brng):
            yd = _flip(y, eps, brng)
            it_, ip_, ia_ = joint.split(idx)
            return np.concatenate([_noise_metrics(st, pres, alt, it_, ip_, ia_, yd, selective, reverify)
                                   for st in stacks])

        b = cluster_bootstrap_many(stat, joint.groups, n_resamples, seed + 1000 * ei)
        for i, n in enumerate(names):
            for j, m in enumerate(_NOISE_METRICS):
                curves[n][m].append({"estimate": nan_none(means[n][j]), "low": nan_none(b.low[i * k + j]),
                                     "high": nan_none(b.high[i * k + j])})

    def ranking(metric: str, ei: int) -> list[str]:
        vals = [curves[n][metric][ei]["estimate"] for n in names]
        vals = [-np.inf if v is None else v for v in vals]
        return [names[i] for i in np.argsort(-np.array(vals), kind="mergesort")]

    rank_res = {}
    for metric in ("mfs", "mfs_certified"):
        clean = ranking(metric, 0)
        taus, preserved_upto = [], noise_rates[0]
        still = True
        for ei, eps in enumerate(noise_rates):
            rk = ranking(metric, ei)
            pos0 = [clean.index(n) for n in names]
            pos = [rk.index(n) for n in names]
            taus.append(float(kendalltau(pos0, pos).statistic) if len(names) > 1 else math.nan)
            if still and rk == clean:
                preserved_upto = eps
            else:
                still = False
        rank_res[metric] = {"clean_ranking": clean, "kendall_tau": taus, "ranking_preserved_up_to": preserved_upto}

    hdr = ["detector", "metric"] + [f"ε={e:g}" for e in noise_rates]
    rows = []
    for n in names:
        for m in ("auroc", "ivr", "as", "mfs", "sgr_coverage", "ivr_certified", "mfs_certified"):
            rows.append([n, m] + [fmt_cell(c) for c in curves[n][m]])
    md = [f"Label noise: a fraction ε of verified labels flipped at random ({n_draws} draws per ε; "
          f"{'pairs re-verified on noisy labels' if reverify else 'pair set fixed, noisy labels score AS'}); "
          f"SGR at α = {selective.alpha}, δ = {selective.delta} ({selective.bound} bound) re-calibrated on the noisy "
          f"labels (in-sample). "
          f"95 % CIs: {n_resamples} base-item resamples, fresh noise per resample (paper App. C.8.1).", "",
          markdown_table(hdr, rows), ""]
    for metric, d in rank_res.items():
        md.append(f"Ranking by {metric}: clean order {', '.join(d['clean_ranking'])}; unchanged up to "
                  f"ε = {d['ranking_preserved_up_to']:g}; Kendall τ vs clean: "
                  + ", ".join(fmt(t, 2) for t in d["kendall_tau"]) + ".")
    figs = []
    if out_dir is not None:
        plt = pyplot()
        show = ("auroc", "ivr", "as", "mfs", "ivr_certified", "mfs_certified")
        fig, axes = plt.subplots(2, 3, figsize=(13, 7))
        for ax, m in zip(axes.ravel(), show):
            for n in names:
                c = curves[n][m]
                est = np.array([np.nan if x["estimate"] is None else x["estimate"] for x in c])
                lo = np.array([np.nan if x["low"] is None else x["low"] for x in c])
                hi = np.array([np.nan if x["high"] is None else x["high"] for x in c])
                (line,) = ax.plot(noise_rates, est, marker="o", ms=3, label=n)
                ax.fill_between(noise_rates, lo, hi, color=line.get_color(), alpha=0.12)
            ax.axvspan(0, 0.10, color="grey", alpha=0.08)
            ax.set_title(m), ax.set_xlabel("label noise ε")
        axes[0, 0].legend(fontsize=7)
        figs = save_figure(fig, out_dir, "appendix_label_noise")
    results = nan_none({"noise_rates": list(noise_rates), "n_draws": n_draws, "alpha": selective.alpha,
                        "delta": selective.delta, "bound": selective.bound,
                        "reverify": reverify, "n_resamples": n_resamples, "curves": curves, "ranking": rank_res})
    return Section("appendix_label_noise", "Label-noise sensitivity (App. C.8.1)", "\n".join(md), figs, results)


# ============================================================================ abstained vs committed (C.7.2)


def _attributes(st: SeedStack, traces: TraceTable | None) -> dict[str, np.ndarray]:
    """Per-trace attributes (NaN where unknown) to compare between abstained and committed traces."""
    a: dict[str, np.ndarray] = {"faithful label": (st.label == 1).astype(float)}
    if traces is not None:
        idx = traces.index()
        rows = np.array([idx.get(t, -1) for t in st.trace_id.tolist()], int)

        def col(name):
            out = np.full(rows.size, np.nan)
            out[rows >= 0] = traces.num[name][rows[rows >= 0]]
            return out

        a["trace length (tokens)"] = col("trace_length")
        a["CoT length (words)"] = col("cot_length")
        a["final answer correct"] = col("answer_correct")
        a["cue present"] = col("cue_present")
        a["CoT mentions cue"] = col("mentions_cue")
        a["other language"] = col("language_other")
        a["verbose budget"] = col("verbose")
    for prefix, arr in (("condition", st.condition), ("domain", st.domain), ("model", st.model)):
        vals = sorted(set(arr.astype(str).tolist()))
        if len(vals) > 1:
            for v in vals:
                a[f"{prefix} = {v}"] = (arr.astype(str) == v).astype(float)
    return a


def abstention_characterisation(
    runs: Runs,
    out_dir: str | Path | None = None,
    *,
    traces: TraceTable | None = None,
    thresholds: Mapping[str, float] | None = None,
    coverage: float | None = None,
    selective: SelectiveConfig = DEFAULT_SGR,
    n_resamples: int = 1000,
    seed: int = 0,
    table: PredictionTable | None = None,
) -> Section:
    """Abstained versus committed traces (paper App. C.7.2, Table 10).

    Operating point per detector and seed: the gate threshold ``thresholds[name]`` if given (e.g. the SGR
    threshold certified on the calibration split), else matched ``coverage`` if given, else SGR (α, δ)
    calibrated in-sample on the evaluated split (infeasible SGR: gate +inf, everything abstained).
    Abstained = ρ below the gate. For every attribute
    (verified label, detector correctness, trace/CoT length, final-answer correctness, cue presence and
    mention, language, budget — the latter from ``traces``, a corpus :class:`TraceTable` — and the share of
    each condition, domain and source model, which stand in for the paper's cross-lingual / cross-model
    shares) the seed-mean of the abstained and committed means, their difference with a 95 % base-item
    bootstrap CI, a two-sided bootstrap p-value (CI inversion; clustered, unlike the paper's unclustered
    tests) and Benjamini–Hochberg q across the attributes of a detector. SDs of continuous attributes are
    reported beside the means (as the paper does).
    """
    res: dict = {}
    parts = []
    if table is None:
        table = runs_table(runs)
    for name, preds in runs.items():
        st = table.stack(name, preds)
        v, r = st.verdict, st.rho
        gates = []
        for s in range(st.n_seeds):
            if thresholds and name in thresholds:
                point = OperatingPoint.at_gate(float(thresholds[name]))
            elif coverage is not None:
                point = OperatingPoint.at_coverage(coverage)
            else:
                t = selective.threshold(r[s], (v[s] == st.label).astype(int), st.base_item)
                point = OperatingPoint.sgr(t, math.isfinite(t))
            gates.append(point.threshold(r[s]))
        gates = np.array(gates, float)
        committed = r >= gates[:, None]  # [S, N]
        attrs = _attributes(st, traces)
        attrs["detector correct"] = None  # per seed, filled in stat
        names = list(attrs)
        correct = (v == st.label[None, :]).astype(float)

        def stat(idx, committed=committed, attrs=attrs, names=names, correct=correct, st=st):
            out = [seed_mean([1.0 - committed[s, idx].mean()]) if idx.size else math.nan
                   for s in range(st.n_seeds)]
            vec = [seed_mean(out)]
            for an in names:
                ma, mc = [], []
                for s in range(st.n_seeds):
                    x = correct[s, idx] if an == "detector correct" else attrs[an][idx]
                    c = committed[s, idx]
                    ok = ~np.isnan(x)
                    ma.append(float(x[ok & ~c].mean()) if (ok & ~c).any() else math.nan)
                    mc.append(float(x[ok & c].mean()) if (ok & c).any() else math.nan)
                a_, c_ = seed_mean(ma), seed_mean(mc)
                vec += [a_, c_, a_ - c_]
            return np.array(vec)

        b = cluster_bootstrap_many(stat, st.base_item.astype(str), n_resamples, seed)
        pv = b.p_value()
        diffs = [1 + 3 * i + 2 for i in range(len(names))]
        with warnings.catch_warnings():  # undefined differences (nothing abstained) are left out of BH
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            q = benjamini_hochberg(pv[diffs]).p_adjusted if len(diffs) else np.array([])
        d_res = {"abstention_rate": ci(b, 0), "gates": gates.tolist(), "attributes": {}}
        rows = []
        for i, an in enumerate(names):
            j = 1 + 3 * i
            sds = {}
            if an in ("trace length (tokens)", "CoT length (words)"):
                x = attrs[an]
                _sd = lambda z: float(np.nanstd(z)) if np.any(~np.isnan(z)) else math.nan  # noqa: E731
                sds = {"sd_abstained": seed_mean([_sd(x[~committed[s]]) for s in range(st.n_seeds)]),
                       "sd_committed": seed_mean([_sd(x[committed[s]]) for s in range(st.n_seeds)])}
            d = {"abstained": ci(b, j), "committed": ci(b, j + 1), "difference": ci(b, j + 2),
                 "p_bootstrap": nan_none(pv[j + 2]), "q_bh": nan_none(q[i]), **nan_none(sds)}
            d_res["attributes"][an] = d
            sa = f" ({fmt(sds['sd_abstained'], 1)})" if sds else ""
            sc = f" ({fmt(sds['sd_committed'], 1)})" if sds else ""
            rows.append([an, fmt(d["abstained"]["estimate"]) + sa, fmt(d["committed"]["estimate"]) + sc,
                         fmt_cell(d["difference"]), fmt(d["p_bootstrap"]), fmt(d["q_bh"])])
        res[name] = d_res
        parts += [f"**{name}**: abstention rate {fmt_cell(d_res['abstention_rate'])} "
                  f"(gate {', '.join(fmt(g) for g in gates)})", "",
                  markdown_table(["attribute", "abstained", "committed", "difference", "p (boot)", "q (BH)"], rows), ""]
    op = ("given gate thresholds" if thresholds else f"matched coverage κ = {coverage}" if coverage is not None
          else f"SGR α = {selective.alpha}, δ = {selective.delta}, {selective.bound} bound, calibrated in-sample")
    md = [f"Abstained versus committed traces at the operating point ({op}); paper App. C.7.2. Shares are "
          f"fractions; means over seeds; 95 % CIs and p-values from {n_resamples} base-item resamples.", ""] + parts
    results = nan_none({"operating_point": op, "n_resamples": n_resamples, "detectors": res})
    return Section("appendix_abstention", "Abstained versus committed traces (App. C.7.2)", "\n".join(md), [],
                   results)


# ============================================================================ optimal coverage (C.7.4)

#: Paper Table 11 regimes: name → (C_FN / C_FP, C_A / C_FP).
COST_REGIMES: dict[str, tuple[float, float]] = {
    "content moderation": (10.0, 2.0),
    "scientific verification": (5.0, 1.0),
    "educational assessment": (3.0, 1.0),
    "real-time monitoring": (20.0, 0.5),
}


def optimal_coverage(
    runs: Runs,
    out_dir: str | Path | None = None,
    *,
    regimes: Mapping[str, tuple[float, float]] | None = None,
    base_rate: float | None = None,
    grid: Sequence[float] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    table: PredictionTable | None = None,
) -> Section:
    """Decision-theoretic optimal coverage κ* per cost regime (paper App. C.7.4, eq. 43, Table 11).

    E[Cost](κ) = κ[π·FNR(κ)·C_FN + (1−π)·FPR(κ)·C_FP] + (1−κ)·C_A with C_FP = 1 and the regimes' cost
    ratios (default: the paper's four), committing the ⌈κn⌉ most confident traces (ρ = max(s, 1−s)) of
    each seed, "positive" = unfaithful (a false negative misses an unfaithful trace). The curve is the
    seed mean; κ* minimises it over ``grid`` (default 0, 0.01, …, 1; first minimum on ties). π defaults to
    the empirical share of unfaithful traces (the paper assumes 0.4; pass ``base_rate=0.4`` for that).
    Unlike the paper's Table 11, which plugs in two operating points, the whole empirical FNR/FPR curves
    are used. Reported: κ*, minimum cost, cost at full coverage and at κ* relative to full coverage
    (saving), with 95 % base-item bootstrap CIs.
    """
    regimes = dict(regimes or COST_REGIMES)
    grid = np.round(np.linspace(0, 1, 101), 10) if grid is None else np.asarray(grid, float)
    res: dict = {}
    curves: dict = {}
    if table is None:
        table = runs_table(runs)
    for name, preds in runs.items():
        st = table.stack(name, preds)
        v, r, y = st.verdict, st.rho, st.label.astype(int)

        def cost_curves(idx, v=v, r=r, y=y, st=st):
            return {rg: np.mean([expected_cost_curve(r[s, idx], v[s, idx], y[idx], grid, cfn, 1.0, ca, base_rate)
                                 for s in range(st.n_seeds)], axis=0) for rg, (cfn, ca) in regimes.items()}

        def stat(idx):
            out = []
            for _rg, c in cost_curves(idx).items():
                i = int(np.argmin(c))
                out += [grid[i], c[i], c[-1] if grid[-1] == 1 else np.nan, c[-1] - c[i] if grid[-1] == 1 else np.nan]
            return np.array(out)

        b = cluster_bootstrap_many(stat, st.base_item.astype(str), n_resamples, seed)
        curves[name] = {rg: c.tolist() for rg, c in cost_curves(np.arange(len(y))).items()}
        res[name] = {rg: {"kappa_star": ci(b, 4 * i), "min_cost": ci(b, 4 * i + 1),
                          "cost_full_coverage": ci(b, 4 * i + 2), "saving_vs_full": ci(b, 4 * i + 3)}
                     for i, rg in enumerate(regimes)}
    pi_txt = "empirical unfaithful share" if base_rate is None else f"π = {base_rate}"
    rows = []
    for name in res:
        for rg, (cfn, ca) in regimes.items():
            d = res[name][rg]
            rows.append([name, rg, fmt(cfn, 1), fmt(ca, 1), fmt_cell(d["kappa_star"], 2), fmt_cell(d["min_cost"]),
                         fmt_cell(d["cost_full_coverage"]), fmt_cell(d["saving_vs_full"])])
    md = [f"Optimal coverage κ* minimising eq. 43 (C_FP = 1; {pi_txt}; coverage grid of {len(grid)} points; "
          f"paper App. C.7.4). 95 % CIs: {n_resamples} base-item resamples.", "",
          markdown_table(["detector", "regime", "C_FN/C_FP", "C_A/C_FP", "κ*", "min cost", "cost at κ=1",
                          "saving"], rows)]
    figs = []
    if out_dir is not None:
        plt = pyplot()
        fig, axes = plt.subplots(1, len(regimes), figsize=(4.2 * len(regimes), 3.6), squeeze=False)
        for ax, rg in zip(axes[0], regimes):
            for name in curves:
                c = np.array(curves[name][rg])
                (line,) = ax.plot(grid, c, label=name)
                ks = res[name][rg]["kappa_star"]["estimate"]
                if ks is not None:
                    ax.plot([ks], [c[int(np.argmin(c))]], "o", color=line.get_color())
            ax.set_title(f"{rg}\nC_FN={regimes[rg][0]:g}, C_A={regimes[rg][1]:g}", fontsize=9)
            ax.set_xlabel("coverage κ"), ax.set_ylabel("expected cost / trace")
        axes[0, 0].legend(fontsize=7)
        figs = save_figure(fig, out_dir, "appendix_optimal_coverage")
    results = nan_none({"regimes": {k: list(v) for k, v in regimes.items()}, "base_rate": base_rate,
                        "grid": grid.tolist(), "detectors": res, "curves": curves, "n_resamples": n_resamples})
    return Section("appendix_optimal_coverage", "Decision-theoretic optimal coverage (App. C.7.4)", "\n".join(md),
                   figs, results)
