"""System-1 decision-model audit metrics (paper 003; spec ``system1-and-edct-metrics.md`` Part A).

Calibration (ECE_w / ECE_m / MCE, Brier, selective AUROC, E-AURC), the provider confidence transform,
cross-question interference, and prompt-injection guard metrics. Attributions (S1-SHAP, gate recovery)
live in :mod:`sift.companion.attribution`.

Inputs are probability matrices ``probs`` of shape (n, K) (a 1-D array is a Noul head P(true) and is
expanded to (1 − P, P)) and integer gold labels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats
from sklearn.metrics import average_precision_score

from sift.companion._stats import BootstrapCI, bootstrap_ci, clopper_pearson
from sift.errors import SiftError
from sift.metrics.calibration import calibration_bins, ece_from_bins, uniform_bin_index
from sift.metrics.classification import auroc_kernel

# ----------------------------------------------------------------------------------------------
# Probability vectors
# ----------------------------------------------------------------------------------------------


def as_prob_matrix(probs) -> np.ndarray:
    """(n, K) probabilities; a 1-D Noul vector P(true) becomes the 2-column (1 − P, P) [spec A2.0]."""
    p = np.asarray(probs, dtype=float)
    if p.ndim == 1:
        p = np.stack([1.0 - p, p], axis=1)
    if p.ndim != 2 or p.shape[1] < 2:
        raise SiftError(f"probabilities must be (n, K≥2) or a 1-D Noul vector, got shape {p.shape}")
    return p


def collapse_nli(probs3, entailment_index: int = 0) -> np.ndarray:
    """HANS collapse [P]: (p(entailment), p(neutral) + p(contradiction))."""
    p = np.asarray(probs3, dtype=float)
    ent = p[:, entailment_index]
    return np.stack([ent, p.sum(1) - ent], axis=1)


def noul_decisions(p_true, threshold: float = 0.5) -> np.ndarray:
    """Noul decision ŷ = 1[P ≥ 0.5] [P: 'thresholded at 0.5', ≥ from the Tensor Trust text]."""
    return (np.asarray(p_true, dtype=float) >= threshold).astype(int)


def predictions(probs) -> np.ndarray:
    """argmax decision; for a 1-D Noul vector the ≥ 0.5 rule (argmax of (1−P, P) would send P = 0.5 to 0)."""
    p = np.asarray(probs, dtype=float)
    return noul_decisions(p) if p.ndim == 1 else p.argmax(1)


@dataclass(frozen=True)
class TopLabel:
    confidence: np.ndarray  #: max_k p_ik (for Noul: max(P, 1 − P))
    prediction: np.ndarray
    correct: np.ndarray  #: 1[ŷ = y]


def top_label(probs, labels) -> TopLabel:
    """Top-label confidence and correctness [P Discussion: 'calibration must be evaluated on max p']."""
    pred = predictions(probs)
    p = as_prob_matrix(probs)
    y = np.asarray(labels, dtype=int)
    return TopLabel(p.max(1), pred, (pred == y).astype(float))


# ----------------------------------------------------------------------------------------------
# Provider confidence [P A2.5]
# ----------------------------------------------------------------------------------------------


def confidence_entropy(probs) -> np.ndarray:
    """c = 1 − H(p)/ln K with natural logs and 0·ln 0 = 0 (the sub-10B provider field)."""
    p = as_prob_matrix(probs)
    k = p.shape[1]
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return 1.0 + plogp.sum(1) / np.log(k)


def confidence_margin(probs) -> np.ndarray:
    """Normalised margin c = (max p − 1/K)/(1 − 1/K) (Clef-27B's field)."""
    p = as_prob_matrix(probs)
    k = p.shape[1]
    return (p.max(1) - 1.0 / k) / (1.0 - 1.0 / k)


def confidence_top2_gap(probs) -> np.ndarray:
    """Top-1 minus top-2 probability."""
    s = np.sort(as_prob_matrix(probs), axis=1)
    return s[:, -1] - s[:, -2]


CONFIDENCE_TRANSFORMS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "entropy": confidence_entropy,
    "margin": confidence_margin,
    "max_p": lambda p: as_prob_matrix(p).max(1),
    "top2_gap": confidence_top2_gap,
}


@dataclass(frozen=True)
class ConfidenceIdentification:
    match: str | None  #: the first transform within ``tol``, else None
    max_abs_error: dict[str, float]


