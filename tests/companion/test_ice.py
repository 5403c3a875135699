"""ICE metrics (paper 000): analytic cases of spec ice-and-judge-metrics.md §A4–A5."""

import math
from itertools import combinations

import numpy as np
import pytest

from sift.companion import ice
from sift.companion._stats import benjamini_hochberg, bootstrap_mean_ci
from sift.errors import SiftError


def test_nsr_table1_arithmetic():
    assert ice.normalized_score_retention(0.72, 0.78, 0.50) == pytest.approx(0.785714, abs=1e-6)
    assert ice.normalized_score_retention(0.61, 0.78, 0.50) == pytest.approx(0.392857, abs=1e-6)
    # tiny denominator → 0 (code) or NaN on request; clipping to [-2, 2]
    assert ice.normalized_score_retention(0.9, 0.52, 0.50) == 0.0
    assert math.isnan(ice.normalized_score_retention(0.9, 0.52, 0.50, undefined=float("nan")))
    assert ice.normalized_score_retention(0.99, 0.6, 0.5) == 2.0


def test_win_rate_fixed_null():
    null = np.arange(50) / 100
    r = ice.win_rate_test(0.455, null)
    assert r.win_rate == pytest.approx(0.92)
    assert r.p_value == pytest.approx(5 / 51)
    assert r.null_mean == pytest.approx(0.245)
    assert r.null_std == pytest.approx(0.144309, abs=1e-6)
    assert r.d_null == pytest.approx(1.45521, abs=1e-5)
    assert r.tie_rate == 0.0 and r.midrank_win_rate == pytest.approx(0.92)


def test_win_rate_all_ties():
    r = ice.win_rate_test(0.5, np.full(50, 0.5))
    assert r.win_rate == 0.0 and r.p_value == 1.0
    assert r.midrank_win_rate == 0.5 and r.tie_rate == 1.0
    assert math.isnan(r.d_null) and r.degenerate_null
    flag = ice.anti_faithfulness_flag(r.win_rate, r.midrank_win_rate)
    assert flag.anti_faithful and flag.tie_confounded
    assert ice.strict_chance_level(1.0) == 0.0 and ice.strict_chance_level(0.2) == pytest.approx(0.4)


def test_win_rate_nan_draws_and_min_valid():
    null = np.r_[np.arange(10) / 10, [np.nan] * 5]
    r = ice.win_rate_test(0.45, null)
    assert r.n_null == 10 and r.win_rate == 0.5 and r.p_value == pytest.approx(6 / 11)
    assert math.isnan(ice.win_rate_test(0.45, null[:9]).win_rate)


def _bow_score(w):
    def s(units):
        return 1.0 / (1.0 + math.exp(-sum(w[u] for u in units)))

    return ice.batched(s)


def test_linear_bow_oracle_anti_random():
    w = np.zeros(10)
    w[[2, 7]] = 3.0
    units = list(range(10))
    score = _bow_score(w)
    oracle = ice.ice_example(units, w, score, {"delete": ice.delete}, n_null=None)["delete"]
    assert oracle.q == 2 and oracle.rationale == (2, 7)
    assert oracle.stats.win_rate == pytest.approx(44 / 45)  # one null set ties (draws both signal tokens)
    assert oracle.nsr == pytest.approx(1.0) and oracle.s_empty == 0.5
    anti_attr = np.zeros(10)
    anti_attr[[0, 1]] = 1.0
    anti = ice.ice_example(units, anti_attr, score, {"delete": ice.delete}, n_null=None)["delete"]
    assert anti.stats.win_rate == 0.0
    # Uniformly random explanation: exact expectation over every possible rationale.
    strict, mid = [], []
    for r in combinations(range(10), 2):
        attr = np.zeros(10)
        attr[list(r)] = 1.0
        res = ice.ice_example(units, attr, score, {"d": ice.delete}, n_null=None)["d"]
        strict.append(res.stats.win_rate)
        mid.append(res.stats.midrank_win_rate)
    assert np.mean(strict) == pytest.approx(492 / 2025)
    assert np.mean(mid) == pytest.approx(0.5)


