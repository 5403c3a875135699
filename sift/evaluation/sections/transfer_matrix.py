"""Paper Table 2: the transfer matrix (AUROC of each train → test cell)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sift.errors import SiftError
from sift.evaluation.analysis import (
    NAN,
    bootstrap_vector,
    common_items,
    num,
    seed_mean,
)
from sift.evaluation.engine import PredictionTable, ReportContext, runs_table
from sift.evaluation.predictions import Predictions
from sift.evaluation.sections.common import (
    as_list,
    ci_dict,
    nz,
)
from sift.evaluation.sections.registry import ReportSection, register_section
from sift.metrics import (
    UndefinedMetricWarning,
)
from sift.metrics.classification import auroc_kernel
from sift.report import Section, markdown_table
from sift.report.numbers import fmt, fmt_ci

#: the test set of a held-out run's own training distribution (its in-distribution test split)
IN_DIST = "in-distribution"


def transfer_matrix(preds: Mapping[tuple[str, str], Predictions | Sequence[Predictions]], *,
                    families: Mapping[str, str] | None = None, order: Sequence[str] | None = None,
                    out_dir: str | Path | None = None, n_resamples: int = 1000, seed: int = 0,
                    key: str = "transfer_matrix", title: str = "Transfer matrix (Table 2)",
                    setting: str = "train → test", table: PredictionTable | None = None) -> Section:
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
        if table is None:
            table = runs_table({f"{tr}->{te}": v for (tr, te), v in preds.items()})
        for (tr, te), v in preds.items():
            runs = as_list(v)
            items = common_items(runs)
            views = [table.run_data(r, paired=False).index(items) for r in runs]

            def vec(drawn, views=views):
                vals = []
                for rd in views:
                    rows = rd.trace_index.rows(drawn)
                    vals.append(auroc_kernel(rd.prob[rows], rd.label[rows]) if rows.size else NAN)
                return np.array([seed_mean(vals)])

            est, low, high = bootstrap_vector(vec, len(items), n_resamples, seed)
            if tr not in rows_n:
                raise SiftError(f"transfer_matrix: training set {tr!r} is not in order={list(order or [])}")
            i, j = rows_n.index(tr), cols_n.index(te)
            mat[i, j], lo_m[i, j], hi_m[i, j] = est[0], low[0], high[0]
            cells[f"{tr}->{te}"] = {**ci_dict(est[0], low[0], high[0]), "n_seeds": len(runs),
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
          f"the base items of each cell's test split (unit: base item). Mean transfer = mean of a row's held-out "
          f"cells; gap = in-distribution − mean transfer.", "",
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
    # room for the labels (model names run to 40 characters; about 0.07 in per character at font size 8)
    row_chars, col_chars = max(map(len, rows), default=0), max(map(len, cols), default=0)
    fig, ax = plt.subplots(figsize=(1.6 + 0.8 * n_c + 0.07 * row_chars, 0.8 + 0.7 * n_r + 0.05 * col_chars))
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
    fig.savefig(out_dir / fname, dpi=120, bbox_inches="tight")  # never clip a long label
    plt.close(fig)
    return fname


@register_section
class TransferMatrices(ReportSection):
    """Table 2, one section per detector and matrix setting (:attr:`ReportContext.matrices`)."""

    name = "transfer_matrix"
    needs = ("matrices",)
    order = 60

    def build(self, ctx: ReportContext) -> list[Section]:
        o = ctx.options
        return [transfer_matrix(cells, families=o.families, out_dir=ctx.out_dir,
                                key=f"transfer_matrix_{det}_{setting}".replace(" ", "_"),
                                title=f"{setting} transfer of {det} (Table 2)", n_resamples=o.n_resamples,
                                seed=o.seed, table=ctx.table)
                for (det, setting), cells in ctx.matrices.items()]