def identify_confidence_transform(probs, confidence, tol: float = 1e-6) -> ConfidenceIdentification:
    """Which closed form produced the provider confidence: max_i |c_i − c_cand(p_i)| < tol [R A2.5]."""
    c = np.asarray(confidence, dtype=float)
    errs = {name: float(np.max(np.abs(c - f(probs)))) for name, f in CONFIDENCE_TRANSFORMS.items()}
    match = next((n for n, e in errs.items() if e < tol), None)
    return ConfidenceIdentification(match, errs)


# ----------------------------------------------------------------------------------------------
# Calibration [P A2.1–A2.4]
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationError:
    ece: float
    mce: float  #: max over non-empty bins
    binning: str
    n_bins: int
    bin_sizes: np.ndarray
    bin_accuracy: np.ndarray
    bin_confidence: np.ndarray


def bin_indices(confidence, n_bins: int = 10) -> np.ndarray:
    """Equal-width, right-closed bins ((b−1)/B, b/B] (Guo et al.): 1.0 in the last bin, 0.3 in bin 2
    (``sift.metrics.calibration.uniform_bin_index``).

    torchmetrics differs (left-closed bins, conf = 1.0 in an extra bin): conf = [1.0, 0.95],
    correct = [0, 1] gives 0.475 here and 0.525 there.
    """
    return uniform_bin_index(confidence, n_bins)


def calibration_error(
    confidence,
    correct,
    *,
    n_bins: int = 10,
    binning: str = "width",
    weighting: str = "count",
) -> CalibrationError:
    """ECE = Σ_b (|I_b|/n)|acc(I_b) − conf(I_b)| and MCE = max_b |acc − conf| (Naeini/Guo; body lost in the paper).

    ``binning='width'`` → ECE_w / MCE_w; ``'mass'`` → ECE_m: a stable (mergesort) sort split by
    ``np.array_split`` into B chunks (sizes differ by ≤ 1; tied confidences may straddle bins; empty
    chunks skipped). ``weighting='uniform'`` averages non-empty bins equally (not a paper metric).
    """
    conf = np.asarray(confidence, dtype=float).ravel()
    corr = np.asarray(correct, dtype=float).ravel()
    if conf.size != corr.size or conf.size == 0:
        raise SiftError("calibration_error: confidence and correct must be equal-length and non-empty")
    if binning not in ("width", "mass"):
        raise SiftError(f"binning must be 'width' or 'mass', got {binning!r}")
    sizes, acc, cf = calibration_bins(conf, corr, n_bins, "uniform" if binning == "width" else "quantile")
    gap = np.abs(acc - cf)
    if weighting == "count":
        ece = ece_from_bins(sizes, acc, cf)
    elif weighting == "uniform":
        ece = float(gap.mean())
    else:
        raise SiftError(f"weighting must be 'count' or 'uniform', got {weighting!r}")
    return CalibrationError(ece, float(gap.max()), binning, n_bins, sizes.astype(int), acc, cf)


def ece_ci(
    confidence, correct, *, n_bins: int = 10, binning: str = "width", n_resamples: int = 1000, seed: int = 0,
    groups=None,
) -> BootstrapCI:
    """Percentile bootstrap over instances for ECE [R: method not stated; Efron in the bibliography]; with
    ``groups`` (one per instance, e.g. base items) over whole clusters of instances."""
    conf, corr = np.asarray(confidence, float), np.asarray(correct, float)
    return bootstrap_ci(
        lambda i: calibration_error(conf[i], corr[i], n_bins=n_bins, binning=binning).ece,
        conf.size, n_resamples=n_resamples, seed=seed, groups=groups,
    )


def delta_ece_ci(
    conf_clean, correct_clean, conf_pert, correct_pert, *, n_bins: int = 10, binning: str = "width",
    n_resamples: int = 1000, seed: int = 0,
) -> BootstrapCI:
    """ΔECE = ECE(perturbed) − ECE(clean), paired bootstrap (same resampled instance indices) [R]."""
    a, b = np.asarray(conf_clean, float), np.asarray(correct_clean, float)
    c, d = np.asarray(conf_pert, float), np.asarray(correct_pert, float)
    if not a.size == b.size == c.size == d.size:
        raise SiftError("delta_ece_ci: the clean and perturbed arrays must be paired")

    def stat(i: np.ndarray) -> float:
        return (calibration_error(c[i], d[i], n_bins=n_bins, binning=binning).ece
                - calibration_error(a[i], b[i], n_bins=n_bins, binning=binning).ece)

    return bootstrap_ci(stat, a.size, n_resamples=n_resamples, seed=seed)


