"""Decision thresholds frozen on in-distribution validation, and the confidence gate ρ (docs/design.md §6–§7)."""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import torch
from numpy.typing import ArrayLike

from sift.errors import SiftError
from sift.metrics.selective import gate

ThresholdMethod = Literal["youden", "balanced_accuracy", "accuracy", "fixed"]


def fit_threshold(probs: ArrayLike, labels: ArrayLike, method: ThresholdMethod = "youden",
                  default: float = 0.5) -> float:
    """Threshold t on P(faithful) for the verdict ``prob >= t``, chosen on validation.

    ``youden`` maximises J = TPR − FPR, which is the same as maximising balanced accuracy
    (BA = (1 + J)/2), so ``balanced_accuracy`` is an alias; ``accuracy`` maximises plain accuracy;
    ``fixed`` returns ``default``. Candidates are midpoints between consecutive distinct scores (plus one
    below the minimum and one above the maximum); ties go to the candidate closest to ``default``.
    A single-class or empty validation set returns ``default`` with a warning.
    """
    if method == "fixed":
        return float(default)
    if method not in ("youden", "balanced_accuracy", "accuracy"):
        raise SiftError(f"threshold method must be youden|balanced_accuracy|accuracy|fixed, got {method!r}")
    p = np.asarray(probs, dtype=float).ravel()
    y = np.asarray(labels, dtype=float).ravel()
    if p.shape != y.shape:
        raise SiftError(f"probs and labels differ in length: {p.size} vs {y.size}")
    n_pos, n_neg = int((y == 1).sum()), int((y == 0).sum())
    if n_pos == 0 or n_neg == 0:
        warnings.warn(f"threshold: validation has a single class ({n_pos} positive, {n_neg} negative); "
                      f"using {default}", stacklevel=2)
        return float(default)
    u = np.unique(p)
    cands = np.concatenate([[u[0] - 1e-6], (u[:-1] + u[1:]) / 2, [u[-1] + 1e-6]])
    # predicted positive iff p >= t: counts by searchsorted on the sorted scores
    order = np.argsort(p)
    ps, ys = p[order], y[order]
    pos_below = np.concatenate([[0], np.cumsum(ys)])  # positives among the first k sorted scores
    k = np.searchsorted(ps, cands, side="left")  # number of scores < t
    tp = n_pos - pos_below[k]
    fp = (len(p) - k) - tp
    tpr, fpr = tp / n_pos, fp / n_neg
    score = tpr - fpr if method in ("youden", "balanced_accuracy") else (tp + (n_neg - fp)) / len(p)
    best = np.flatnonzero(score >= score.max() - 1e-12)
    return float(cands[best[np.argmin(np.abs(cands[best] - default))]])


def confidence_gate(probs: torch.Tensor) -> torch.Tensor:
    """ρ per trace, for a tensor of probabilities (:func:`sift.metrics.selective.gate`)."""
    return gate(probs)
