"""What a finished main job certifies, under the old trace-level SGR bound and under the bound over base items.

    python scripts/certificate_before_after.py OUT [--alpha 0.25] [--delta 0.05] [--json FILE]

``OUT`` is a ``sift-faithshift`` output folder (it holds ``runs/main/<detector>/seed<k>/predictions/``). For every
detector and control of the main table, every seed, and the per-seed instance ensemble (built as the report
builds it), SGR is calibrated on the ``calib`` split twice:

* **old**: the trace-level one-sided Clopper–Pearson bound with δ split over the paper's 51 candidates;
* **new**: the report's certificate, ``SelectiveConfig(alpha, delta).run`` (the bound over base items, sift's
  default candidate grid),

and the threshold is applied to the ``test`` split: coverage and selective risk (per trace). A certified row whose
test risk exceeds α is explained: the 95 % lower bound on its test risk over the test items (the same item bound,
turned around) either stays ≤ α (the excess is test-sample noise) or exceeds it (the certificate's δ event, which
has probability ≤ δ for each certificate).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

import sift
from sift.errors import SiftError
from sift.evaluation.faithshift_report import instance_ensembles
from sift.evaluation.predictions import Predictions
from sift.metrics import UndefinedMetricWarning, risk_upper_bound, sgr
from sift.metrics.selective import SelectiveConfig

OLD_GRID = np.linspace(0.5, 1.0, 51)  # the paper's candidate grid, the old default
SPLITS = ("val", "calib", "test")


@dataclass
class Operating:
    """One certificate of one run: the calibration outcome and what its threshold does on the test split."""

    certified: bool
    threshold: float | None
    calib_coverage: float
    bound: float | None
    test_coverage: float
    test_risk: float | None
    test_lower: float | None  # 95 % lower bound on the test risk over test items (certified rows above α only)
    note: str


def find_main_runs(out: Path) -> Path:
    """``OUT/runs/main`` (or ``OUT`` itself when it is that folder); SiftError when neither holds runs."""
    for cand in (out / "runs" / "main", out):
        if cand.is_dir() and any(cand.glob("*/seed*/predictions/calib.npz")):
            return cand
    raise SiftError(f"{out}: no runs/main/<detector>/seed*/predictions/calib.npz (a finished sift-faithshift "
                    f"output folder with a calibration split is needed)")


def load_runs(main: Path) -> list[Predictions]:
    """Every main run's val / calib / test predictions."""
    preds = []
    for path in sorted(main.glob("*/seed*/predictions/*.npz")):
        if path.stem in SPLITS:
            preds.append(Predictions.load(path))
    return preds


def default_members() -> list[str]:
    """The instance ensemble's members in the shipped ``faithshift.yaml``."""
    cfg = OmegaConf.load(Path(sift.__file__).parent / "configs" / "faithshift.yaml")
    return [str(m) for m in cfg.get("instance_ensemble") or []]


def test_lower_bound(test: Predictions, keep: np.ndarray, delta: float, alpha: float) -> float:
    """(1 − δ) lower bound on the per-trace risk of the selected test traces, over base items: one minus the item
    bound on their share of correct verdicts."""
    correct = test.correct[keep]
    return 1.0 - risk_upper_bound(1 - correct, delta, groups=test.base_item[keep], tune_at=1.0 - alpha)


def apply(result, test: Predictions, alpha: float, valid: bool = True) -> Operating:
    """The test coverage and risk at a calibration result's threshold, and the note of a certified row above α
    (``valid``: whether the bound is valid for clustered traces, i.e. whether an excess is a δ event)."""
    if not result.feasible:
        return Operating(False, None, 0.0, None, 0.0, None, None, "nothing certified")
    keep = test.confidence >= result.threshold
    n = int(keep.sum())
    risk = float(np.mean(test.correct[keep] == 0)) if n else None
    lower, note = None, ""
    if risk is not None and risk > alpha:
        lower = test_lower_bound(test, keep, 0.05, alpha)
        items = len(set(test.base_item[keep].tolist()))
        note = (f"test risk above alpha, but its 95% item-level lower bound {lower:.3f} <= alpha: consistent with a "
                f"true risk <= alpha ({items} test items)" if lower <= alpha else
                f"the certificate's delta event: 95% item-level lower bound {lower:.3f} > alpha "
                f"(probability <= delta per certificate)" if valid else
                f"a failure of the trace-level bound: 95% item-level lower bound {lower:.3f} > alpha (the bound "
                f"treats the traces of one item as independent, so its delta does not hold)")
    return Operating(True, float(result.threshold), float(result.coverage), float(result.bound_value),
                     float(keep.mean()) if keep.size else 0.0, risk, lower, note)


