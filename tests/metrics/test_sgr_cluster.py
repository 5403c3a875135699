"""The SGR bound over base items (docs/design.md §7, issue 27): analytic values, a loop-by-loop reference, the
certificate's input checks, and the clustered simulation of ``scripts/sgr_cluster_simulation.py`` at fewer
repetitions (the trace-level Clopper–Pearson bound fails it, the item bound holds)."""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from sift.errors import SiftError
from sift.metrics import UndefinedMetricWarning, risk_upper_bound, sgr
from sift.metrics.betting import BET_CAP, betting_bounds, item_codes, item_order

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))
from ev_toy import betting_reference  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sgr_cluster_simulation.py"


def _script():
    spec = importlib.util.spec_from_file_location("sgr_cluster_simulation", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def closed_form_no_errors(m: int, delta: float) -> float:
    """m equal items, all traces selected and correct: every bet is the cap c, so the capital after m items is
    (1 + c·r/(1 − r))^m and U solves it = 1/δ: r/(1 − r) = (δ^(−1/m) − 1)/c."""
    x = (delta ** (-1 / m) - 1) / BET_CAP
    return x / (1 + x)


@pytest.mark.parametrize("m, delta", [(20, 0.05), (8, 0.2), (50, 0.001)])
def test_bound_without_errors_matches_the_closed_form(m, delta):
    groups = np.repeat(np.arange(m), 5)
    u = risk_upper_bound(np.ones(5 * m, int), delta, groups=groups)
    assert u == pytest.approx(closed_form_no_errors(m, delta), abs=1e-9)
    assert closed_form_no_errors(20, 0.05) == pytest.approx(0.14537, abs=1e-5)  # by hand: e^{ln 20 / 20} = 1.1616


def test_bound_matches_a_loop_reference_with_errors():
    """Items (N_i, E_i) in hash order, M = 6, δ = 0.1, bets tuned at 0.3: the kernel equals a plain loop."""
    n_sel, n_err = [6, 5, 6, 4, 6, 6, 3, 6], [0, 1, 2, 0, 1, 0, 0, 3]
    codes = np.repeat(np.arange(8), n_sel)
    wrong = np.concatenate([[1] * e + [0] * (n - e) for n, e in zip(n_sel, n_err)])
    order = item_order(np.arange(8).astype(str))
    ref = betting_reference(np.array(n_sel)[order], np.array(n_err)[order], 6, 0.1, 0.3)
    got = risk_upper_bound(1 - wrong, 0.1, groups=codes, tune_at=0.3)
    assert got == pytest.approx(ref, abs=2e-5)
    assert got > sum(n_err) / sum(n_sel)  # above the point estimate 7/42


def test_certified_iff_bound_at_most_alpha_and_monotone_in_the_errors():
    n = np.array([[10, 10, 10, 10, 10, 10, 10, 10, 10, 10]] * 3, float)
    e = np.array([[0] * 10, [1] * 10, [3] * 10], float)
    u, ok = betting_bounds(n, e, 0.05, 10.0, 0.25)
    assert u[0] < u[1] < u[2] <= 1.0  # more errors, higher bound
    np.testing.assert_array_equal(ok, u <= 0.25)
    _, ok_only = betting_bounds(n, e, 0.05, 10.0, 0.25, values=False)
    np.testing.assert_array_equal(ok, ok_only)


def test_item_codes_follow_the_hash_order_not_the_input_order():
    codes, names = item_codes(np.array(["b", "a", "c", "a"]), 4)
    assert sorted(names.tolist()) == ["a", "b", "c"]
    assert names[codes].tolist() == ["b", "a", "c", "a"]
    assert names.tolist() == np.array(["a", "b", "c"])[item_order(np.array(["a", "b", "c"]))].tolist()


def test_sgr_item_bound_needs_items_and_checks_them():
    with pytest.raises(SiftError, match="base item of every trace"):
        sgr([0.9, 0.8], [1, 0], 0.2, 0.1)
    with pytest.raises(SiftError, match="one base item per trace"):
        sgr([0.9, 0.8], [1, 0], 0.2, 0.1, groups=["a"])
    with pytest.raises(SiftError, match="max_traces"):
        sgr([0.9, 0.8, 0.7], [1, 0, 1], 0.2, 0.1, groups=["a", "a", "b"], max_traces=1)
    with pytest.raises(SiftError, match="bound must be one of"):
        sgr([0.9], [1], 0.2, 0.1, bound="hoeffding")


def test_sgr_reports_items_and_is_invariant_to_item_names_order():
    rng = np.random.default_rng(3)
    items = np.repeat(np.arange(80), 12)
    rho = rng.uniform(0.5, 1, items.size)
    ok = (rng.random(items.size) >= 0.4 * (1 - rho)).astype(int)
    r = sgr(rho, ok, 0.25, 0.05, groups=items)
    assert r.feasible and r.n_items == 80 and r.bound == "betting" and r.bound_value <= 0.25
    shuffled = rng.permutation(items.size)
    r2 = sgr(rho[shuffled], ok[shuffled], 0.25, 0.05, groups=items[shuffled])
    assert (r2.threshold, r2.bound_value) == (r.threshold, pytest.approx(r.bound_value))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        few = sgr(rho[:180], ok[:180], 0.25, 0.05, groups=items[:180])  # 15 items cannot certify α = 0.25
    assert not few.feasible and "15 base items" in few.reason


def test_clustered_simulation_old_bound_fails_new_holds():
    """Issue 27's setting at 300 repetitions: 15 items, per-item SD 0.25 (ICC 0.33), ~15 traces each."""
    sim = _script()
    rng = np.random.default_rng(27)
    r = sim.bound_violations(rng, 15, 0.25, 300)
    se = math.sqrt(0.05 * 0.95 / 300)
    assert r.old > 0.15                      # ≈ 0.25 in the 2,000-repetition run: far above δ = 0.05
    assert r.new <= 0.05 + 2 * se
    r = sim.bound_violations(rng, 50, 0.10, 300)  # weaker clustering: the old bound still fails
    assert r.old > 0.05 + 2 * se and r.new <= 0.05 + 2 * se


def test_simulation_beta_parameters_and_bad_input():
    sim = _script()
    a, b = sim.beta_params(0.25, 0.25)
    assert (a, b) == pytest.approx((0.5, 1.5))  # a + b + 1 = μ(1 − μ)/SD² = 3
    assert a / (a + b) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="no Beta"):
        sim.beta_params(0.25, 0.5)
