"""Training length in optimizer steps: early stopping with step patience and a minimum length, the learning-rate
warm-up / decay, and the per-run training record (stop epoch, best validation loss, converged or not).

Lightning counts ``EarlyStopping.patience`` in validation checks (epochs here). An epoch of the environment-
balanced loader is ⌈N_train / (n_env · batch)⌉ steps: about 7 at 200 base items and 26 at 750, so "patience 5
epochs" (the paper's) means 35 optimizer steps at one preset and 130 at another. Counting in steps makes the
rule, and whether a detector trained to convergence, the same at every data size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, EarlyStopping

from sift.errors import SiftError

LR_SCHEDULES = ("constant", "cosine")


class StepEarlyStopping(EarlyStopping):
    """Stop when ``monitor`` has not improved (by more than ``min_delta``) for ``patience_steps`` optimizer steps,
    never before ``min_steps``. Checked after every validation, like Lightning's ``EarlyStopping``; a non-finite
    metric never counts as an improvement."""

    def __init__(self, monitor: str, mode: str = "max", patience_steps: int = 60, min_steps: int = 0,
                 min_delta: float = 0.0, verbose: bool = False, check_on_train_epoch_end: bool | None = None) -> None:
        if patience_steps < 1 or min_steps < 0:
            raise SiftError(f"early stopping needs patience_steps >= 1 and min_steps >= 0, got {patience_steps}, "
                            f"{min_steps}")
        super().__init__(monitor=monitor, mode=mode, min_delta=min_delta, patience=1, verbose=verbose,
                         check_finite=False, check_on_train_epoch_end=check_on_train_epoch_end)
        self.patience_steps, self.min_steps = int(patience_steps), int(min_steps)
        self.best_step = 0
        self.stopped_step: int | None = None
        self._validated = False  # a validation ran in this fit (not only in the run a checkpoint came from)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validated = False

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated = True
        super().on_validation_end(trainer, pl_module)

    def _run_early_stopping_check(self, trainer: pl.Trainer) -> None:
        logs = trainer.callback_metrics
        if self.monitor not in logs and not self._validated and trainer.ckpt_path is not None:
            # resumed from a checkpoint written at an epoch's end, after that epoch's check (its outcome is in the
            # restored state): Lightning replays the epoch-end hooks with no metrics logged in this process
            return
        if self.monitor not in logs and not self._validated and budget_hit(trainer) == "max_steps":
            # the step cap ended the first epoch before its validation: nothing to judge yet (the run is recorded
            # as stopped by max_steps, not converged, and validated once after fit)
            return
        if trainer.fast_dev_run or not self._validate_condition_metric(logs):
            return
        current = logs[self.monitor].squeeze()
        step = int(trainer.global_step)
        if torch.isfinite(current) and self.monitor_op(current - self.min_delta, self.best_score.to(current.device)):
            self.best_score, self.best_step = current.detach().clone(), step
        should_stop = step >= self.min_steps and step - self.best_step >= self.patience_steps
        should_stop = trainer.strategy.reduce_boolean_decision(should_stop, all=False)
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop and self.stopped_step is None:
            self.stopped_epoch, self.stopped_step = trainer.current_epoch, step
            self.stopping_reason_message = (f"{self.monitor} did not improve for {step - self.best_step} steps "
                                            f"(best {float(self.best_score):.4f} at step {self.best_step})")

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_step": self.best_step, "stopped_step": self.stopped_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.best_step = int(state_dict.get("best_step", 0))
        self.stopped_step = state_dict.get("stopped_step")


class ValidationHistory(Callback):
    """Records ``(epoch, step, val/loss, val/auroc)`` after every validation during ``fit`` (sanity checks
    excluded), for the run's training record."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float | int | None]] = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        m = trainer.callback_metrics

        def val(k: str) -> float | None:
            v = m.get(k)
            f = float(v) if v is not None else math.nan
            return f if math.isfinite(f) else None

        self.rows.append({"epoch": int(trainer.current_epoch), "step": int(trainer.global_step),
                          "val_loss": val("val/loss"), "val_auroc": val("val/auroc")})

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = list(state_dict.get("rows", []))


