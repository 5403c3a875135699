"""AUROC and the in-distribution / transfer gap (paper §7.2, Table 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from numpy.typing import ArrayLike
from sklearn.metrics import roc_auc_score

from sift.metrics._checks import as_binary, as_finite, same_length, undefined


@dataclass(frozen=True)
class TransferAUROC:
    """In-distribution and shifted AUROC; ``gap = in_dist - transfer`` (paper Table 1 "Gap")."""

    in_dist: float
    transfer: float
    gap: float


def auroc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Area under the ROC curve, positive class = faithful (label 1), ties counted 1/2.

    Paper §7.2 (Table 1). Uses ``sklearn.metrics.roc_auc_score`` (Mann-Whitney U / (n+ n-)).
    Undefined when ``labels`` hold a single class or are empty: returns NaN and emits an
    ``UndefinedMetricWarning`` (sklearn would raise).
    """
    s, y = as_finite("scores", scores), as_binary("labels", labels)
    same_length(scores=s, labels=y)
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == y.size:
        return undefined(
            f"AUROC undefined: labels contain a single class ({n_pos} positive of {y.size})"
        )
    return float(roc_auc_score(y, s))


def transfer_auroc(
    id_scores: ArrayLike,
    id_labels: ArrayLike,
    shifted_scores: ArrayLike,
    shifted_labels: ArrayLike,
) -> TransferAUROC:
    """AUROC in distribution and under shift, and the transfer gap (paper §7.2, Table 1).

    A NaN on either side (single-class split) makes the gap NaN.
    """
    a = auroc(id_scores, id_labels)
    b = auroc(shifted_scores, shifted_labels)
    gap = a - b if not (math.isnan(a) or math.isnan(b)) else math.nan
    return TransferAUROC(in_dist=a, transfer=b, gap=gap)
