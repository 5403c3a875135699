"""Each metric formula is written once, in a kernel of ``sift.metrics``, and every caller goes through it.

A kernel is patched everywhere it is bound (its home module and every sift module that imported it); the
table, appendix, torchmetrics and companion values must then follow the fake. Library conventions that differ
from the paper's are pinned here too.
"""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "evaluation"))
import ev_toy as toy  # noqa: E402

from sift.companion import _stats, system1  # noqa: E402
from sift.evaluation import analysis, appendix_common, appendix_detectors  # noqa: E402, F401
from sift.evaluation import training_metrics as metrics  # noqa: E402
from sift.evaluation.engine import PredictionTable, ReportOptions  # noqa: E402
from sift.evaluation.sections.main_table import main_table  # noqa: E402
from sift.evaluation.sections.selective_risk import selective_risk_section  # noqa: E402
from sift.evaluation.sections.transfer_matrix import transfer_matrix  # noqa: E402
from sift.metrics import (  # noqa: E402
    auroc,
    benjamini_hochberg,
    betting,
    binomial,
    bootstrap,
    calibration,
    classification,
    ece,
    invariance,
    selective,
)
from sift.metrics.appendix_helpers import cluster_bootstrap_many  # noqa: E402
from sift.metrics.operating import OperatingPoint, operating_metrics  # noqa: E402
from sift.metrics.selective import SelectiveConfig  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def patch_kernel(monkeypatch, home, name: str, fake) -> list[str]:
    """Replace kernel ``home.name`` by ``fake`` in every loaded sift module bound to it; the patched modules."""
    real = getattr(home, name)
    hit = []
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("sift") and getattr(mod, name, None) is real:
            monkeypatch.setattr(mod, name, fake)
            hit.append(mod_name)
    return hit


def _main(**kw):
    runs = {"toy": [toy.predictions(0), toy.predictions(1)]}
    return main_table(runs, toy.pairs(), **kw,
                      options=ReportOptions(selective=toy.CERT, n_resamples=0)).results["detectors"]["toy"]


# ------------------------------------------------------------------------------------- the kernels' callers
def test_auroc_kernel_feeds_tables_appendix_and_companion(monkeypatch):
    hit = patch_kernel(monkeypatch, classification, "auroc_kernel", lambda s, y: 0.625)
    assert {"sift.evaluation.analysis", "sift.evaluation.sections.transfer_matrix",
            "sift.evaluation.appendix_detectors", "sift.companion.system1"} <= set(hit)
    assert _main()["in_dist_auroc"]["estimate"] == 0.625
    assert auroc([0.1, 0.9], [0, 1]) == 0.625
    assert system1.selective_auroc([0, 1, 1], [0.2, 0.3, 0.9]) == 0.625
    cells = {("a", "a"): [toy.predictions(0)]}
    assert transfer_matrix(cells, n_resamples=0).results["auroc"] == [[0.625]]


def test_ivr_as_mfs_kernels_feed_every_caller(monkeypatch):
    def fake_ivr(n, v):
        return np.where(n > 0, 0.125, math.nan), 0.125

    patch_kernel(monkeypatch, invariance, "ivr_compute", fake_ivr)
    patch_kernel(monkeypatch, invariance, "as_compute", lambda n, m: 0.75)
    patch_kernel(monkeypatch, invariance, "mfs_compute", lambda i, a, c=1.0: 0.375)
    r = _main()
    assert (r["ivr"]["estimate"], r["as"]["estimate"], r["mfs"]["estimate"]) == (0.125, 0.75, 0.375)
    assert r["ivr/paraphrase"]["estimate"] == 0.125 and r["cert_mfs"]["estimate"] == 0.375
    # functional API
    assert invariance.invariance_violation_rate([0, 1], [1, 1]) == 0.125
    assert invariance.alteration_sensitivity([0], [1], [0], [1]) == 0.75
    assert invariance.meta_faithfulness_score(0.1, 0.9) == 0.375
    # torchmetrics classes
    m = metrics.MetaFaithfulness(axes=["paraphrase"])
    m.update_pairs(["paraphrase", "x"], ["preserving", "altering"], torch.tensor([0, 0]), torch.tensor([1, 1]),
                   torch.tensor([1, 0]), torch.tensor([1, 1]))
    out = m.compute()
    assert (float(out["ivr"]), float(out["as"]), float(out["mfs"])) == (0.125, 0.75, 0.375)
    ivr_metric = metrics.InvarianceViolationRate(["paraphrase"])
    ivr_metric.update(torch.tensor([0, 1]), torch.tensor([1, 1]), ["paraphrase", "paraphrase"])
    assert float(ivr_metric.compute()["mean"]) == 0.125
    # appendix operating point
    run = toy.predictions(0)
    table = PredictionTable.of([run], toy.pairs())
    stack = table.stack("toy", [run])
    pres, alt = stack.pair_rows("preserving"), stack.pair_rows("altering")
    it, ip, ia = np.arange(len(stack.trace_id)), np.arange(len(pres)), np.arange(len(alt))
    r = stack.rho[0]
    assert operating_metrics(OperatingPoint.full(), r[it], stack.verdict[0], r, pres.arrays(ip),
                             alt.arrays(ia)).as_tuple() == (0.125, 0.75, 1.0, 0.375)


