"""S1-SHAP, interactions and faithfulness (paper 003): spec system1-and-edct-metrics.md §A5 T8–T10."""

import math

import numpy as np
import pytest

from sift.companion import attribution as A

LOGIT99 = math.log(0.99 / 0.01)  # 4.595120


def test_t8_or2_shapley_s1_loo():
    g = A.boolean_gate_game(6, [0, 1], "OR")
    ks = A.kernel_shap(g, 6)
    assert ks.exact and ks.n_coalitions == 62
    np.testing.assert_allclose(ks.phi, [0.49, 0.49, 0, 0, 0, 0], atol=1e-12)
    np.testing.assert_allclose(A.exact_shapley(g, 6), ks.phi, atol=1e-12)
    s1 = A.s1_shap(g, 6)
    np.testing.assert_allclose(s1.phi, [LOGIT99, LOGIT99, 0, 0, 0, 0], atol=1e-9)
    assert s1.phi[0] == pytest.approx(4.595120, abs=1e-6)
    assert s1.phi.sum() == pytest.approx(s1.full_value - s1.base_value)
    np.testing.assert_allclose(A.loo_attribution(g, 6), np.zeros(6))  # LOO failure mode
    assert A.precision_at_g(ks.phi, [0, 1]) == 1.0 and A.precision_at_g(s1.phi, [0, 1]) == 1.0


def test_t8_or3_and2():
    g3 = A.boolean_gate_game(6, [0, 1, 2], "OR")
    np.testing.assert_allclose(A.kernel_shap(g3, 6).phi[:3], [0.326667] * 3, atol=1e-6)
    np.testing.assert_allclose(A.s1_shap(g3, 6).phi[:3], [3.063413] * 3, atol=1e-6)
    np.testing.assert_allclose(A.loo_attribution(g3, 6), 0.0)
    ga = A.boolean_gate_game(6, [0, 1], "AND")
    np.testing.assert_allclose(A.kernel_shap(ga, 6).phi, [0.49, 0.49, 0, 0, 0, 0], atol=1e-12)
    np.testing.assert_allclose(A.loo_attribution(ga, 6), [0.98, 0.98, 0, 0, 0, 0], atol=1e-12)


def test_t8_logit_additive_recovered_exactly():
    w = [2.0, -1.0, 0.5, 0.0, 3.0]
    g = A.logit_additive_game(-1.0, w)
    np.testing.assert_allclose(A.s1_shap(g, 5).phi, w, atol=1e-10)
    np.testing.assert_allclose(A.kernel_shap(g, 5).phi, [0.2912, -0.1176, 0.0658, 0.0, 0.4624], atol=5e-5)
    # sampled regime (M = 14 > 9): still exact for a logit-additive model; 512 coalitions
    w14 = np.linspace(-1, 1, 14)
    r = A.s1_shap(A.logit_additive_game(0.3, w14), 14, seed=2)
    assert not r.exact and r.n_coalitions == 512
    np.testing.assert_allclose(r.phi, w14, atol=1e-9)


def test_shared_cache_zero_extra_calls():
    g = A.CachedGame(A.boolean_gate_game(6, [0, 1], "OR"), 6)
    A.kernel_shap(g, 6)
    calls = g.n_model_calls
    A.s1_shap(g, 6)
    assert calls == 64 and g.n_model_calls == 64
    words = ["a", "a", "b", "c"]  # memoise by rendered string: deleting either "a" renders the same
    r = A.CachedGame(lambda m: 0.5, 4, key_fn=lambda m: " ".join(w for w, k in zip(words, m) if k))
    A.kernel_shap(r, 4)
    assert r.n_model_calls == 12  # 16 coalitions, 4 collapse onto duplicates
    assert A.logit_link(1.0) == pytest.approx(9.2102, abs=1e-4)


def test_t9_pure_gate_interactions():
    i2 = A.pairwise_interactions(A.boolean_gate_game(6, [0, 1], "OR"), 6, range(6))
    assert i2.sii[0, 1] == pytest.approx(-0.98) and i2.archdetect[0, 1] == pytest.approx(-0.98)
    assert i2.loo_pair[0, 1] == pytest.approx(-0.98) and i2.sii[2, 3] == 0.0
    l2 = A.pairwise_interactions(A.boolean_gate_game(6, [0, 1], "OR"), 6, range(6), space="logit")
    assert l2.sii[0, 1] == pytest.approx(-2 * LOGIT99)
    i3 = A.pairwise_interactions(A.boolean_gate_game(6, [0, 1, 2], "OR"), 6, range(6))
    assert i3.sii[0, 1] == pytest.approx(-0.49) and i3.archdetect[1, 2] == pytest.approx(-0.49)
    assert i3.loo_pair[0, 2] == 0.0
    assert A.gate_recovery(i3.loo_pair, range(6), [0, 1, 2], "OR").recovered is False
    l3 = A.pairwise_interactions(A.boolean_gate_game(6, [0, 1, 2], "OR"), 6, range(6), space="logit")
    assert l3.sii[0, 1] == pytest.approx(-LOGIT99)
    ia = A.pairwise_interactions(A.boolean_gate_game(6, [0, 1], "AND"), 6, range(6))
    assert (ia.sii[0, 1], ia.archdetect[0, 1], ia.loo_pair[0, 1]) == pytest.approx((0.98, 0.98, 0.98))
    assert A.gate_recovery(ia.sii, range(6), [0, 1], "AND").recovered


def _saturated(mask):
    m = np.asarray(mask, bool)
    z = -5.2 + 6.2 * m[:3].any() + np.array([0, 0, 0, -3.6, 2.1, 5.0]) @ m
    return 1 / (1 + np.exp(-z))