def test_linear_bow_sampled_null_and_shared_sets():
    w = np.zeros(10)
    w[[2, 7]] = 3.0
    units = list(range(10))
    res = ice.ice_example(units, w, _bow_score(w), {"a": ice.delete, "b": ice.delete}, n_null=50, seed=3)
    assert res["a"].stats == res["b"].stats  # same null sets reused across operators
    assert res["a"].n_unique_null_sets <= 45
    assert 0.9 <= res["a"].stats.win_rate <= 1.0


def test_rationale_size_and_skip():
    assert ice.rationale_size(3, 0.2) == 1
    assert ice.rationale_size(10, 0.2) == 2
    assert ice.rationale_size(100, 0.29) == 29
    assert ice.ice_example([0], [1.0], ice.batched(lambda u: 0.5), ice.delete) is None  # n ≤ q
    with pytest.raises(SiftError):
        ice.ice_example([0, 1], [1.0, 0.0], ice.batched(lambda u: 0.5), ice.delete, valid_mask=[0, 0])


def test_valid_mask_keeps_template():
    units = ["T", "a", "b", "c", "d", "e", "S"]
    seen = []

    def score(u):
        seen.append(tuple(u))
        return 0.5

    ice.ice_example(units, np.arange(7.0), ice.batched(score), ice.delete, valid_mask=[0, 1, 1, 1, 1, 1, 0], n_null=10)
    assert seen[0] == tuple(units) and seen[1] == ("T", "S")  # x, then ∅: the template with empty content
    for u in seen[2:]:
        assert u[0] == "T" and u[-1] == "S" and len(u) == 3  # template kept, q = 1 content unit


def test_operators():
    toks = ["a", "gorgeous", "witty", "seductive", "movie"]
    keep = np.array([0, 1, 0, 1, 0], bool)
    assert ice.delete(toks, keep) == ["gorgeous", "seductive"]
    corpus = {0: toks, 1: ["the", "good", "plot", "positive"], 2: ["an", "actor", "No"]}
    bl = ice.expand_blacklist(ice.LABEL_BLACKLIST + ice.SENTIMENT_SCRUB)
    assert {" no", "No", "positive"} <= bl
    pool = ice.build_retrieval_pool(corpus, 0, blacklist=bl)
    assert pool == ("the", "plot", "an", "actor")
    op = ice.RetrievalInfill(pool, seed=1)
    out = op(toks, keep)
    assert len(out) == 5 and out[1] == "gorgeous" and out[3] == "seductive"
    assert all(t in pool for i, t in enumerate(out) if not keep[i])
    assert len({out[0], out[2], out[4]}) == 3  # without replacement within a call
    small = ice.retrieval_infill(toks, np.zeros(5, bool), ("x",), np.random.default_rng(0))
    assert small == ["x"] * 5  # pool too small: with replacement
    with pytest.raises(SiftError):
        ice.build_retrieval_pool({0: toks}, 0)
    steps = ["s1", "s2", "s3"]
    assert ice.step_delete(steps, [0, 1, 0]) == ["s1", "s3"]
    assert ice.step_retain(steps, [0, 1, 0]) == ["s2"]
    assert ice.split_cot_steps("First, 3+4=7. Then 7*2=14.\nSo the answer is 14.") == [
        "First, 3+4=7.", "Then 7*2=14.", "So the answer is 14."]


def test_top_k_ties_break_by_position():
    assert ice.top_k_rationale([1, 3, 3, 0, 3], k=0.4).tolist() == [1, 2]


