"""IVR, AS, MFS, seed-repeat decomposition, AUROC: hand-computed cases."""

import math

import numpy as np
import pytest

from sift.errors import SiftError
from sift.metrics import (
    UndefinedMetricWarning,
    alteration_sensitivity,
    auroc,
    invariance_violation_rate,
    ivr_per_axis,
    meta_faithfulness_score,
    seed_repeat_decomposition,
    transfer_auroc,
)


def test_ivr_hand_case_and_mask():
    a, b = [1, 0, 1, 1, 0], [1, 1, 1, 0, 0]
    assert invariance_violation_rate(a, b) == pytest.approx(2 / 5)
    assert invariance_violation_rate(a, b, mask=[1, 1, 1, 0, 1]) == pytest.approx(1 / 4)


def test_ivr_empty_is_nan_with_warning():
    with pytest.warns(UndefinedMetricWarning, match="no"):
        assert math.isnan(invariance_violation_rate([], []))
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(invariance_violation_rate([1, 0], [0, 0], mask=[0, 0]))


def test_ivr_length_mismatch_names_arguments():
    with pytest.raises(SiftError, match=r"verdicts_a has shape \(3,\).*verdicts_b has shape \(2,\)"):
        invariance_violation_rate([1, 0, 1], [1, 0])


def test_ivr_rejects_non_binary():
    with pytest.raises(SiftError, match="verdicts_b"):
        invariance_violation_rate([1, 0], [1, np.nan])


def test_ivr_per_axis_macro_mean():
    a, b = [1, 0, 1, 1, 0], [1, 1, 1, 0, 0]
    axes = ["para", "para", "trans", "trans", "trans"]
    out = ivr_per_axis(a, b, axes)
    assert out["para"] == pytest.approx(1 / 2)
    assert out["trans"] == pytest.approx(1 / 3)
    assert out["mean"] == pytest.approx((1 / 2 + 1 / 3) / 2)  # macro, not the pooled 2/5


def test_alteration_sensitivity_hand_case():
    # pairs: 0→1 moves up ✓; 1→0 moves down ✓; 0→1 stays ✗; 1→0 ✓; 1→0 but verdict goes up ✗;
    # 0→1 with verdict already at 1 ✗
    vb = [0, 1, 0, 1, 0, 1]
    va = [1, 0, 0, 0, 1, 1]
    lb = [0, 1, 0, 1, 1, 0]
    la = [1, 0, 1, 0, 0, 1]
    assert alteration_sensitivity(vb, va, lb, la) == pytest.approx(3 / 6)
    assert alteration_sensitivity(vb, va, lb, la, mask=[1, 1, 0, 1, 1, 0]) == pytest.approx(3 / 4)


def test_alteration_sensitivity_excludes_non_altering_pairs():
    with pytest.warns(UndefinedMetricWarning, match="excluded"):
        value = alteration_sensitivity([0, 0], [1, 1], [0, 1], [1, 1])
    assert value == pytest.approx(1.0)
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(alteration_sensitivity([0], [1], [1], [1]))


def test_mfs_known_values():
    assert meta_faithfulness_score(0.2, 0.6, 0.5) == pytest.approx(0.5 * 2 * 0.8 * 0.6 / 1.4)
    assert meta_faithfulness_score(0.0, 1.0) == pytest.approx(1.0)
    assert meta_faithfulness_score(0.5, 0.5, 1.0) == pytest.approx(0.5)
    assert meta_faithfulness_score(1.0, 0.0, 0.7) == 0.0  # documented 0/0 limit
    assert math.isnan(meta_faithfulness_score(float("nan"), 0.5, 1.0))
    assert math.isnan(meta_faithfulness_score(0.1, 0.5, float("nan")))
    with pytest.raises(SiftError, match="ivr"):
        meta_faithfulness_score(1.2, 0.5)


def test_seed_repeat_hand_table():
    s1 = [1, 1, 1, 1, 0, 0, 0, 0]
    s2 = [1, 0, 1, 0, 0, 0, 0, 0]  # S at traces 1, 3
    sh = [1, 0, 0, 1, 0, 0, 1, 0]  # T at traces 1, 2, 6
    d = seed_repeat_decomposition(s1, s2, sh)
    parts = (d.floor, d.shift_attributable, d.overlap, d.raw)
    assert parts == pytest.approx((2 / 8, 3 / 8, 1 / 8, 4 / 8))
    assert d.raw == pytest.approx(d.floor + d.shift_attributable - d.overlap)  # eq. 48
    assert d.stochastic_fraction == pytest.approx(0.5)
    assert math.isnan(d.overlap_low)
    with_ci = seed_repeat_decomposition(s1, s2, sh, groups=[0, 0, 1, 1, 2, 2, 3, 3], n_resamples=200)
    assert with_ci.overlap_low <= with_ci.overlap <= with_ci.overlap_high


def test_seed_repeat_empty_and_mismatch():
    with pytest.warns(UndefinedMetricWarning):
        d = seed_repeat_decomposition([], [], [])
    assert math.isnan(d.raw) and d.reason
    with pytest.raises(SiftError, match="seed1_shifted"):
        seed_repeat_decomposition([1, 0], [1, 0], [1])


def test_auroc_hand_cases():
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auroc([0.5, 0.5], [0, 1]) == pytest.approx(0.5)  # ties count 1/2
    with pytest.warns(UndefinedMetricWarning, match="single class"):
        assert math.isnan(auroc([0.1, 0.2], [1, 1]))
    with pytest.raises(SiftError, match="labels"):
        auroc([0.1, 0.2], [1, 1, 0])


def test_transfer_auroc_gap():
    r = transfer_auroc([0.1, 0.9, 0.2, 0.8], [0, 1, 0, 1], [0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    assert (r.in_dist, r.transfer, r.gap) == pytest.approx((1.0, 0.75, 0.25))
    with pytest.warns(UndefinedMetricWarning):
        r = transfer_auroc([0.1, 0.9], [0, 1], [0.1, 0.4], [0, 0])
    assert math.isnan(r.gap)
