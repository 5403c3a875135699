"""Faithfulness detectors: SIFT, the five baselines of paper §7.1, seed ensembles (docs/design.md §6); the shortcut
controls (:mod:`sift.detectors.controls`, :mod:`sift.detectors.text_sift`)."""

from sift.detectors.baselines import InputSelector, LogisticDetector, MLPDetector
from sift.detectors.ensemble import EnsembleDetector, member_seeds
from sift.detectors.module import DataSpec, DetectorModule, as_env_batches, concat_batches, load_detector
from sift.detectors.penalties import DomainClassifier, GradientReversal, dann_penalty, grad_reverse, irm_penalty
from sift.detectors.sift_model import SIFTDetector, SIFTNet
from sift.detectors.text_sift import TextSIFTDetector
from sift.detectors.thresholds import confidence_gate, fit_threshold

__all__ = [
    "DataSpec", "DetectorModule", "DomainClassifier", "EnsembleDetector", "GradientReversal", "InputSelector",
    "LogisticDetector", "MLPDetector", "SIFTDetector", "SIFTNet", "TextSIFTDetector", "as_env_batches",
    "concat_batches",
    "confidence_gate", "dann_penalty", "fit_threshold", "grad_reverse", "irm_penalty", "load_detector",
    "member_seeds",
]