def test_bh_and_granularity():
    bh = benjamini_hochberg([0.01, 0.02, 0.03, 0.04, 0.5], 0.10)
    assert bh.reject.tolist() == [True, True, True, True, False]
    np.testing.assert_allclose(bh.p_adjusted, [0.05, 0.05, 0.05, 0.05, 0.5])
    assert benjamini_hochberg(np.full(500, 1 / 51), 0.10).rejection_rate == 1.0
    assert benjamini_hochberg(np.r_[np.full(98, 1 / 51), np.ones(402)], 0.10).rejection_rate == 0.0
    assert benjamini_hochberg(np.r_[np.full(99, 1 / 51), np.ones(401)], 0.10).rejection_rate == pytest.approx(99 / 500)


def test_bootstrap_ci():
    c = bootstrap_mean_ci(np.full(20, 0.7), n_resamples=200)
    assert c.low == c.high == c.estimate == pytest.approx(0.7)
    x = np.random.default_rng(0).integers(0, 2, 500).astype(float)
    c = bootstrap_mean_ci(x, n_resamples=200, seed=1)
    assert c.high - c.estimate == pytest.approx(0.044, abs=0.01)
    assert c.estimate - c.low == pytest.approx(0.044, abs=0.01)
    assert bootstrap_mean_ci(x, n_resamples=200, seed=1) == c  # seeded, reproducible


def test_summary_and_taxonomy():
    null = np.arange(50) / 100
    rs = [ice.win_rate_test(0.455, null)] * 3 + [ice.win_rate_test(0.0, null)]
    s = ice.ice_summary(rs, n_resamples=100)
    assert s.n_examples == 4 and s.win_rate.estimate == pytest.approx(0.69)
    assert s.taxonomy == "faithful"
    assert s.sig_rate_raw == pytest.approx(0.75)  # raw p = 5/51 < 0.10 ...
    assert s.sig_rate_bh == 0.0  # ... but BH needs p_(3) ≤ 0.075: granularity
    assert s.mean_d_null == pytest.approx((3 * 1.455213 + (0 - 0.245) / 0.144309) / 4, abs=1e-5)
    assert [ice.ice_taxonomy(x / 100) for x in (49.9, 50, 53.9, 55, 59.6, 60, 60.6)] == [
        "anti-faithful", "near-random", "near-random", "weakly faithful", "weakly faithful",
        "weakly faithful", "faithful"]


DEL = np.array([[60.6, 44.0, 64.0, 70.8], [53.2, 71.3, 86.4, 56.0], [53.2, 52.5, 85.2, 47.5],
                [68.4, 94.9, 77.3, 62.2], [57.5, 83.8, 71.1, 51.7], [62.2, 84.6, 63.7, 49.4],
                [45.4, 50.3, 66.6, 57.0]]) / 100
RET = np.array([[52.4, 38.3, 68.2, 73.2], [52.7, 91.8, 42.6, 56.9], [51.5, 75.3, 74.0, 49.4],
                [59.6, 96.3, 77.5, 59.8], [56.1, 89.8, 67.5, 42.7], [53.9, 80.5, 65.5, 46.7],
                [45.5, 49.4, 65.5, 51.1]]) / 100


def test_operator_comparison_table19():
    allc = ice.compare_operators(DEL, RET)
    assert allc.n_configs == 28 and allc.n_crossings == 5
    assert allc.max_abs_gap == pytest.approx(0.438)
    short = ice.compare_operators(DEL[:, [0, 2, 3]], RET[:, [0, 2, 3]])
    assert short.n_a_greater == 14 and short.n_configs == 21
    assert short.median_gap == pytest.approx(0.017) and short.mean_gap == pytest.approx(0.046238, abs=1e-6)
    g = ice.operator_gap(0.864, 0.426)
    assert g.crossing and not g.agree and g.gap == pytest.approx(0.438)
    assert (g.class_a, g.class_b) == ("faithful", "anti-faithful")
    q = ice.operator_gap(0.773, 0.775)
    assert q.agree and not q.crossing