def brier_score(probs, labels) -> float:
    """Brier = (1/n) Σ_i Σ_k (p_ik − 1[y_i = k])², summed over the K classes (range [0, 2]) [P].

    For Noul this is 2(P − y)², twice sklearn's ``brier_score_loss`` (binary convention).
    """
    p = as_prob_matrix(probs)
    y = np.asarray(labels, dtype=int)
    onehot = np.eye(p.shape[1])[y]
    return float(((p - onehot) ** 2).sum(1).mean())


def selective_auroc(correct, score) -> float:
    """ROC-AUC with positives = correct predictions (Mann–Whitney, ties ½); NaN if all right or all wrong."""
    c = np.asarray(correct, dtype=int)
    return auroc_kernel(np.asarray(score, dtype=float), c)


@dataclass(frozen=True)
class EAURC:
    aurc: float
    aurc_optimal: float
    e_aurc: float
    optimum: str


def e_aurc(score, correct, *, optimum: str = "continuous") -> EAURC:
    """E-AURC = AURC − AURC* (Geifman et al.) [P named; formula R].

    AURC = (1/n) Σ_j risk(top j) with a stable sort on (−score, index) [R]; AURC* continuous
    r + (1 − r) ln(1 − r), or ``optimum='discrete'``: (1/n) Σ_{j>n_c} (j − n_c)/j.
    """
    s = np.asarray(score, dtype=float)
    c = np.asarray(correct, dtype=float)
    n = s.size
    order = np.lexsort((np.arange(n), -s))
    errs = np.cumsum(1.0 - c[order])
    aurc = float(np.mean(errs / np.arange(1, n + 1)))
    r = 1.0 - c.mean()
    if optimum == "continuous":
        opt = 0.0 if r == 0 else (r if r == 1 else r + (1 - r) * np.log(1 - r))
    elif optimum == "discrete":
        nc = int(c.sum())
        j = np.arange(nc + 1, n + 1)
        opt = float(((j - nc) / j).sum() / n)
    else:
        raise SiftError(f"optimum must be 'continuous' or 'discrete', got {optimum!r}")
    return EAURC(aurc, float(opt), aurc - float(opt), optimum)


# ----------------------------------------------------------------------------------------------
# Interference / robustness [P A2.6]
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interference:
    flip_rate: float  #: mean 1[decision_A ≠ decision_B], against the model's own reference
    tv: float  #: mean ½ Σ_k |p^A − p^B|
    n: int


def flip_rate(decisions_a, decisions_b) -> float:
    """(1/n) Σ 1[d_A ≠ d_B] over any decision labels (map permuted options back first)."""
    a, b = np.asarray(decisions_a), np.asarray(decisions_b)
    if a.shape != b.shape or a.size == 0:
        raise SiftError("flip_rate: decision arrays must be equal-length and non-empty")
    return float(np.mean(a != b))


def interference(probs_a, probs_b) -> Interference:
    """Flip rate and TV between two conditions (isolated vs bundled, clean vs perturbed, …)."""
    pa, pb = as_prob_matrix(probs_a), as_prob_matrix(probs_b)
    if pa.shape != pb.shape:
        raise SiftError(f"interference: shapes differ {pa.shape} vs {pb.shape}")
    fr = flip_rate(predictions(probs_a), predictions(probs_b))
    tv = float(np.mean(0.5 * np.abs(pa - pb).sum(1)))
    return Interference(fr, tv, pa.shape[0])


def permute_back(probs_permuted, permutation) -> np.ndarray:
    """Map option-permuted probabilities to canonical order: ``permutation[j]`` = canonical index shown at j."""
    p = as_prob_matrix(probs_permuted)
    out = np.empty_like(p)
    out[:, np.asarray(permutation)] = p
    return out


# ----------------------------------------------------------------------------------------------
# Guardrail (Tensor Trust) [P A2.7]
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardMetrics:
    tpr: float
    fpr: float
    accuracy: float
    auroc: float
    pr_auc: float  #: average precision [R]
    recall_at_zero_false_alarms: float  #: largest TPR with FPR = 0 over all thresholds
    tpr_ci: tuple[float, float]  #: 95 %: Clopper–Pearson (independent inputs) or a cluster bootstrap (``groups``)
    fpr_ci: tuple[float, float]
    n_pos: int
    n_neg: int
    ci_unit: str = "input (Clopper-Pearson)"


def recall_at_zero_false_alarms(is_attack, score) -> float:
    """Share of attacks scored strictly above every benign input (best threshold with FPR = 0)."""
    y = np.asarray(is_attack, dtype=bool)
    s = np.asarray(score, dtype=float)
    if not y.any():
        return float("nan")
    top_neg = s[~y].max() if (~y).any() else -np.inf
    return float(np.mean(s[y] > top_neg))


