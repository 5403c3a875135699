"""Expected calibration error with stated binning (docs/design.md §7)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from sift.errors import SiftError
from sift.metrics.checks import as_binary, as_finite, same_length, undefined
from sift.metrics.selective import gate


def uniform_bin_index(confidence: ArrayLike, n_bins: int) -> np.ndarray:
    """Bin of each confidence among B equal-width, right-closed bins ((b−1)/B, b/B], the first also holding 0
    (Guo et al.; torchmetrics instead uses left-closed bins)."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return np.searchsorted(edges[1:-1], np.asarray(confidence, dtype=float), side="left")


def calibration_bins(confidence: np.ndarray, accuracy: np.ndarray, n_bins: int = 10,
                     strategy: Literal["uniform", "quantile"] = "uniform"
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sizes, mean accuracy and mean confidence of the non-empty bins (the ECE/MCE kernel's input).

    ``"uniform"``: :func:`uniform_bin_index`; ``"quantile"``: equal-mass bins from a stable sort split into B
    chunks of sizes differing by ≤ 1 (ties may straddle bins; empty chunks skipped).
    """
    if strategy == "uniform":
        bins = uniform_bin_index(confidence, n_bins)
        chunks = [np.flatnonzero(bins == k) for k in range(n_bins)]
    elif strategy == "quantile":
        chunks = np.array_split(np.argsort(confidence, kind="mergesort"), n_bins)
    else:
        raise SiftError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")
    chunks = [idx for idx in chunks if idx.size]
    sizes = np.array([idx.size for idx in chunks], dtype=float)
    acc = np.array([accuracy[idx].mean() for idx in chunks], dtype=float)
    conf = np.array([confidence[idx].mean() for idx in chunks], dtype=float)
    return sizes, acc, conf


def ece_from_bins(sizes: np.ndarray, accuracy: np.ndarray, confidence: np.ndarray) -> float:
    """ECE = Σ_b (n_b/n)·|acc_b − conf_b| over the bins of :func:`calibration_bins`."""
    return float(np.sum(sizes * np.abs(accuracy - confidence)) / np.sum(sizes))


def ece(
    probs: ArrayLike,
    labels: ArrayLike,
    n_bins: int = 10,
    strategy: Literal["uniform", "quantile"] = "uniform",
    reliability: Literal["top_label", "positive_class"] = "top_label",
) -> float:
    """ECE = Σ_b (n_b/n)·|acc_b − conf_b| over non-empty bins (Naeini et al. 2015; Guo et al. 2017).

    ``probs`` = P(faithful = 1). ``reliability="top_label"`` (default, Guo): conf = max(p, 1−p),
    acc = 1[1[p ≥ 0.5] = label]. ``"positive_class"``: conf = p, acc = label (the convention of
    torchmetrics ``BinaryCalibrationError``). Binning: :func:`calibration_bins`. Empty input: NaN with a warning.
    """
    p, y = as_finite("probs", probs), as_binary("labels", labels)
    n = same_length(probs=p, labels=y)
    if np.any((p < 0) | (p > 1)):
        raise SiftError("probs must lie in [0, 1]")
    if n_bins < 1:
        raise SiftError(f"n_bins must be >= 1, got {n_bins}")
    if strategy not in ("uniform", "quantile"):
        raise SiftError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")
    if n == 0:
        return undefined("ECE undefined: no predictions")
    if reliability == "top_label":
        conf, acc = gate(p), ((p >= 0.5).astype(int) == y).astype(float)
    elif reliability == "positive_class":
        conf, acc = p, y.astype(float)
    else:
        raise SiftError(f"reliability must be 'top_label' or 'positive_class', got {reliability!r}")
    return ece_from_bins(*calibration_bins(conf, acc, n_bins, strategy))
