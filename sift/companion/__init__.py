"""Metric layer of the four companion papers (docs/design.md §9).

* :mod:`sift.companion.ice` — ICE win rates vs random baselines, operators, step-level CoT, LM attributions (paper 000)
* :mod:`sift.companion.judges` — cue conditions, tie-aware outcome / rationale anchoring, attacks (paper 001)
* :mod:`sift.companion.system1` — ECE / Brier / E-AURC, confidence transform, interference, guard metrics (paper 003)
* :mod:`sift.companion.attribution` — KernelSHAP, S1-SHAP, interactions, gate recovery, ERASER metrics (paper 003)
* :mod:`sift.companion.edct` — explanation-driven counterfactual tests on CoT (paper 004)

Runs and wiring:

* :mod:`sift.companion.organism` — ICE (token + step level), EDCT and the System-1 audit on organism traces
* :mod:`sift.companion.judge_run` — cue-anchored judging with any Hugging Face causal LM as the judge
* :mod:`sift.companion.detector_shap` — ``explain_detector_groups``: S1-SHAP over a detector's descriptor groups
* :mod:`sift.companion.report` — ``companion_sections(cfg, out_dir)``: run the enabled families, report sections
  (used by ``sift-companion`` and ``sift-evaluate``; options in ``configs/companion/``)

Submodules are imported lazily by the caller; torch / transformers are only needed for the LM
attribution functions in ``ice``.
"""