def _rate_ci(hit: np.ndarray, groups, n_resamples: int, seed: int) -> tuple[float, float]:
    """95 % percentile bootstrap of the mean of ``hit`` over whole clusters ``groups``."""
    if not hit.size:
        return float("nan"), float("nan")
    ci = bootstrap_ci(lambda i: float(hit[i].mean()), hit.size, n_resamples=n_resamples, seed=seed,
                      groups=np.asarray(groups))
    return ci.low, ci.high


def guard_metrics(is_attack, score, threshold: float = 0.5, *, groups=None, n_resamples: int = 1000,
                  seed: int = 0) -> GuardMetrics:
    """Positives = attacks; flagged iff score ≥ threshold [P]. AUROC via sklearn, PR-AUC = average precision.

    TPR / FPR intervals: Clopper–Pearson when the inputs are independent (the paper's prompts); with ``groups``
    (one cluster per input, e.g. the base item of each trace) a percentile bootstrap over clusters instead, since
    inputs of one cluster are not independent draws."""
    y = np.asarray(is_attack, dtype=bool)
    s = np.asarray(score, dtype=float)
    if groups is not None and len(groups) != y.size:
        raise SiftError(f"guard_metrics: {len(groups)} groups for {y.size} inputs")
    flag = s >= threshold
    npos, nneg = int(y.sum()), int((~y).sum())
    tp, fp = int((flag & y).sum()), int((flag & ~y).sum())
    tn = nneg - fp
    both = 0 < npos < y.size
    if groups is not None:
        g = np.asarray(groups)
        cis = (_rate_ci(flag[y].astype(float), g[y], n_resamples, seed),
               _rate_ci(flag[~y].astype(float), g[~y], n_resamples, seed))
        unit = "base item (cluster bootstrap)"
    else:
        nan2 = (float("nan"), float("nan"))
        cis = (clopper_pearson(tp, npos) if npos else nan2, clopper_pearson(fp, nneg) if nneg else nan2)
        unit = "input (Clopper-Pearson)"
    return GuardMetrics(
        tpr=tp / npos if npos else float("nan"),
        fpr=fp / nneg if nneg else float("nan"),
        accuracy=(tp + tn) / y.size,
        auroc=auroc_kernel(s, y.astype(int)),
        pr_auc=float(average_precision_score(y, s)) if both else float("nan"),
        recall_at_zero_false_alarms=recall_at_zero_false_alarms(y, s),
        tpr_ci=cis[0],
        fpr_ci=cis[1],
        n_pos=npos,
        n_neg=nneg,
        ci_unit=unit,
    )


# ----------------------------------------------------------------------------------------------
# Significance [P A2.13]
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WilcoxonResult:
    statistic: float
    p_value: float
    method: str
    zero_method: str
    n: int


def paired_wilcoxon(a, b=None, *, method: str = "auto", zero_method: str = "wilcox") -> WilcoxonResult:
    """Two-sided paired Wilcoxon signed-rank (scipy defaults); records method and zero handling.

    scipy's 'auto' uses the exact null for n ≤ 50 without ties/zeros: p = 2/2^n is attainable, which is
    why the paper's p_adj = 1e-7 on 28 pairs is possible only with the exact test.
    """
    x = np.asarray(a, float) if b is None else np.asarray(a, float) - np.asarray(b, float)
    r = stats.wilcoxon(x, method=method, zero_method=zero_method)
    return WilcoxonResult(float(r.statistic), float(r.pvalue), method, zero_method, x.size)


def rate(k: int, n: int) -> float:
    """k/n (e.g. rule-following rate = rule-following head evaluations / 172)."""
    return k / n


__all__ = [
    "as_prob_matrix", "collapse_nli", "noul_decisions", "predictions", "TopLabel", "top_label",
    "confidence_entropy", "confidence_margin", "confidence_top2_gap", "CONFIDENCE_TRANSFORMS",
    "ConfidenceIdentification", "identify_confidence_transform", "CalibrationError", "bin_indices",
    "calibration_error", "ece_ci", "delta_ece_ci", "brier_score", "selective_auroc", "EAURC", "e_aurc",
    "Interference", "flip_rate", "interference", "permute_back", "GuardMetrics",
    "recall_at_zero_false_alarms", "guard_metrics", "WilcoxonResult", "paired_wilcoxon", "rate",
    "clopper_pearson",
]