def test_binomial_bound_feeds_sgr_tables_appendix_and_companion(monkeypatch):
    def fake_upper(x, n, tail):
        return np.full(np.shape(np.broadcast_arrays(np.asarray(x, float), np.asarray(n, float))[0]), 0.0625)

    hit = patch_kernel(monkeypatch, binomial, "clopper_pearson_upper", fake_upper)
    assert {"sift.metrics.selective"} <= set(hit)
    assert selective.sgr([0.9, 0.8], [1, 0], 0.1, 0.05, [0.5], "clopper-pearson").bound_value == 0.0625
    cp = SelectiveConfig(0.1, 0.05, "clopper-pearson", (0.5,))
    assert cp.threshold([0.9, 0.8], [1, 0], None) == 0.5   # 0.0625 <= alpha
    cp = SelectiveConfig(bound="clopper-pearson")
    sec = selective_risk_section({"toy": [toy.predictions(0)]}, toy.pairs(),
                                 options=ReportOptions(selective=cp, n_resamples=0))
    assert sec.results["detectors"]["toy"]["by_coverage"]["1.0"]["bound"] == 0.0625
    assert _stats.clopper_pearson(3, 10)[1] == 0.0625


def test_item_bound_feeds_every_certificate(monkeypatch):
    """Issue 27: SGR in the tables, the coverage bounds, the appendix loops and the torchmetrics all certify with
    the one item-bound kernel, given the base item of every trace."""
    seen = []

    def fake(n_sel, n_err, delta, scale, tune_at, values=True):
        seen.append(np.shape(n_sel))
        k = np.atleast_2d(n_sel).shape[0]
        return np.full(k, 0.125), np.ones(k, bool)

    hit = patch_kernel(monkeypatch, betting, "betting_bounds", fake)
    assert sorted(hit) == ["sift.metrics.betting", "sift.metrics.selective"]  # callers all use candidate_bounds
    assert selective.sgr([0.9, 0.8], [1, 0], 0.1, 0.05, [0.5], groups=["a", "b"]).bound_value == 0.125
    assert SelectiveConfig(0.1, 0.05, candidates=(0.5,)).threshold([0.9, 0.8], [1, 0], ["a", "b"]) == 0.5
    assert _main()["sgr"][0]["bound"] == 0.125
    sec = selective_risk_section({"toy": [toy.predictions(0)]}, toy.pairs(),
                                 options=ReportOptions(selective=toy.CERT, n_resamples=0)).results["detectors"]["toy"]
    assert sec["sgr"]["0.7"]["bound"] == 0.125 and sec["by_coverage"]["1.0"]["bound"] == 0.125
    m = metrics.MetaFaithfulness(axes=["paraphrase"])
    m.update_traces(torch.tensor([0.9, 0.8]), torch.tensor([1, 1]), ["a", "b"])
    assert float(m.compute()["sgr_bound"]) == 0.125
    assert all(shape[-1] == 2 for shape in seen[:2])  # two base items, not two traces by accident: items a, b


def test_calibration_kernel_feeds_functional_and_companion_ece(monkeypatch):
    patch_kernel(monkeypatch, calibration, "ece_from_bins", lambda s, a, c: 0.03125)
    assert ece([0.2, 0.9], [0, 1]) == 0.03125
    assert system1.calibration_error([0.2, 0.9], [0, 1]).ece == 0.03125


def test_one_bootstrap_engine_behind_every_front_end():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(12), 3)
    x = rng.normal(size=groups.size)
    items = analysis.Items([f"g{g:02d}" for g in range(12)])  # same order as the integer groups
    rows = items.index([f"g{g:02d}" for g in groups])
    a = bootstrap.cluster_bootstrap(lambda i: x[i].mean(), groups, 40, seed=5)
    b = cluster_bootstrap_many(lambda i: np.array([x[i].mean()]), groups, 40, seed=5)
    c = analysis.bootstrap_vector(lambda d: np.array([x[rows.rows(d)].mean()]), 12, 40, seed=5)
    d = _stats.bootstrap_ci(lambda i: x[i].mean(), groups.size, n_resamples=40, seed=5, groups=groups)
    assert a.low == b.low[0] == c[1][0] == d.low and a.high == b.high[0] == c[2][0] == d.high


