"""Functional metrics for auditing faithfulness detectors (paper §4, §6.1.3, App. E, I, K; docs/design.md §7).

NumPy arrays in, floats or small frozen dataclasses out. Undefined inputs give NaN plus an
``UndefinedMetricWarning`` (or a ``reason`` field); mismatched lengths raise ``sift.errors.SiftError``.
"""

from sift.metrics.agreement import cohen_kappa, fleiss_kappa
from sift.metrics.bootstrap import BootstrapResult, cluster_bootstrap
from sift.metrics.bounds import IVRLowerBound, estimate_gamma, gaussian_ivr_bound, ivr_lower_bound
from sift.metrics.calibration import ece
from sift.metrics.checks import UndefinedMetricWarning
from sift.metrics.classification import TransferAUROC, auroc, transfer_auroc
from sift.metrics.invariance import (
    SeedRepeatDecomposition,
    alteration_sensitivity,
    invariance_violation_rate,
    ivr_per_axis,
    meta_faithfulness_score,
    seed_repeat_decomposition,
)
from sift.metrics.selective import (
    DEFAULT_CANDIDATES,
    RiskCoverageCurve,
    SGRResult,
    confidence_gate,
    risk_at_coverage,
    risk_upper_bound,
    select_top,
    sgr,
)
from sift.metrics.significance import (
    BHResult,
    ClusteredPairedResult,
    McNemarResult,
    benjamini_hochberg,
    clustered_mcnemar,
    mcnemar,
)

__all__ = [
    "BHResult",
    "BootstrapResult",
    "ClusteredPairedResult",
    "DEFAULT_CANDIDATES",
    "IVRLowerBound",
    "McNemarResult",
    "RiskCoverageCurve",
    "SGRResult",
    "SeedRepeatDecomposition",
    "TransferAUROC",
    "UndefinedMetricWarning",
    "alteration_sensitivity",
    "auroc",
    "benjamini_hochberg",
    "cluster_bootstrap",
    "clustered_mcnemar",
    "cohen_kappa",
    "confidence_gate",
    "ece",
    "estimate_gamma",
    "fleiss_kappa",
    "gaussian_ivr_bound",
    "invariance_violation_rate",
    "ivr_lower_bound",
    "ivr_per_axis",
    "mcnemar",
    "risk_at_coverage",
    "risk_upper_bound",
    "select_top",
    "meta_faithfulness_score",
    "seed_repeat_decomposition",
    "sgr",
    "transfer_auroc",
]
