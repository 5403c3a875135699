"""The operating-point kernel (sift.metrics.operating) and its rules: tie rule, realised κ, infeasible rule; every
caller (main tables, selective risk, appendix, torchmetrics callback) gives the kernel's numbers, and the appendix
certifies with the configured SGR bound."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))
import ev_toy as toy  # noqa: E402

from sift.evaluation.appendix_detectors import abstention_characterisation, label_noise_sensitivity  # noqa: E402
from sift.evaluation.engine import ReportOptions
from sift.evaluation.sections.main_table import main_table  # noqa: E402
from sift.evaluation.sections.selective_risk import selective_risk_section  # noqa: E402
from sift.evaluation.training_metrics import MetaFaithfulness  # noqa: E402
from sift.metrics import risk_at_coverage, select_top, sgr  # noqa: E402
from sift.metrics.appendix_helpers import expected_cost_curve  # noqa: E402
from sift.metrics.operating import (  # noqa: E402
    OperatingPoint,
    PairArrays,
    coverage_threshold,
    operating_metrics,
)
from sift.metrics.selective import SelectiveConfig, gate  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ------------------------------------------------------------------------------------------------ the rules
RHO = np.array([0.9, 0.8, 0.8, 0.8, 0.6])


def test_coverage_point_certifies_every_trace_tied_with_its_threshold():
    # κ = 0.4 of 5 traces: t = the 2nd largest ρ = 0.8, tied three times: all three are certified (coverage 0.8)
    assert coverage_threshold(RHO, 0.4) == 0.8
    assert select_top(RHO, 0.4).tolist() == [True, True, True, True, False]
    # the risk follows: errors on two of the tied traces → 2 of 4 (exactly ⌈κn⌉ = 2 by position gave 0 of 2)
    assert risk_at_coverage(RHO, [1, 1, 0, 0, 1], 0.4) == 0.5
    # and it does not depend on the order of the rows
    perm = np.array([3, 0, 4, 2, 1])
    assert risk_at_coverage(RHO[perm], np.array([1, 1, 0, 0, 1])[perm], 0.4) == 0.5
    assert not select_top(RHO, 0.0).any()


def test_realised_coverage_is_kappa_in_mfs():
    verdict = np.array([1, 1, 1, 0, 0])
    pres = PairArrays(np.array([0, 1]), np.array([2, 3]), axis=np.array([0, 0]))   # 0→2 same, 1→3 flips
    alt = PairArrays(np.array([0]), np.array([4]), label_src=np.array([1]), label_dst=np.array([0]))
    m = operating_metrics(OperatingPoint.at_coverage(0.4), RHO, verdict, RHO, pres, alt)
    assert (m.threshold, m.coverage, m.ivr) == (0.8, 0.8, 0.5)   # κ realised 4/5, not the nominal 0.4
    assert math.isnan(m.as_) and math.isnan(m.mfs)               # the altering pair's shifted trace is not certified
    full = operating_metrics(OperatingPoint.full(), RHO, verdict, RHO, pres, alt)
    assert (full.coverage, full.ivr, full.as_) == (1.0, 0.5, 1.0)
    assert full.mfs == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    gate_pt = operating_metrics(OperatingPoint.at_gate(0.85), RHO, verdict, RHO, pres, alt)
    assert gate_pt.coverage == 0.2 and math.isnan(gate_pt.ivr)


def test_infeasible_sgr_certifies_nothing_and_scores_zero():
    verdict = np.array([1, 1, 1, 0, 0])
    pres = PairArrays(np.array([0]), np.array([2]), axis=np.array([0]))
    alt = PairArrays(np.array([0]), np.array([4]), label_src=np.array([1]), label_dst=np.array([0]))
    m = operating_metrics(OperatingPoint.sgr(0.7, feasible=False), RHO, verdict, RHO, pres, alt)
    assert (m.threshold, m.coverage, m.mfs) == (math.inf, 0.0, 0.0)
    assert math.isnan(m.ivr) and math.isnan(m.as_)
    ok = operating_metrics(OperatingPoint.sgr(0.7, feasible=True), RHO, verdict, RHO, pres, alt)
    assert ok.coverage == 0.8 and ok.ivr == 0.0 and math.isnan(ok.as_)


def test_gate_formula_on_arrays_and_tensors():
    s = np.array([0.1, 0.5, 0.75])
    assert gate(s).tolist() == [0.9, 0.5, 0.75]
    assert gate(torch.tensor([[0.2, 0.6]])).tolist() == [[pytest.approx(0.8), pytest.approx(0.6)]]


def test_expected_cost_commits_the_tied_traces():
    # κ = 0.25 of 4: t = 0.9, tied twice → both committed; the unfaithful one (label 0, verdict 1) is a FN
    rho, v, y = np.array([0.9, 0.9, 0.6, 0.55]), np.array([1, 1, 0, 0]), np.array([1, 0, 0, 1])
    cost = expected_cost_curve(rho, v, y, [0.25], c_fn=10.0, c_fp=1.0, c_abstain=2.0, base_rate=0.5)
    # committed: FN 1 of 1 unfaithful, FP 0 of 1 faithful → 0.25·(0.5·1·10) + 0.75·2
    assert cost[0] == pytest.approx(0.25 * 5.0 + 0.75 * 2.0)


# --------------------------------------------------------------------------------------- every caller agrees
def test_matched_coverage_in_the_selective_risk_table_follows_the_tie_rule():
    # toy seed 0: ρ sorted .95 .9 .9 .9 .8 .8 .8 .7 .7 .65 .6 .6 .6 .55 .55; κ = 0.7 → 11th largest = 0.6, tied
    # three times → 13 of 15 certified (i3/b, i3/p are not). Certified pairs: paraphrase i0 ok, i1 flips, i2 ok
    # (1/3); hint i0 ok, i2 flips (1/2); altering i0 ok, i1 fails, i2 ok (2/3). MFS = 13/15 · HM(7/12, 2/3).
    sec = selective_risk_section({"toy": [toy.predictions(0)]}, toy.pairs(),
                                 options=ReportOptions(n_resamples=0))  # κ = 0.70
    matched = sec.results["detectors"]["toy"]["matched"]
    hm = 2 * (7 / 12) * (2 / 3) / (7 / 12 + 2 / 3)
    assert matched["mfs"]["estimate"] == pytest.approx(13 / 15 * hm)
    assert matched["risk"]["estimate"] == pytest.approx(4 / 13)   # errors i1/p, i1/a, i3/a, i2/h
    assert matched["coverage"] == pytest.approx(13 / 15)          # the realised κ, shown beside the nominal 0.70


def test_infeasible_certificate_gives_zero_in_the_table_and_the_callback():
    strict = SelectiveConfig(alpha=0.01, delta=0.05, candidates=(0.75,))
    table = main_table({"toy": [toy.predictions(0)]}, toy.pairs(),
                       options=ReportOptions(selective=strict, n_resamples=0))
    row = table.results["detectors"]["toy"]
    assert row["cert_mfs"]["estimate"] == 0.0
    p0, pr = toy.predictions(0), toy.pairs()
    idx = p0.index()
    s, d = np.array([idx[t] for t in pr.source_id]), np.array([idx[t] for t in pr.shifted_id])
    v, rho = torch.tensor(p0.verdict), torch.tensor(p0.confidence)
    m = MetaFaithfulness(["paraphrase", "hint_format"], alpha=0.01, delta=0.05, candidates=[0.75])
    m.update_pairs(list(pr.axis), list(pr.kind), v[s], v[d], torch.tensor(pr.phi_source),
                   torch.tensor(pr.phi_shifted), rho[s], rho[d])
    m.update_traces(rho, torch.tensor(p0.correct), list(p0.base_item))
    out = {k: float(x) for k, x in m.compute().items()}
    assert out["sgr_feasible"] == 0.0 and out["coverage"] == 0.0
    assert out["cert/mfs"] == 0.0 and math.isnan(out["cert/ivr"])


# ---------------------------------------------------------------------------------- the appendix's SGR bound
def test_appendix_certifies_with_the_configured_bound():
    p = toy.predictions(0)
    runs = {"toy": [p]}
    for bound in ("normal", "clopper-pearson", "betting"):
        cfg = SelectiveConfig(alpha=0.3, delta=0.5, bound=bound)
        t = sgr(p.confidence, p.correct, 0.3, 0.5, bound=bound, groups=p.base_item).threshold
        ab = abstention_characterisation(runs, selective=cfg, n_resamples=2)
        assert bound in ab.results["operating_point"]
        expected = float(np.mean(p.confidence < t)) if math.isfinite(t) else 1.0
        assert ab.results["detectors"]["toy"]["abstention_rate"]["estimate"] == pytest.approx(expected)
        ln = label_noise_sensitivity(runs, toy.pairs(), None, noise_rates=(0.0,), n_draws=1, n_resamples=2,
                                     selective=cfg)
        cov = ln.results["curves"]["toy"]["sgr_coverage"][0]["estimate"]
        assert ln.results["bound"] == bound
        assert cov == pytest.approx(float(np.mean(p.confidence >= t)) if math.isfinite(t) else 0.0)
    # the normal bound certifies where betting does not on this toy, so the test tells them apart
    thresholds = {b: sgr(p.confidence, p.correct, 0.3, 0.5, bound=b, groups=p.base_item).threshold
                  for b in ("normal", "betting")}
    assert thresholds["normal"] != thresholds["betting"]


def test_the_job_hands_its_sgr_node_to_the_appendix(monkeypatch):
    from sift.evaluation import appendix, faithshift_report

    seen = {}

    def fake_run_appendix(inputs, names=None, options=None, common=None):
        seen.update(options or {})
        return [None]

    monkeypatch.setattr(appendix, "run_appendix", fake_run_appendix)
    cfg = OmegaConf.create({"bootstrap": {"appendix_resamples": 2, "seed": 0}, "workers": 1,
                            "detectors": ["sift", "instance_level"],
                            "sgr": {"alpha": 0.2, "delta": 0.1, "bound": "normal", "candidates": [0.6, 0.9],
                                    "max_traces": 7}})
    faithshift_report.appendix_sections(cfg, {})
    want = SelectiveConfig(0.2, 0.1, "normal", (0.6, 0.9), 7)
    assert seen["label_noise"]["selective"] == want and seen["abstention"]["selective"] == want
    assert seen["factorial"]["coverage"] == want.match_coverage
    assert seen["stability_sensitivity"]["coverages"] == (None, want.match_coverage)


def test_sgr_and_kappa_defaults_come_from_the_packaged_sgr_config():
    import yaml

    from sift.evaluation.callbacks import MetaEvalCallback
    from sift.resources import config_dir

    node = yaml.safe_load((config_dir() / "sgr" / "default.yaml").read_text())
    cfg = SelectiveConfig()
    assert (cfg.alpha, cfg.delta, cfg.bound, cfg.match_coverage) == (node["alpha"], node["delta"], node["bound"],
                                                                     node["match_coverage"])
    assert list(cfg.alphas) == node["alphas"]
    m = MetaFaithfulness(["paraphrase"])
    assert (m.alpha, m.delta, m.bound) == (cfg.alpha, cfg.delta, cfg.bound)
    assert MetaEvalCallback().alpha is None   # resolved by MetaFaithfulness to the same default
    assert SelectiveConfig.of({"match_coverage": 0.5, "alphas": [0.1]}) == SelectiveConfig(alphas=(0.1,),
                                                                                           match_coverage=0.5)