# --------------------------------------------------------------------------- library conventions, pinned
def test_auroc_kernel_equals_sklearn_with_ties_and_nan_for_one_class():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 60))
        s, y = rng.integers(0, 5, n).astype(float), rng.integers(0, 2, n)
        if 0 < y.sum() < n:
            assert classification.auroc_kernel(s, y) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    # sklearn raises on a single class; the paper's tables need NaN (an undefined cell)
    assert math.isnan(classification.auroc_kernel(np.array([0.2, 0.3]), np.array([1, 1])))


def test_clopper_pearson_matches_statsmodels_and_is_one_at_x_equals_n():
    for n in (1, 7, 40):
        for x in range(n + 1):
            lo, hi = binomial.clopper_pearson_interval(x, n, 0.9)
            slo, shi = proportion_confint(x, n, alpha=0.1, method="beta")
            assert lo == pytest.approx(slo, abs=1e-12) and hi == pytest.approx(shi, abs=1e-12)
    assert binomial.clopper_pearson_upper(5, 5, 0.05) == 1.0 and binomial.clopper_pearson_lower(0, 5, 0.05) == 0.0
    # one-sided bound with tail δ = the two-sided upper end at level 1 − 2δ
    assert float(binomial.clopper_pearson_upper(2, 9, 0.05)) == pytest.approx(
        proportion_confint(2, 9, alpha=0.1, method="beta")[1], abs=1e-12)


def test_benjamini_hochberg_is_statsmodels_with_nan_left_out():
    p = np.array([0.01, 0.04, np.nan, 0.03, 0.5])
    r = benjamini_hochberg(p, 0.05)
    rej, adj, _, _ = multipletests(p[~np.isnan(p)], alpha=0.05, method="fdr_bh")
    assert np.array_equal(r.p_adjusted[~np.isnan(p)], adj) and math.isnan(r.p_adjusted[2])
    assert np.array_equal(r.reject[~np.isnan(p)], rej) and not r.reject[2]


def test_ivr_floor_and_slope_kernels_feed_the_theorem_audit(monkeypatch):
    from sift.evaluation import appendix_theory
    from sift.metrics import bounds

    patch_kernel(monkeypatch, bounds, "ivr_floor", lambda m, b, s: (0.25, 0.125))
    patch_kernel(monkeypatch, bounds, "slope_through_origin", lambda x, y: -2.0)
    q = appendix_theory.bound_quantities(np.array([0.2, 0.7, 0.6]), np.array([0.6, 0.7, 0.4]), 0.5,
                                         np.array([1.0, 0.0, -1.0]))
    assert (q[0], q[1], q[2]) == (2.0, 0.125, 0.25)   # γ = |slope|, empirical, Gaussian floor
    assert bounds.ivr_lower_bound([0.1, -0.2], [0.3, 0.1]).empirical == 0.125
    assert bounds.estimate_gamma([1.0, 2.0], [1.0, 1.0]) == -2.0


def test_bootstrap_p_value_and_coverage_risk_kernels_feed_the_tables(monkeypatch):
    from sift.metrics import appendix_helpers

    patch_kernel(monkeypatch, bootstrap, "bootstrap_p_value", lambda r, null=0.0, floor=False: 0.0123)
    runs = {"sift": [toy.predictions(0)], "other": [toy.predictions(1, detector="other")]}
    sec = selective_risk_section(runs, toy.pairs(), options=ReportOptions(n_resamples=5))
    assert sec.results["comparisons"]["other"]["p_value"] == 0.0123
    b = appendix_helpers.cluster_bootstrap_many(lambda i: np.array([float(i.size)]), np.arange(4), 5)
    assert b.p_value().tolist() == [0.0123]
    patch_kernel(monkeypatch, selective, "top_coverage_counts", lambda rho, ok, c: (1, 4))
    sec = selective_risk_section({"toy": [toy.predictions(0)]}, toy.pairs(), options=ReportOptions(n_resamples=0))
    assert sec.results["detectors"]["toy"]["by_coverage"]["0.25"]["risk"] == 0.25
    assert selective.risk_at_coverage([0.9, 0.8], [1, 1], 0.5) == 0.25