def test_t9_saturation_prob_fails_logit_recovers():
    assert _saturated(np.zeros(6, bool)) == pytest.approx(0.0055, abs=1e-4)
    assert _saturated(np.eye(6, dtype=bool)[0]) == pytest.approx(0.731, abs=1e-3)
    assert _saturated(np.ones(6, bool)) == pytest.approx(0.989, abs=1e-3)
    p = A.pairwise_interactions(_saturated, 6, range(6), space="prob")
    assert p.sii[3, 5] == pytest.approx(0.312, abs=5e-4) and p.sii[0, 1] == pytest.approx(-0.3101, abs=5e-5)
    gp = A.gate_recovery(p.sii, range(6), [0, 1, 2], "OR")
    assert gp.pair_precision == pytest.approx(2 / 3) and gp.sign_accuracy == 1.0 and not gp.recovered
    lg = A.pairwise_interactions(_saturated, 6, range(6), space="logit")
    np.testing.assert_allclose([lg.sii[0, 1], lg.sii[0, 2], lg.sii[1, 2]], -3.1, atol=1e-9)
    others = lg.sii.copy()
    others[:3, :3] = 0
    np.testing.assert_allclose(others, 0.0, atol=1e-9)
    assert A.gate_recovery(lg.sii, range(6), [0, 1, 2], "OR").recovered
    for space in ("prob", "logit"):
        inter = A.pairwise_interactions(_saturated, 6, range(6), space=space)
        assert A.gate_recovery(inter.archdetect, range(6), [0, 1, 2], "OR").recovered
        assert not A.gate_recovery(inter.loo_pair, range(6), [0, 1, 2], "OR").recovered
    # end-to-end run: S1-SHAP top-k then logit SII
    assert A.gate_recovery_run(_saturated, 6, [0, 1, 2], "OR", space="logit").recovered
    assert not A.gate_recovery_run(_saturated, 6, [0, 1, 2], "OR", space="prob").recovered


def _planted(hits: int) -> np.ndarray:
    """A 4-feature interaction matrix for an OR gate on triggers 0, 1, 2 (true pairs (0,1), (0,2), (1,2)) whose
    top-3 pairs by |I| hold exactly ``hits`` true pairs: the first ``hits`` true pairs at −2, the others at −0.5,
    and 3 − ``hits`` decoys (pairs with feature 3) at +1, which outrank the weak true pairs."""
    inter = np.zeros((4, 4))
    for k, (a, b) in enumerate([(0, 1), (0, 2), (1, 2)]):
        inter[a, b] = inter[b, a] = -2.0 if k < hits else -0.5
    for a in range(3 - hits):
        inter[a, 3] = inter[3, a] = 1.0
    return inter


def test_gate_recovery_multi_or_granularity():
    # 28 instances × 3 true pairs: per instance precision is hits/3, so the mean is (total hits)/84. Planted
    # hits 18×3 + 8×2 + 1×1 + 1×0 = 71 give 71/84 (0.845 printed); 25×3 + 3×2 = 81 give 81/84 (0.964)
    for design, total, printed in (({3: 18, 2: 8, 1: 1, 0: 1}, 71, 0.845), ({3: 25, 2: 3}, 81, 0.964)):
        runs = [A.gate_recovery(_planted(h), [0, 1, 2, 3], [0, 1, 2], "OR") for h, n in design.items()
                for _ in range(n)]
        assert len(runs) == 28 and all(r.n_true_pairs == 3 and r.sign_accuracy == 1.0 for r in runs)
        assert sorted(r.pair_precision for r in runs) == pytest.approx(sorted(h / 3 for h, n in design.items()
                                                                             for _ in range(n)))
        mean = float(np.mean([r.pair_precision for r in runs]))
        assert mean == pytest.approx(total / 84, abs=1e-12) and round(mean, 3) == printed
        assert sum(r.recovered for r in runs) == design[3]
    inter = np.zeros((4, 4))
    inter[0, 1] = inter[1, 0] = -1.0
    r = A.gate_recovery(inter, [0, 1, 2, 3], [0, 1, 2], "OR")
    # zero-tied pairs are ranked lexicographically: (0, 1) then (0, 2) — a true pair by luck of the tie-break
    assert r.n_true_pairs == 3 and r.pair_precision == pytest.approx(2 / 3) and r.sign_accuracy == pytest.approx(1 / 3)


def test_t10_comp_suff_curves():
    causal = [0, 1, 2, 3, 4]

    def v(mask):
        return 0.1 + 0.08 * np.asarray(mask, bool)[causal].sum()

    order = A.ranking(np.r_[np.ones(5), np.zeros(5)])
    assert A.k_set(10) == [1, 2, 5]
    cs = A.comprehensiveness_sufficiency(v, 10, order)
    assert cs.comprehensiveness == pytest.approx(0.213333, abs=1e-6)
    assert cs.sufficiency == pytest.approx(0.186667, abs=1e-6)
    eraser = A.comprehensiveness_sufficiency(v, 10, order, eraser_normalization=True)
    assert eraser.comprehensiveness == pytest.approx(0.133333, abs=1e-6)
    curve = [0.9, 0.5, 0.3, 0.2, 0.1]
    assert A.curve_auc(curve) == pytest.approx(0.375) and A.curve_auc(curve, "mean") == pytest.approx(0.4)
    dele, ins = A.deletion_insertion_curves(v, 10, order)
    np.testing.assert_allclose(dele[:6], [0.5, 0.42, 0.34, 0.26, 0.18, 0.1])
    assert ins[0] == pytest.approx(0.1) and ins[-1] == pytest.approx(0.5)
    assert A.mass_share([1.0, -2.0, 3.0], [0]) == pytest.approx(0.25)
    assert A.k_set(30) == [1, 2, 3, 6, 15]
