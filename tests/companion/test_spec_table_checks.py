"""Audit additions: numbers the specs derive from the papers' own tables, not covered elsewhere."""

import numpy as np
import pytest

from sift.companion import system1 as S


def test_hans_noul_brier_uses_the_k_class_sum():
    # spec A2.2 [I]: HANS Noul acc 0.650, conf 0.928 → ≈ 0.61 with Σ over K = 2 classes (reported 0.597);
    # the binary convention would give about half of it
    n_wrong, n_right = 35, 65
    p_true = np.r_[np.full(n_wrong, 0.928), np.full(n_right, 0.928)]
    y = np.r_[np.zeros(n_wrong, int), np.ones(n_right, int)]
    b = S.brier_score(p_true, y)
    assert b == pytest.approx(0.35 * 2 * 0.928**2 + 0.65 * 2 * 0.072**2)
    assert round(b, 2) == 0.61 and abs(b - 0.597) < 0.02
    assert b == pytest.approx(2 * np.mean((p_true - y) ** 2))


def test_e_aurc_is_zero_at_full_accuracy_table7():
    r = S.e_aurc([0.9, 0.7, 0.6], [1, 1, 1])
    assert (r.aurc, r.aurc_optimal, r.e_aurc) == (0.0, 0.0, 0.0)
    assert S.e_aurc([0.9, 0.7, 0.6], [1, 1, 1], optimum="discrete").e_aurc == 0.0
