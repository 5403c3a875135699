"""Paper Table 4: ablation variants of one detector."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sift.errors import SiftError
from sift.evaluation.analysis import (
    NAN,
    bootstrap_vector,
    bound_unit,
    common_items,
    num,
    preserving_axes,
    seed_mean,
    split_strata,
)
from sift.evaluation.engine import DEFAULT_OPTIONS, PredictionTable, ReportContext, ReportOptions, runs_table
from sift.evaluation.predictions import Pairs, Predictions
from sift.evaluation.sections.common import (
    UNDERTRAINED_MARK,
    as_list,
    ci_dict,
    prepare_runs,
    undertrained,
    undertrained_note,
)
from sift.evaluation.sections.registry import ReportSection, register_section
from sift.metrics import (
    UndefinedMetricWarning,
)
from sift.report import Section, markdown_table
from sift.report.numbers import fmt_cell


def ablation_table(ablations: Mapping[str, Sequence[Predictions]], pairs: Pairs, *,
                   transfer: Mapping[str, Sequence[Predictions]] | None = None,
                   calib: dict[str, list[Predictions]] | None = None, reference: str | None = None,
                   options: ReportOptions = DEFAULT_OPTIONS, key: str = "ablations", title: str = "Ablations (Table 4)",
                   table: PredictionTable | None = None) -> Section:
    """Paper Table 4 (a): per variant (ablation name → its seed runs on the test split): in-distribution
    AUROC, IVR, AS, MFS (full coverage), SGR coverage and certified MFS, and — with ``transfer`` (variant →
    runs on the shifted split) — transfer AUROC and gap; relative change of IVR and MFS against ``reference``
    (default: the variant whose runs carry no ``ablation``, else the first). Mean over seeds, 95 %
    cluster-bootstrap CIs. ``calib`` (variant → validation runs) calibrates SGR.
    """
    if not ablations:
        raise SiftError("ablation_table: no variants")
    selective, n_resamples, seed = options.selective, options.n_resamples, options.seed
    variants = list(ablations)
    if reference is None:  # the variant trained without an ablation
        reference = next((v for v in variants if all(p.role.ablation is None for p in as_list(ablations[v]))),
                         variants[0])
    elif reference not in ablations:
        raise SiftError(f"reference variant {reference!r} not among {variants}")
    axes = preserving_axes(pairs)
    rows = {v: as_list(ablations[v]) for v in variants}
    trows = {v: as_list(transfer[v]) for v in variants if transfer and v in transfer}
    splits = [[p for l in rows.values() for p in l], [p for l in trows.values() for p in l]]
    items = common_items(*splits)
    strata = split_strata(items, splits)
    if table is None:
        table = runs_table(rows, pairs, [p for v in (*trows.values(), *(calib or {}).values()) for p in v])
    data = prepare_runs(table, rows, axes, items, selective, calib)
    tdata = prepare_runs(table, trows, axes, items, None, None, paired=False)
    keys = ["in_dist_auroc", "ivr", "as", "mfs", "coverage", "cert_mfs", "transfer_auroc", "gap"]
    results: dict[str, Any] = {"reference": reference, "variants": {}, "n_resamples": n_resamples}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for v, rds in data.items():
            tr = tdata.get(v, [])

            def vec(drawn, rds=rds, tr=tr):
                st = [rd.stats(drawn) for rd in rds]
                ind = seed_mean([s["auroc"] for s in st])
                ta = seed_mean([t.stats(drawn)["auroc"] for t in tr]) if tr else NAN
                return np.array([ind, *[seed_mean([s[k] for s in st]) for k in
                                        ("ivr", "as_", "mfs", "coverage", "cert_mfs")], ta,
                                 ind - ta if tr else NAN], float)

            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed, strata=strata)
            results["variants"][v] = {k: ci_dict(a, b, c) for k, a, b, c in zip(keys, est, low, high)}
            results["variants"][v]["n_seeds"] = len(rds)
            results["variants"][v]["undertrained"] = undertrained([rd.run for rd in rds])
    ref = results["variants"][reference]
    md_rows = []
    for v, res in results["variants"].items():
        for k, rk in (("ivr", "ivr_change"), ("mfs", "mfs_change")):
            a, b = res[k]["estimate"], ref[k]["estimate"]
            res[rk] = num((a - b) / b) if a is not None and b not in (None, 0) else None
        def g(k: str, res: dict[str, Any] = res) -> str:
            return fmt_cell(res[k])

        def pct(x: float | None) -> str:
            return "—" if x is None else f"{100 * x:+.0f}%"

        lab = f"{v} {UNDERTRAINED_MARK} {res['undertrained']}" if res["undertrained"] else v
        md_rows.append([lab, res["n_seeds"], g("in_dist_auroc"), g("ivr"), pct(res["ivr_change"]), g("as"), g("mfs"),
                        pct(res["mfs_change"]), g("coverage"), g("cert_mfs"),
                        *([g("transfer_auroc"), g("gap")] if trows else [])])
    header = ["Variant", "Seeds", "In-dist", "IVR", "ΔIVR", "AS", "MFS", "ΔMFS", "Coverage κ", "MFS cert",
              *(["Transfer", "Gap"] if trows else [])]
    md = (f"Mean over seeds, 95 % CIs: percentile bootstrap over base items (unit: base item); Δ relative to "
          f"**{reference}**; MFS at full coverage, MFS cert at SGR coverage (α = {selective.alpha}, "
          f"{bound_unit(selective)}).\n\n" + markdown_table(header, md_rows)
          + "\n".join(undertrained_note({v: r["undertrained"] for v, r in results["variants"].items()
                                          if r["undertrained"]})))
    return Section(key, title, md, results=results)


@register_section
class Ablations(ReportSection):
    """Table 4, one section per detector with ≥ 2 ablation variants (:attr:`ReportContext.ablations`)."""

    name = "ablations"
    order = 50

    def build(self, ctx: ReportContext) -> list[Section]:
        o = ctx.options
        return [ablation_table(v["test"], ctx.pairs, transfer=v["transfer"] or None, calib=v["calib"],
                               options=o, key=f"ablations_{det}", title=f"Ablations of {det} (Table 4)",
                               table=ctx.table)
                for det, v in ctx.ablations.items()]