def compare(calib: Predictions, test: Predictions, alpha: float, delta: float) -> dict[str, Operating]:
    """Old (trace Clopper–Pearson, 51 candidates) and new (the report's certificate) on one run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        old = sgr(calib.confidence, calib.correct, alpha, delta, OLD_GRID, "clopper-pearson")
    new = SelectiveConfig(alpha, delta).run(calib.confidence, calib.correct, calib.base_item)
    return {"old": apply(old, test, alpha, valid=False), "new": apply(new, test, alpha)}


def _cell(o: Operating) -> str:
    if not o.certified:
        return f"{'no':<5}{'':>32}"
    risk = "—" if o.test_risk is None else f"{o.test_risk:.3f}"
    return f"{'yes':<5}{o.threshold:>6.2f}{o.calib_coverage:>7.3f}{o.bound:>7.3f}{o.test_coverage:>6.3f}{risk:>6}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="a sift-faithshift output folder")
    ap.add_argument("--alpha", type=float, default=0.25)
    ap.add_argument("--delta", type=float, default=0.05)
    ap.add_argument("--members", nargs="*", default=None,
                    help="instance-ensemble members (default: faithshift.yaml's instance_ensemble)")
    ap.add_argument("--json", type=Path, default=None, help="also write every row to this JSON file")
    args = ap.parse_args(argv)
    preds = load_runs(find_main_runs(args.out))
    preds += instance_ensembles(preds, default_members() if args.members is None else list(args.members))
    by = {(p.detector, p.seed, p.split): p for p in preds}
    runs = sorted({(d, s) for d, s, sp in by if sp == "calib" and (d, s, "test") in by}, key=str)
    if not runs:
        raise SiftError(f"{args.out}: no run has both calib and test predictions")
    print(f"alpha = {args.alpha}, delta = {args.delta}. old: trace-level Clopper-Pearson, delta split over 51 "
          f"candidates; new: the report's certificate ({SelectiveConfig().bound} bound over base items, default grid)")
    print("per certificate: certified, t*, calibration coverage, bound, test coverage, test selective risk\n")
    head = f"{'':<5}{'t*':>6}{'cov':>7}{'bound':>7}{'tcov':>6}{'risk':>6}"
    print(f"{'detector':<22}{'seed':>5}{'calib items/traces':>20}  {'OLD ' + head[4:]}  {'NEW ' + head[4:]}")
    rows, notes = [], []
    for det, seed in runs:
        cal, test = by[(det, seed, "calib")], by[(det, seed, "test")]
        res = compare(cal, test, args.alpha, args.delta)
        n_items = len(set(cal.base_item.tolist()))
        print(f"{det:<22}{seed!s:>5}{f'{n_items}/{len(cal)}':>20}  {_cell(res['old'])}  {_cell(res['new'])}")
        for which, o in res.items():
            if o.note and o.certified:
                notes.append(f"{det} seed {seed} ({which}): {o.note}")
        rows.append({"detector": det, "seed": seed, "calib_items": n_items, "calib_traces": len(cal),
                     "test_items": len(set(test.base_item.tolist())), "test_traces": len(test),
                     **{k: asdict(v) for k, v in res.items()}})
    print("\nsummary: certified seeds, mean test selective risk of the certified ones")
    for det in sorted({r["detector"] for r in rows}):
        mine = [r for r in rows if r["detector"] == det]
        parts = []
        for which in ("old", "new"):
            cert = [r[which] for r in mine if r[which]["certified"]]
            risks = [c["test_risk"] for c in cert if c["test_risk"] is not None]
            mean = f"{np.mean(risks):.3f}" if risks else "—"
            over = sum(1 for x in risks if x > args.alpha)
            parts.append(f"{which} {len(cert)}/{len(mine)} (test risk {mean}{f', {over} above alpha' if over else ''})")
        print(f"  {det:<22}" + "; ".join(parts))
    if notes:
        print("\ncertified rows with test risk above alpha:")
        print("\n".join(f"  - {n}" for n in notes))
    if args.json is not None:
        args.json.write_text(json.dumps({"alpha": args.alpha, "delta": args.delta, "rows": rows}, indent=1,
                                        default=lambda x: None if isinstance(x, float) and math.isnan(x) else x))
    return 0


if __name__ == "__main__":
    sys.exit(main())
