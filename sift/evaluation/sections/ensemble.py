"""Paper Table 8: seed ensembles vs single seeds (IVR, AS, MFS, AUROC, a paired test of invariance over base items)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from sift.errors import SiftError
from sift.evaluation.analysis import (
    NAN,
    RunData,
    bootstrap_vector,
    check_same_split,
    common_items,
    num,
    preserving_axes,
    seed_ensemble,
    seed_mean,
)
from sift.evaluation.control_rows import with_group_rows
from sift.evaluation.engine import ReportContext, runs_table
from sift.evaluation.predictions import Pairs, Predictions
from sift.evaluation.sections.common import (
    DETERMINISTIC_MARK,
    DETERMINISTIC_NOTE,
    UNDERTRAINED_MARK,
    as_list,
    ci_dict,
    deterministic_seeds,
    nz,
    undertrained,
    undertrained_note,
)
from sift.evaluation.sections.registry import ReportSection, register_section
from sift.metrics import (
    UndefinedMetricWarning,
    benjamini_hochberg,
    clustered_mcnemar,
)
from sift.report import Section, markdown_table
from sift.report.numbers import fmt, fmt_cell


def ensemble_table(runs: dict[str, list[Predictions]], pairs: Pairs, *,
                   val: dict[str, list[Predictions]] | None = None, build_missing: bool = True,
                   n_resamples: int = 1000, seed: int = 0, q: float = 0.05, key: str = "ensemble_comparison",
                   title: str = "Ensemble comparison (Table 8)") -> Section:
    """Paper Table 8: IVR, AS, MFS at full coverage of each detector's single-seed runs (mean over seeds) and of
    its seed ensemble, and the gain in MFS. Ensembles are the runs with ``seed=None``, of the detector their run
    spec names (:attr:`Predictions.ensemble_of`, else of their own name); with ``build_missing`` a detector
    with ≥ 2 seeds and no ensemble gets the probability average of its seeds
    (:func:`~sift.evaluation.analysis.seed_ensemble`; ``val``: the validation predictions that freeze its
    threshold). A run with a seed is always a single-seed run of its own name (e.g. the per-seed
    ``instance_ensemble``). Per detector, a paired test compares the invariance (verdict kept) of the first seed
    and of the ensemble on the same preserving pairs: McNemar made cluster-aware, an exact sign-flip test over
    base items (the pairs of one item share traces, so items, not pairs, are the independent units;
    :func:`sift.metrics.clustered_mcnemar`), with Benjamini–Hochberg at FDR ``q`` across detectors.
    """
    check_same_split(runs)
    singles: dict[str, list[Predictions]] = {}
    ens: dict[str, Predictions] = {}
    for name, lst in runs.items():
        for p in as_list(lst):
            if p.seed is not None:  # a single-seed run, whatever the name (e.g. the per-seed instance_ensemble)
                singles.setdefault(name, []).append(p)
    for name, lst in runs.items():
        for p in as_list(lst):
            if p.seed is None:  # a seed ensemble: of the detector its run spec names, when that one has seeds here
                base = p.ensemble_of if p.ensemble_of in singles else name
                if base in ens:
                    raise SiftError(f"ensemble_table: two seed ensembles of {base!r} (give them distinct names)")
                ens[base] = p
    built = []
    if build_missing:
        for base, lst in singles.items():
            if base not in ens and len(lst) >= 2:
                ens[base] = seed_ensemble(base, lst, val)
                built.append(base)
    names = [n for n in singles if n in ens] + [n for n in ens if n not in singles]
    axes = preserving_axes(pairs)
    items = common_items([p for lst in singles.values() for p in lst] + list(ens.values()))
    table = runs_table(singles, pairs, ens.values())
    results: dict[str, Any] = {"built_here": built, "detectors": {}, "n_resamples": n_resamples}
    rows, pvals, tests = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for name in names:
            sgl = [table.run_data(p, axes).index(items) for p in singles.get(name, [])]
            e = table.run_data(ens[name], axes).index(items)

            def vec(drawn, sgl=sgl, e=e):
                ss = [r.stats(drawn) for r in sgl]
                es = e.stats(drawn)
                single = [seed_mean([s[k] for s in ss]) for k in ("ivr", "as_", "mfs", "auroc")]
                ensv = [es["ivr"], es["as_"], es["mfs"], es["auroc"]]
                return np.array([*single, *ensv, ensv[2] - single[2], ensv[3] - single[3]], float)

            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed)
            keys = ["single_ivr", "single_as", "single_mfs", "single_auroc", "ensemble_ivr", "ensemble_as",
                    "ensemble_mfs", "ensemble_auroc", "gain", "auroc_gain"]
            res = {k: ci_dict(a, b, c) for k, a, b, c in zip(keys, est, low, high)}
            res["n_seeds"] = len(sgl)
            res["deterministic"] = deterministic_seeds(singles.get(name, []))
            res["undertrained"] = undertrained(singles.get(name, []) + [ens[name]])
            res["threshold_from"] = ens[name].meta.get("threshold_from", "frozen ensemble threshold")
            test = None
            if sgl:
                test = _invariance_test(sgl[0], e)
            res["invariance_test"] = test
            results["detectors"][name] = res
            if test is not None and test.get("p_value") is not None:
                pvals.append(test["p_value"])
                tests.append(name)
            def g(k: str, res: dict[str, Any] = res) -> str:
                return fmt_cell(res[k])

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
            results["detectors"][n]["invariance_test"].update(p_bh=num(p_adj), reject_bh=bool(rej))
    for r in rows:
        n = r[-1]
        if n in results["detectors"] and results["detectors"][n].get("invariance_test"):
            t = results["detectors"][n]["invariance_test"]
            r[-1] = f"{fmt(t['p_value'] if t['p_value'] is not None else NAN)} (BH {fmt(nz(t.get('p_bh')))})"
        elif r[-1] != "—":
            r[-1] = "—"
    md = ("Full coverage (no abstention), mean over seeds for single runs; 95 % CIs: percentile bootstrap over the "
          f"test split's base items ({n_resamples} resamples; unit: base item). AUROC of "
          "the seed ensemble = AUROC of the seeds' averaged probabilities. Gain = MFS(ensemble) − MFS(single). "
          "p: per-pair invariance (verdict kept), first seed vs ensemble, McNemar made cluster-aware: an exact "
          "sign-flip test of b − c over base items (unit: base item; the preserving pairs of one item share its "
          f"base trace), BH-adjusted at q = {q} across detectors.\n\n"
          + markdown_table(["Method", "AUROC", "IVR", "AS", "MFS", "Gain (MFS)", "p (invariance)"],
                           with_group_rows(rows)))
    det = [n for n, r in results["detectors"].items() if r["deterministic"]]
    if det:
        md += ("\n\n" + DETERMINISTIC_MARK + " " + ", ".join(det) + ": " + DETERMINISTIC_NOTE
               + " Their seed ensemble therefore equals the single run (gain 0 by construction).")
    md += "\n".join(undertrained_note({n: r["undertrained"] for n, r in results["detectors"].items()
                                        if r["undertrained"]}))
    return Section(key, title, md, results=results)


def _invariance_test(a: RunData, b: RunData) -> dict[str, Any] | None:
    """Cluster-aware McNemar (sign flips over base items) on 1[verdict kept] over the preserving pairs both runs
    have (matched by trace ids)."""
    def kept(r: RunData) -> dict[tuple[str, str], tuple[int, str]]:
        p = r.p_axis >= 0
        return {(s, d): (int(r.verdict[i] == r.verdict[j]), str(it)) for s, d, i, j, it in
                zip(r.trace_id[r.p_src[p]].tolist(), r.trace_id[r.p_dst[p]].tolist(), r.p_src[p], r.p_dst[p],
                    r.p_items[p])}

    ka, kb = kept(a), kept(b)
    common = [k for k in ka if k in kb]
    if not common:
        return None
    r = clustered_mcnemar([ka[k][0] for k in common], [kb[k][0] for k in common], [ka[k][1] for k in common])
    return {"p_value": num(r.p_value), "statistic": num(r.statistic), "b": r.b, "c": r.c, "n_pairs": len(common),
            "n_items": r.n_items, "n_discordant_items": r.n_discordant_items,
            "test": "exact sign-flip test of b - c over base items (cluster-aware McNemar)",
            "note": "b = pairs only the single seed keeps; c = only the ensemble keeps"}


@register_section
class EnsembleComparison(ReportSection):
    """Table 8, when a detector row has ≥ 2 seeds or a seed ensemble."""

    name = "ensemble_comparison"
    order = 20

    def applies(self, ctx: ReportContext) -> bool:
        return bool(ctx.test) and any(len([p for p in v if p.seed is not None]) >= 2 or any(p.seed is None for p in v)
                                      for v in ctx.primary.values())

    def build(self, ctx: ReportContext) -> list[Section]:
        o = ctx.options
        return [ensemble_table(ctx.primary, ctx.pairs, val=ctx.select, n_resamples=o.n_resamples, seed=o.seed)]
