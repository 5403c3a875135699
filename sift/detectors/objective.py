"""What a torch detector minimises (``detector.objective``) and how its optimizer is built (``detector.optimizer``).

The objective is Σ_e R_e (``env_reduction="sum"``, paper eq. 14; ``"mean"`` is DomainBed's) + λ_IRM Ω_IRM +
λ_DANN Ω_DANN, with both penalties off for the first ``penalty_start_steps`` and ramped in over
``penalty_ramp_steps`` (:func:`sift.detectors.module.ramp_factor`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from sift.errors import SiftError

DANN_DOMAINS = ("env", "domain", "model")

#: ``detector.optimizer`` when a detector config gives none: Adam, lr 1e-3, no weight decay
DEFAULT_OPTIMIZER: dict[str, Any] = {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 1e-3,
                                     "weight_decay": 0.0}


@dataclass(frozen=True)
class Objective:
    """The training objective's terms and their weights (``detector.objective``)."""

    env_reduction: str = "sum"
    use_irm: bool = False
    irm_lambda: float = 1.0
    irm_anneal_steps: int = 0  # DomainBed: IRM weight 1.0 before this many steps, irm_lambda after
    use_dann: bool = False
    dann_weight: float = 0.5
    dann_domain: str = "env"  # what the domain classifier predicts: env | domain | model
    dann_hidden: int = 128
    dann_schedule: str = "constant"  # gradient-reversal coefficient: constant 1, or Ganin et al.'s ramp
    dann_lr_mult: float = 1.0  # learning rate of the domain classifier relative to the optimizer's
    penalty_start_steps: int = 0
    penalty_ramp_steps: int = 0

    def __post_init__(self) -> None:
        if self.env_reduction not in ("sum", "mean"):
            raise SiftError(f"env_reduction must be 'sum' or 'mean', got {self.env_reduction!r}")
        if self.dann_domain not in DANN_DOMAINS:
            raise SiftError(f"dann_domain must be one of {DANN_DOMAINS}, got {self.dann_domain!r}")
        if self.dann_schedule not in ("constant", "ganin"):
            raise SiftError(f"dann_schedule must be 'constant' or 'ganin', got {self.dann_schedule!r}")
        if self.penalty_start_steps < 0 or self.penalty_ramp_steps < 0:
            raise SiftError(f"penalty_start_steps and penalty_ramp_steps must be >= 0, got "
                            f"{self.penalty_start_steps}, {self.penalty_ramp_steps}")

    @classmethod
    def build(cls, defaults: Mapping[str, Any], given: Mapping[str, Any] | None) -> Objective:
        """``defaults`` (the detector class's) updated by ``given`` (the config's); an unknown key fails."""
        merged = {**defaults, **dict(given or {})}
        unknown = sorted(set(merged) - set(cls.__dataclass_fields__))
        if unknown:
            raise SiftError(f"detector.objective: unknown key(s) {unknown} (known: {sorted(cls.__dataclass_fields__)})")
        return cls(**merged)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def optimizer_config(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """``detector.optimizer`` completed with :data:`DEFAULT_OPTIMIZER`; it must build a partial."""
    cfg = {**DEFAULT_OPTIMIZER, **dict(given or {})}
    if cfg.get("_partial_") is not True:
        raise SiftError("detector.optimizer: needs `_partial_: true` (the detector passes the parameters)")
    return cfg


def build_optimizer(cfg: Mapping[str, Any], groups: Iterable[dict[str, Any]]) -> torch.optim.Optimizer:
    """Instantiate the optimizer partial of ``cfg`` on parameter ``groups``."""
    from hydra.utils import instantiate

    factory: Callable[..., torch.optim.Optimizer] = instantiate(dict(cfg))
    return factory(list(groups))
