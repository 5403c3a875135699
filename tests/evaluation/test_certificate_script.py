"""``scripts/certificate_before_after.py`` on a hand-made job folder: it finds the runs, certifies each with the old
and the new bound and reads the test split at the certified threshold (issue 27)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from sift.errors import SiftError
from sift.evaluation.predictions import Predictions

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "certificate_before_after.py"


def _script():
    spec = importlib.util.spec_from_file_location("certificate_before_after", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _split(det: str, split: str, n_items: int, wrong_rate: float, rng: np.random.Generator) -> Predictions:
    """15 traces per item; a trace is wrong (verdict ≠ label) with its item's rate; ρ high for right verdicts."""
    item = np.repeat([f"{split}{i}" for i in range(n_items)], 15)
    rate = rng.beta(1, (1 - wrong_rate) / wrong_rate, n_items).repeat(15)
    label = rng.integers(0, 2, item.size)
    wrong = rng.random(item.size) < rate
    prob = np.where(label == 1, 0.9, 0.1)
    prob = np.where(wrong, 1 - prob, prob)
    prob = np.clip(prob + rng.normal(0, 0.03, item.size), 0, 1)
    ids = np.array([f"{split}/{k}" for k in range(item.size)])
    one = np.array(["x"] * item.size)
    return Predictions(det, 0, split, 0.5, ids, item, one, one, one, label, prob)


def test_before_after_on_a_made_up_job(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for det, rate in (("good", 0.05), ("bad", 0.4)):
        pdir = tmp_path / "runs" / "main" / det / "seed0" / "predictions"
        pdir.mkdir(parents=True)
        for split, n in (("val", 10), ("calib", 60), ("test", 40)):
            _split(det, split, n, rate, rng).save(pdir / f"{split}.npz")
    mod = _script()
    assert mod.main([str(tmp_path), "--members", "--json", str(tmp_path / "out.json")]) == 0
    text = capsys.readouterr().out
    rows = {r["detector"]: r for r in json.loads((tmp_path / "out.json").read_text())["rows"]}
    assert set(rows) == {"good", "bad"} and rows["good"]["calib_items"] == 60 and rows["good"]["calib_traces"] == 900
    good, bad = rows["good"], rows["bad"]
    assert good["new"]["certified"] and good["old"]["certified"]  # 60 items of a 5 % detector: both certify
    assert good["new"]["bound"] <= 0.25 and good["new"]["test_risk"] < 0.25
    assert not bad["new"]["certified"] and bad["new"]["note"] == "nothing certified"
    assert "summary" in text and "good" in text and "old 1/1" in text


def test_lower_bound_note_and_missing_folder(tmp_path):
    mod = _script()
    rng = np.random.default_rng(1)
    test = _split("x", "test", 40, 0.4, rng)
    keep = np.ones(len(test), bool)
    low = mod.test_lower_bound(test, keep, 0.05, 0.25)
    assert 0.25 < low < np.mean(test.correct == 0)  # a 40 % detector: the lower bound clears α, below the estimate
    with pytest.raises(SiftError, match="calib.npz"):
        mod.find_main_runs(tmp_path)
