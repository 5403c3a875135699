"""A detector fitted in one pass (the convex baselines) killed after its fitting epoch's ``last.ckpt`` resumes to
the uninterrupted run's record: the crash matrix's "mid training" point when the kill lands in hidden_probe's
shutdown, pinned deterministically."""

from __future__ import annotations

import pytest

from sift.detectors.baselines import LogisticDetector
from sift.training import train


class Killed(Exception):
    """Stands in for SIGKILL: the run ends without writing anything more."""


def test_a_fitted_once_run_killed_after_its_epoch_resumes_to_the_same_record(compose_train, tmp_path, monkeypatch):
    """Without the stop at a resumed start, the resumed hidden_probe ran one more epoch (stop_epoch 2 vs 1)."""
    detector = "hidden_probe"
    clean = train(compose_train(f"detector={detector}", out=str(tmp_path / "clean")))
    assert clean["training"]["stop_epoch"] == 1 and clean["training"]["stopped_by"] == "fitted once (convex fit)"

    cls = LogisticDetector
    out = tmp_path / "killed"

    def die(self):
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(cls, "on_train_end", die, raising=False)  # after epoch 0's last.ckpt, before the record
        with pytest.raises(Killed):
            train(compose_train(f"detector={detector}", out=str(out)))
    assert (out / "checkpoints" / "last.ckpt").is_file() and not (out / "results.json").exists()
    resumed = train(compose_train(f"detector={detector}", out=str(out)))
    keep = ("stop_epoch", "global_step", "best_val_loss", "stopped_by", "converged")
    assert {k: resumed["training"][k] for k in keep} == {k: clean["training"][k] for k in keep}
    assert resumed["metrics"] == clean["metrics"] and resumed["threshold"] == clean["threshold"]