def test_contamination_and_auc():
    assert ice.retrieval_contamination_rate(25) == pytest.approx(0.0020, abs=1e-5)
    assert ice.retrieval_contamination_rate(18) == pytest.approx(0.0014, abs=5e-5)
    assert ice.retrieval_contamination_rate(9) == pytest.approx(0.00072, abs=5e-6)
    assert ice.auc_over_k([0.1, 0.2, 0.3], [0.2, 0.4, 0.4]) == pytest.approx(0.07)


def test_step_src_reasoners():
    steps = [f"s{i}" for i in range(10)]
    critical = {"s0", "s2", "s4", "s6", "s8"}

    def reasoner(cot):
        return 42 if critical <= set(cot) else -1

    r = ice.step_necessity_sufficiency(steps, reasoner, n_subsets=None)
    assert r.q == 2 and r.n_subsets == 45
    assert r.necessity == pytest.approx(7 / 9) and r.sufficiency == 0.0
    assert r.src == pytest.approx(7 / 9) and r.taxonomy == "genuine"
    deco = ice.step_necessity_sufficiency(steps, lambda cot: 42, n_subsets=None)
    assert (deco.necessity, deco.sufficiency, deco.src, deco.taxonomy) == (0.0, 1.0, 0.0, "decorative")
    assert ice.src_taxonomy(0.2) == "scaffolding"


def test_step_ice_win_rates():
    steps = [f"s{i}" for i in range(10)]
    w = {f"s{i}": (1.0 if i in (3, 5) else 0.0) for i in range(10)}

    def score(cot):
        return sum(w[s] for s in cot) / 2

    attr = np.array([w[s] for s in steps])
    r = ice.step_ice(steps, attr, score, n_null=None)
    assert r.rationale == (3, 5) and r.q == 2
    assert r.necessity.win_rate == pytest.approx(44 / 45)
    assert r.sufficiency.win_rate == pytest.approx(44 / 45)
    assert r.sufficiency.midrank_win_rate == pytest.approx(44.5 / 45)


def test_summary_ci_resamples_base_items_when_given():
    """Issue 27: the WR CI's unit is the base item when ``groups`` is given (twelve traces of three items)."""
    null = np.arange(50) / 100
    rs = [ice.win_rate_test(x, null) for x in (0.0, 0.2, 0.3, 0.45) * 3]
    items = [f"i{k % 4}" for k in range(12)]  # every item's three traces have one win rate
    flat = ice.ice_summary(rs, n_resamples=300, seed=3)
    clus = ice.ice_summary(rs, n_resamples=300, seed=3, groups=items)
    assert clus.win_rate.estimate == flat.win_rate.estimate
    assert clus.win_rate.high - clus.win_rate.low > 1.4 * (flat.win_rate.high - flat.win_rate.low)
    with pytest.raises(SiftError, match="groups"):
        ice.ice_summary(rs, groups=items[:3])
    c = bootstrap_mean_ci([0.1, np.nan, 0.3], n_resamples=50, groups=["a", "b", "a"])  # NaN dropped with its group
    assert c.estimate == pytest.approx(0.2) and c.low == c.high == pytest.approx(0.2)


def test_ice_example_scores_one_batch_per_operator_and_checks_its_shape():
    units, w = list(range(10)), np.zeros(10)
    w[[2, 7]] = 3.0
    batches = []

    def score(seqs):
        batches.append(len(seqs))
        return _bow_score(w)(seqs)

    ice.ice_example(units, w, score, {"a": ice.delete, "b": ice.delete}, n_null=5, seed=[1, 2])
    assert batches == [3 + 5, 3 + 5]  # x, ∅, the rationale and 5 null sets, once per operator
    with pytest.raises(SiftError, match=r"score returned shape \(2,\) for 8 sequences"):
        ice.ice_example(units, w, lambda seqs: np.zeros(2), ice.delete, n_null=5)
