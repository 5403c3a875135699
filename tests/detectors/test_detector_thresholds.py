"""Threshold freezing on validation, the gate ρ, and the threshold travelling in the checkpoint."""

import numpy as np
import pytest
import torch

from sift.detectors.thresholds import confidence_gate, fit_threshold


def test_youden_threshold_hand_case():
    p = [0.1, 0.3, 0.35, 0.6, 0.8, 0.9]
    y = [0, 0, 1, 0, 1, 1]
    # t in (0.3, 0.35]: TPR 1, FPR 1/3 → J = 2/3 (best); the midpoint candidate is 0.325
    assert fit_threshold(p, y) == pytest.approx(0.325)
    assert fit_threshold(p, y, "balanced_accuracy") == fit_threshold(p, y)
    # accuracy: t = 0.325 and t = 0.7 both get 5/6 right; the tie goes to the one closer to 0.5
    assert fit_threshold(p, y, "accuracy") == pytest.approx(0.325)
    assert fit_threshold(p, y, "fixed") == 0.5


def test_threshold_separable_and_degenerate():
    t = fit_threshold([0.2, 0.25, 0.7, 0.71], [0, 0, 1, 1])
    assert 0.25 < t <= 0.7
    with pytest.warns(UserWarning, match="single class"):
        assert fit_threshold([0.2, 0.3], [1, 1]) == 0.5


def test_youden_matches_bruteforce():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    p = np.clip(rng.normal(0.4 + 0.2 * y, 0.2), 0, 1)
    t = fit_threshold(p, y)

    def j(t):
        pred = p >= t
        return pred[y == 1].mean() - pred[y == 0].mean()

    def acc(t):
        return ((p >= t) == y).mean()

    assert j(t) == pytest.approx(max(j(c) for c in np.unique(p)))
    assert acc(fit_threshold(p, y, "accuracy")) == pytest.approx(max(acc(c) for c in [*np.unique(p), 2.0]))


def test_confidence_gate():
    s = torch.tensor([0.1, 0.5, 0.8])
    torch.testing.assert_close(confidence_gate(s), torch.tensor([0.9, 0.5, 0.8]))
