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


def test_uncapped_plug_in_bets_and_the_bound_they_give_by_hand():
    """Every bet below the cap, each worked out by hand, and U solved in closed form.

    64 items in processing order, M = 2, δ = 0.1 (L = ln 10), bets tuned at t = 0.5: item 1 has 2 selected
    traces and no error, item 2 one trace, wrong; item 3 two traces, no error; items 4..64 abstain (N = 0, so
    D = 0 and they never move the capital). D_i(r) = (r·N_i − E_i)/((1 − r)·2), so with x = r/(1 − r):
    D_1(r) = D_3(r) = x and D_2(r) = −½ for every r; at t = ½ (x = 1): D(t) = (1, −½, 1, 0, ...).

    Bets λ_i = sqrt(2L / (m·σ²_{i−1})), σ²_{i−1} = (¼ + Σ_{j<i} (D_j(t) − mean)²) / i:
      λ_1: nothing seen, σ² = ¼                                → sqrt(2L/16)        = sqrt(L/8)  = 0.536491
      λ_2: seen (1),   deviations 0, σ² = ¼/2 = 1/8            → sqrt(2L/8)         = sqrt(L/4)  = 0.758713
      λ_3: seen (1, −½), mean ¼, Σ dev² = 9/16·2 = 9/8, σ² = (¼ + 9/8)/3 = 11/24
                                                               → sqrt(2L·24/(64·11)) = sqrt(3L/44) = 0.396226
    all below the cap 0.95. The capital: K_1 = 1 + λ_1x, K_2 = K_1(1 − λ_2/2) < K_1, K_3 = K_2(1 + λ_3x), and
    K_k = K_3 after. U is the smallest r where K_1 or K_3 reaches 1/δ = 10:
      K_1 = 10 at x = 9/λ_1 = 16.776;
      K_3 = 10: λ_1λ_3·x² + (λ_1 + λ_3)·x + 1 − 10/(1 − λ_2/2) = 0 → x = 6.5185 (first): U = x/(1 + x) = 0.86700.
    """
    from sift.metrics.betting import margins, plugin_bets

    m, L = 64, math.log(10.0)
    n = np.zeros((1, m))
    e = np.zeros((1, m))
    n[0, :3], e[0, :3] = (2, 1, 2), (0, 1, 0)
    lam = np.array([math.sqrt(L / 8), math.sqrt(L / 4), math.sqrt(3 * L / 44)])
    np.testing.assert_allclose(lam, [0.536491, 0.758713, 0.396226], atol=1e-6)
    bets = plugin_bets(margins(n, e, 2.0, 0.5), 0.1)[0]
    np.testing.assert_allclose(bets[:3], lam, rtol=1e-12)
    assert bets[:3].max() < BET_CAP  # the uncapped branch
    k2 = 1 - lam[1] / 2
    x3 = max(np.roots([lam[0] * lam[2], lam[0] + lam[2], 1 - 10 / k2]).real)  # K_3 = 10
    x1 = 9 / lam[0]  # K_1 = 10
    assert x3 < x1  # the capital after item 3 reaches 1/δ first
    u_hand = x3 / (1 + x3)
    assert u_hand == pytest.approx(0.86700, abs=1e-5)
    u, ok = betting_bounds(n, e, 0.1, 2.0, 0.5)
    assert u[0] == pytest.approx(u_hand, abs=1e-9) and not ok[0]  # 0.867 > t: not certified at 0.5


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
