"""Does the selective-risk bound hold when traces come in families? A simulation of clustered errors (issue 27).

    python scripts/sgr_cluster_simulation.py [--reps 2000] [--items 15 50] [--sd 0.10 0.25] [--seed 0]

Each repetition draws ``items`` base items; item i gets an error rate p_i ~ Beta(mean 0.25, SD ``sd``) and
12–18 traces (15 on average, as in the default corpus: 223 calibration traces from 15 items), each wrong with
probability p_i. The intra-item correlation is ICC = SD² / (mean·(1 − mean)): 0.05 at SD 0.10, 0.33 at SD 0.25
(the default corpus measured a per-item SD of 0.251 for the ``surface`` control). The true per-trace risk is
R = E[n_i·p_i] / E[n_i] = 0.25.

* **Bound** (the issue's measurement): a one-sided (1 − δ) upper bound U on R from all traces; a violation is
  U < R. Old: the trace-level Clopper–Pearson bound. New: sift's bound over base items
  (``sift.metrics.risk_upper_bound``, the kernel SGR certifies with). Nominal rate ≤ δ; the script prints the
  Monte-Carlo standard error and flags the new bound if its rate exceeds δ + 2 SE.
* **Certificate** (``--certificate``): SGR over a gate ρ ~ U(0.5, 1) with P(error | ρ, i) = min(1, 4·p_i·(1 − ρ)),
  so the selective risk R(t) falls with the threshold t (true R(t) from 200,000 simulated items); a violation is
  a certified t* with R(t*) > α. Old: Clopper–Pearson over the paper's 51 candidates; new: sift's default.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sift.metrics import UndefinedMetricWarning, risk_upper_bound, sgr
from sift.metrics.binomial import clopper_pearson_upper

MEAN = 0.25
DELTA = 0.05
TRACES = (12, 18)  # traces per item, uniform (mean 15)
OLD_GRID = np.linspace(0.5, 1.0, 51)  # the paper's candidate grid (the old default)


def beta_params(mean: float, sd: float) -> tuple[float, float]:
    """Beta(a, b) with the given mean and standard deviation; ValueError when no Beta has them."""
    if not 0 < mean < 1 or not 0 < sd < math.sqrt(mean * (1 - mean)):
        raise ValueError(f"no Beta distribution has mean {mean} and SD {sd} (need SD < sqrt(mean(1 - mean)))")
    s = mean * (1 - mean) / sd ** 2 - 1
    return mean * s, (1 - mean) * s


def draw_items(rng: np.random.Generator, n_items: int, sd: float, mean: float = MEAN
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per trace: its item id and its item's error rate p_i ~ Beta(mean, sd)."""
    a, b = beta_params(mean, sd)
    p = rng.beta(a, b, n_items)
    n = rng.integers(TRACES[0], TRACES[1] + 1, n_items)
    item = np.repeat(np.arange(n_items), n)
    return item, p[item]


@dataclass(frozen=True)
class Rates:
    """Violation rates of the old and the new rule over ``reps`` repetitions (and how often each certified)."""

    old: float
    new: float
    reps: int
    old_feasible: float = math.nan
    new_feasible: float = math.nan

    @property
    def se(self) -> float:
        """Monte-Carlo standard error of a rate at δ (the nominal level)."""
        return math.sqrt(DELTA * (1 - DELTA) / self.reps)


def bound_violations(rng: np.random.Generator, n_items: int, sd: float, reps: int, delta: float = DELTA,
                     mean: float = MEAN) -> Rates:
    """Share of repetitions whose (1 − δ) upper bound falls below the true per-trace risk ``mean``."""
    old = new = 0
    for _ in range(reps):
        item, p = draw_items(rng, n_items, sd, mean)
        wrong = rng.random(item.size) < p
        old += float(clopper_pearson_upper(wrong.sum(), wrong.size, delta)) < mean
        new += risk_upper_bound(1 - wrong.astype(int), delta, groups=item, tune_at=mean) < mean
    return Rates(old / reps, new / reps, reps)


def _gated(rng: np.random.Generator, n_items: int, sd: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    item, p = draw_items(rng, n_items, sd)
    rho = rng.uniform(0.5, 1.0, item.size)
    p_err = np.minimum(1.0, 4.0 * p * (1.0 - rho))
    return item, rho, p_err


def certificate_violations(rng: np.random.Generator, n_items: int, sd: float, reps: int, alpha: float,
                           delta: float = DELTA) -> Rates:
    """Share of repetitions whose SGR certificate picks a threshold with true selective risk above α."""
    _, rho_pop, p_pop = _gated(rng, 200_000, sd)
    order = np.argsort(rho_pop)
    rho_sorted, tail = rho_pop[order], np.cumsum(p_pop[order][::-1])[::-1]

    def true_risk(t: float) -> float:
        i = int(np.searchsorted(rho_sorted, t, side="left"))
        return float(tail[i] / (rho_sorted.size - i)) if i < rho_sorted.size else 0.0

    old = new = old_ok = new_ok = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for _ in range(reps):
            item, rho, p_err = _gated(rng, n_items, sd)
            correct = (rng.random(item.size) >= p_err).astype(int)
            r_old = sgr(rho, correct, alpha, delta, OLD_GRID, "clopper-pearson")
            r_new = sgr(rho, correct, alpha, delta, groups=item)
            old_ok += r_old.feasible
            new_ok += r_new.feasible
            old += r_old.feasible and true_risk(r_old.threshold) > alpha
            new += r_new.feasible and true_risk(r_new.threshold) > alpha
    return Rates(old / reps, new / reps, reps, old_ok / reps, new_ok / reps)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--items", type=int, nargs="+", default=[15, 50])
    ap.add_argument("--sd", type=float, nargs="+", default=[0.10, 0.25])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--certificate", action="store_true", help="also simulate the SGR certificate")
    ap.add_argument("--alpha", type=float, default=0.20, help="target risk of the certificate simulation")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    rng = np.random.default_rng(args.seed)
    print(f"Bound violations, delta = {DELTA}, {args.reps} repetitions, true per-trace risk {MEAN}; "
          f"~15 traces per item")
    print(f"{'items':>5} {'item SD':>7} {'ICC':>5} {'old (trace CP)':>14} {'new (items)':>11} {'2 SE':>6}  verdict")
    ok = True
    for n_items in args.items:
        for sd in args.sd:
            r = bound_violations(rng, n_items, sd, args.reps)
            icc = sd ** 2 / (MEAN * (1 - MEAN))
            holds = r.new <= DELTA + 2 * r.se
            ok &= holds
            print(f"{n_items:>5} {sd:>7.2f} {icc:>5.2f} {r.old:>14.3f} {r.new:>11.3f} {2 * r.se:>6.3f}  "
                  f"{'new holds' if holds else 'NEW VIOLATES'}{', old violates' if r.old > DELTA + 2 * r.se else ''}")
    if args.certificate:
        print(f"\nCertificate violations (SGR, alpha = {args.alpha}, delta = {DELTA}; informative gate): "
              "violation rate (share certified)")
        print(f"{'items':>5} {'item SD':>7} {'old: CP, 51 cand.':>20} {'new: items, default':>20}")
        for n_items in args.items:
            for sd in args.sd:
                r = certificate_violations(rng, n_items, sd, args.reps, args.alpha)
                print(f"{n_items:>5} {sd:>7.2f} {f'{r.old:.3f} ({r.old_feasible:.2f})':>20} "
                      f"{f'{r.new:.3f} ({r.new_feasible:.2f})':>20}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
