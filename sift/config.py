"""sift's config tree: the schemas of the main configs (Hydra structured configs; a misspelt or mistyped key fails
at composition) and :func:`compose`, which composes any of sift's configs from library code.

``faithshift.yaml``, ``train.yaml`` and ``evaluate.yaml`` list their schema first in ``defaults``
(``faithshift_schema`` …); the values stay in the YAML files (every field here is ``???`` unless optional).
Nodes that a config group fills with arbitrary keys (``detector``, ``data``, ``trainer`` …) are ``Any``: their
keys are checked by Hydra's struct mode (an override of an unknown key fails) and by the object they build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig

from sift.resources import config_dir, organism_checkpoints


@dataclass
class SGRConfig:
    """Certified selective risk (``configs/sgr/``)."""

    alpha: float = MISSING
    delta: float = MISSING
    bound: str = MISSING
    candidates: list[float] | None = None
    max_traces: int | None = None
    alphas: list[float] = MISSING
    match_coverage: float = MISSING


@dataclass
class BootstrapConfig:
    """Cluster bootstrap over base items (``configs/bootstrap/``)."""

    resamples: int = MISSING
    appendix_resamples: int = MISSING
    seed: int = MISSING


@dataclass
class PathsConfig:
    """Where a command writes (``configs/paths/``)."""

    root_dir: str = MISSING
    log_dir: str = MISSING
    output_dir: str = MISSING
    ckpt_dir: str = MISSING


@dataclass
class TransferConfig:
    """The main job's held-out-domain and held-out-model runs."""

    detectors: list[str] = MISSING
    seeds: list[int] = MISSING
    holdout_domains: list[str] = MISSING
    holdout_models: Any = MISSING  # a list of family labels, or "auto": every source model but the first


@dataclass
class ReportConfig:
    """What the main job's report adds to the built-in sections."""

    section_modules: list[str] = field(default_factory=list)  # modules registering extra report sections


@dataclass
class FaithShiftConfig:
    """``sift-faithshift`` (``configs/faithshift.yaml`` + a ``preset``)."""

    paths: PathsConfig = field(default_factory=PathsConfig)
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    sgr: SGRConfig = field(default_factory=SGRConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    seed: int = MISSING
    preset_name: str = MISSING
    n_items: int = MISSING
    detectors: list[str] = MISSING
    controls: list[str] = MISSING
    seeds: list[int] = MISSING
    max_epochs: int = MISSING
    # {detector: cap} maps are Any: a typed Optional[Dict] node refuses a `key={a: 1}` override (OmegaConf 2.3);
    # validate_plan checks their values
    max_epochs_by_detector: Any = None
    max_steps_by_detector: Any = None
    undertrained_detectors: list[str] = field(default_factory=list)
    ablations: list[str] = MISSING
    ablation_seeds: list[int] = MISSING
    factorial_seeds: list[int] = MISSING
    transfer: TransferConfig = field(default_factory=TransferConfig)
    instance_ensemble: list[str] = MISSING
    source: Any = MISSING  # the corpus source (configs/source: organism | hf), checked by the corpus stage
    conditions: Any = None  # the corpus axes (None: all ten)
    domains: Any = None  # organism domains (None: all)
    corpus_overrides: list[str] = field(default_factory=list)
    extract_overrides: list[str] = field(default_factory=list)
    train_overrides: list[str] = field(default_factory=list)
    workers: int = MISSING
    torch_threads: int = MISSING
    wandb: bool = MISSING
    executor: Any = MISSING


@dataclass
class EnsembleConfig:
    n_members: int = 1


@dataclass
class ProvenanceConfig:
    git: bool = True


@dataclass
class TrainConfig:
    """``sift-train`` (``configs/train.yaml``)."""

    paths: PathsConfig = field(default_factory=PathsConfig)
    sgr: SGRConfig = field(default_factory=SGRConfig)
    task_name: str = MISSING
    seed: int = MISSING
    monitor: str = MISSING
    monitor_mode: str = MISSING
    resume: bool = MISSING
    skip_if_done: bool = MISSING
    test: bool = MISSING
    ckpt_path: str | None = None
    allow_remote_ckpt: bool = False
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    provenance: ProvenanceConfig = field(default_factory=ProvenanceConfig)
    tags: list[str] = field(default_factory=list)
    data: Any = MISSING
    detector: Any = MISSING
    trainer: Any = MISSING
    callbacks: Any = MISSING
    logger: Any = None


@dataclass
class EvaluateConfig:
    """``sift-evaluate`` (``configs/evaluate.yaml``)."""

    paths: PathsConfig = field(default_factory=PathsConfig)
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    sgr: SGRConfig = field(default_factory=SGRConfig)
    task_name: str = MISSING
    trajectory_dir: str | None = None
    corpus_dir: str | None = None
    detectors: list[Any] = field(default_factory=list)  # paths, globs or {path, name, seed}
    predictions: list[str] = field(default_factory=list)
    split: str = MISSING
    calib_split: str | None = None
    select_split: str | None = None
    transfer: bool = MISSING
    transfer_name: str | None = None
    device: str = MISSING
    coverages: list[float] = MISSING
    reference: str | None = None
    families: Any = None  # {train_on name: family}
    title: str = MISSING
    data: Any = MISSING
    companion: Any = None


SCHEMAS = {"faithshift_schema": FaithShiftConfig, "train_schema": TrainConfig, "evaluate_schema": EvaluateConfig}


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent), where the configs' ``defaults`` find them."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for name, node in SCHEMAS.items():
        cs.store(name=name, node=node)


def register_resolvers() -> None:
    """``${sift_organism:<family>}`` in configs (the folder of a shipped organism model, e.g. ``gpt2``) and the
    configs' schemas in Hydra's ConfigStore (idempotent)."""
    from omegaconf import OmegaConf

    register_schemas()
    if not OmegaConf.has_resolver("sift_organism"):
        OmegaConf.register_new_resolver("sift_organism", lambda family: str(organism_checkpoints() / str(family)))


def compose(config_name: str, overrides: list[str]) -> DictConfig:
    """Compose one of sift's Hydra configs (``train``, ``corpus`` …; works inside and outside a running Hydra
    app; a ``--config-dir``/``$SIFT_CONFIG_DIR`` folder overrides the packaged configs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_resolvers()
    if GlobalHydra.instance().is_initialized():
        return hydra_compose(config_name=config_name, overrides=overrides)
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides)
