"""Metric layer of the four companion papers (specs in shared/specs/).

* :mod:`sift.companion.ice` — ICE win rates vs random baselines, operators, step-level CoT, LM attributions (paper 000)
* :mod:`sift.companion.judges` — cue conditions, tie-aware outcome / rationale anchoring, attacks (paper 001)
* :mod:`sift.companion.system1` — ECE / Brier / E-AURC, confidence transform, interference, guard metrics (paper 003)
* :mod:`sift.companion.attribution` — KernelSHAP, S1-SHAP, interactions, gate recovery, ERASER metrics (paper 003)
* :mod:`sift.companion.edct` — explanation-driven counterfactual tests on CoT (paper 004)

Submodules are imported lazily by the caller; torch / transformers are only needed for the LM
attribution functions in ``ice``.
"""