def lr_lambda(warmup_steps: int, total_steps: int, schedule: str, min_ratio: float):
    """Multiplier of the base learning rate at optimizer step s: linear warm-up from 1/(warmup+1) to 1 over
    ``warmup_steps``, then constant or a cosine decay to ``min_ratio`` at ``total_steps``."""
    if schedule not in LR_SCHEDULES:
        raise SiftError(f"lr_schedule (detector.scheduler.kind) must be one of {LR_SCHEDULES}, got {schedule!r}")
    if not 0.0 <= min_ratio <= 1.0:
        raise SiftError(f"lr_min_ratio (detector.scheduler.min_ratio) must lie in [0, 1], got {min_ratio}")

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if schedule == "constant":
            return 1.0
        span = max(1, total_steps - warmup_steps)
        p = min(1.0, (step - warmup_steps) / span)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))

    return f


@dataclass(frozen=True)
class LRSchedule:
    """``detector.scheduler``: linear warm-up over ``warmup_steps``, then ``kind`` (constant, or a cosine decay
    to ``min_ratio``·lr at the run's last step)."""

    warmup_steps: int = 0
    kind: str = "constant"
    min_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise SiftError(f"detector.scheduler.warmup_steps must be >= 0, got {self.warmup_steps}")
        lr_lambda(self.warmup_steps, 1, self.kind, self.min_ratio)  # validates kind and min_ratio

    @classmethod
    def build_from(cls, given: dict[str, Any] | None) -> LRSchedule:
        """From a ``detector.scheduler`` mapping; an unknown key fails naming it."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(cls.__dataclass_fields__))
        if unknown:
            raise SiftError(f"detector.scheduler: unknown key(s) {unknown} (known: {sorted(cls.__dataclass_fields__)})")
        return cls(**given)

    @property
    def constant(self) -> bool:
        """True when the learning rate never changes (no scheduler is built)."""
        return self.warmup_steps == 0 and self.kind == "constant"

    def build(self, optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(self.warmup_steps, total_steps, self.kind,
                                                                      self.min_ratio))


def training_record(trainer: pl.Trainer, model: Any, history: ValidationHistory | None) -> dict[str, Any]:
    """Stop epoch, steps, best validation loss and whether the run converged.

    Converged = early stopping ended it (no improvement of the monitor for ``patience_steps`` after
    ``min_steps``) or the detector is fitted in one pass (``fits_once``: the convex baselines). A run that hit
    ``max_epochs`` while still improving is *not* converged: its reported numbers are those of an undertrained
    detector, and the report marks it.
    """
    es = next((c for c in trainer.callbacks if isinstance(c, StepEarlyStopping)), None)
    rows = history.rows if history is not None else []
    losses = [r["val_loss"] for r in rows if r["val_loss"] is not None]
    rec: dict[str, Any] = {"stop_epoch": int(trainer.current_epoch), "global_step": int(trainer.global_step),
                           "best_val_loss": min(losses) if losses else None, "validations": rows}
    if getattr(model, "fits_once", False):
        rec.update(stopped_by="fitted once (convex fit)", converged=True)
    elif es is not None and es.stopped_step is not None:
        rec.update(stopped_by="early stopping", converged=True, best_step=es.best_step,
                   patience_steps=es.patience_steps, min_steps=es.min_steps)
    elif es is None:  # callbacks without StepEarlyStopping: nothing to judge convergence by
        rec.update(stopped_by=budget_hit(trainer), converged=None, reason="no StepEarlyStopping callback: not checked")
    else:
        cap = budget_hit(trainer)
        why = (f"while {es.monitor} was still improving (last gain > min_delta at step {es.best_step}, patience "
               f"{es.patience_steps} steps)" if rows else "before its first validation")
        rec.update(stopped_by=cap, converged=False, best_step=es.best_step if rows else None,
                   reason=f"hit {cap} at step {trainer.global_step} {why}")
    return rec


def budget_hit(trainer: pl.Trainer) -> str:
    """Which budget ended a run that early stopping did not: ``max_steps`` when the step cap (``trainer.max_steps``,
    −1 or None: none) was reached, else ``max_epochs``."""
    cap = getattr(trainer, "max_steps", -1)
    return "max_steps" if cap is not None and cap > 0 and int(trainer.global_step) >= int(cap) else "max_epochs"
