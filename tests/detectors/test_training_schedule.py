"""Training length in optimizer steps (issue 12): step-patience early stopping with a minimum length, the LR
warm-up + cosine decay, the per-run training record, and ``detector.seed_resample``."""

import math
from types import SimpleNamespace

import pytest
import torch

from sift.detectors.schedule import StepEarlyStopping, lr_lambda
from sift.errors import SiftError
from sift.training import train


def test_lr_warmup_then_cosine_hand_values():
    f = lr_lambda(warmup_steps=4, total_steps=14, schedule="cosine", min_ratio=0.1)
    assert [f(s) for s in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.8])   # (s+1)/(warmup+1)
    assert f(4) == pytest.approx(1.0)                                       # decay starts at the peak
    assert f(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))  # half way: 0.55
    assert f(14) == pytest.approx(0.1) and f(30) == pytest.approx(0.1)
    assert lr_lambda(0, 10, "constant", 0.1)(7) == 1.0
    with pytest.raises(SiftError, match="lr_schedule"):
        lr_lambda(0, 10, "linear", 0.1)


def _trainer(step: int, auroc: float) -> SimpleNamespace:
    return SimpleNamespace(callback_metrics={"val/auroc": torch.tensor(auroc)}, fast_dev_run=False, global_step=step,
                           current_epoch=step // 10, should_stop=False,
                           strategy=SimpleNamespace(reduce_boolean_decision=lambda d, all=False: d))


@pytest.mark.parametrize("min_steps, stop_at", [(0, 60), (100, 100)])
def test_step_early_stopping_counts_steps_not_epochs(min_steps, stop_at):
    # val/auroc improves until step 30 (0.5, 0.6, 0.7), then stays flat; a validation every 10 steps
    es = StepEarlyStopping(monitor="val/auroc", mode="max", patience_steps=25, min_steps=min_steps)
    curve = {10: 0.5, 20: 0.6, 30: 0.7}
    stopped = None
    for step in range(10, 200, 10):
        tr = _trainer(step, curve.get(step, 0.7))
        es._run_early_stopping_check(tr)
        if tr.should_stop:
            stopped = step
            break
    # 25 steps without improvement after step 30: first check at step 60; min_steps 100 delays it to 100
    assert stopped == stop_at and es.best_step == 30 and es.stopped_step == stop_at
    assert float(es.best_score) == pytest.approx(0.7)
    state = es.state_dict()
    again = StepEarlyStopping(monitor="val/auroc", patience_steps=25)
    again.load_state_dict(state)
    assert again.best_step == 30 and again.stopped_step == stop_at


def test_results_record_stop_epoch_and_best_val_loss(compose_train, tmp_path):
    rec = train(compose_train("detector=hidden_probe", out=str(tmp_path / "lr")))
    t = rec["training"]
    assert t["stopped_by"] == "fitted once (convex fit)" and t["converged"] is True
    assert t["stop_epoch"] == rec["epochs"] and len(t["validations"]) == 1
    assert t["best_val_loss"] == pytest.approx(rec["metrics"]["val/loss"], rel=1e-5)
    # an MLP capped at 2 epochs while still improving is recorded as not converged
    rec = train(compose_train("detector=instance_level", "trainer.max_epochs=2", out=str(tmp_path / "mlp")))
    t = rec["training"]
    assert t["stopped_by"] == "max_epochs" and t["converged"] is False and "still improving" in t["reason"]
    assert t["best_val_loss"] == pytest.approx(min(v["val_loss"] for v in t["validations"]))


def test_seed_resample_needs_a_datamodule_that_can(compose_train, tmp_path):
    with pytest.raises(SiftError, match="seed_resample"):
        train(compose_train("detector=hidden_probe", "detector.seed_resample=true", out=str(tmp_path / "r")))


def test_record_of_an_early_stopped_run_survives_reloading_the_best_checkpoint(compose_train, tmp_path):
    # min_delta 0.5: only the first validation counts as an improvement, so the run stops at the second one
    # (patience 1 step). The checkpoint kept as "best" is the first one (monitor=step, mode=min), so
    # validate(ckpt_path=best) restores the callbacks' state of epoch 0; the record must still say how the run
    # ended and hold every validation.
    rec = train(compose_train("detector=instance_level", "trainer.max_epochs=10",
                              "callbacks.model_checkpoint.monitor=step", "callbacks.model_checkpoint.mode=min",
                              "callbacks.early_stopping.patience_steps=1", "callbacks.early_stopping.min_steps=0",
                              "callbacks.early_stopping.min_delta=0.5", out=str(tmp_path / "es")))
    t = rec["training"]
    assert t["stopped_by"] == "early stopping" and t["converged"] is True
    assert len(t["validations"]) == 2 and t["best_step"] == t["validations"][0]["step"]
    assert t["stop_epoch"] == 2 and rec["epochs"] == 2


def test_a_step_cap_before_the_first_validation_ends_the_run_as_max_steps(compose_train, tmp_path):
    # 2 optimizer steps are less than an epoch: Lightning stops before the epoch's validation, early stopping has
    # nothing to judge (it used to raise "metric val/auroc not available"), the run is validated once after fit
    rec = train(compose_train("detector=instance_level", "trainer.max_epochs=10", "++trainer.max_steps=2",
                              out=str(tmp_path / "cap")))
    t = rec["training"]
    assert rec["global_step"] == 2 and t["validations"] == []
    assert t["stopped_by"] == "max_steps" and t["converged"] is False
    assert t["reason"] == "hit max_steps at step 2 before its first validation"
    assert 0.0 <= rec["metrics"]["val/auroc"] <= 1.0
    # a step cap reached after validations is named too (was recorded as max_epochs)
    rec = train(compose_train("detector=instance_level", "trainer.max_epochs=10", "++trainer.max_steps=12",
                              "callbacks.early_stopping.min_steps=1000", out=str(tmp_path / "cap12")))
    t = rec["training"]
    assert t["stopped_by"] == "max_steps" and t["converged"] is False and t["validations"]
    assert t["reason"].startswith("hit max_steps at step 12 while val/auroc was still improving")
