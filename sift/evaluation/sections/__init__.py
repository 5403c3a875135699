"""The report's sections, one module per table or analysis, and their registry
(:mod:`sift.evaluation.sections.registry`).

* :mod:`.main_table` — Table 1; :mod:`.ensemble` — Table 8; :mod:`.selective_risk` — Table 3 / Fig. 9;
  :mod:`.matched_slice` — detectors vs shortcut controls on the matched-text slice; :mod:`.ablations` —
  Table 4; :mod:`.transfer_matrix` — Table 2; :mod:`.common` — what they share.
"""
