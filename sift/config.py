"""sift's config tree: the schemas of the main configs (Hydra structured configs; a misspelt or mistyped key fails
at composition) and :func:`compose`, which composes any of sift's configs from library code.

``faithshift.yaml``, ``train.yaml``, ``evaluate.yaml`` and ``extract.yaml`` list their schema first in ``defaults``
(``faithshift_schema`` …), and ``companion/all.yaml`` (which every companion option builds on) lists
``companion_schema``; the values stay in the YAML files (every field here is ``???`` unless optional; the
``extraction`` node's defaults are also the code's, :class:`ExtractionSettings`).
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
class FaithShiftTrainerConfig:
    """How the main job trains its runs."""

    # the seeds of one run config train stacked in one process (sift/detectors/seed_stack.py): true | false | auto
    # | a list of detectors (auto: when the runs train on a GPU)
    stack_seeds: Any = "auto"


@dataclass
class FaithShiftConfig:
    """``sift-faithshift`` (``configs/faithshift.yaml`` + a ``preset``)."""

    paths: PathsConfig = field(default_factory=PathsConfig)
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    sgr: SGRConfig = field(default_factory=SGRConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    trainer: FaithShiftTrainerConfig = field(default_factory=FaithShiftTrainerConfig)
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
    env_batch_size: int | None = None  # traces per environment per training step, every run (None: data's)
    undertrained_detectors: list[str] = field(default_factory=list)
    ablations: list[str] = MISSING
    ablation_seeds: list[int] = MISSING
    factorial_seeds: list[int] = MISSING
    transfer: TransferConfig = field(default_factory=TransferConfig)
    instance_ensemble: list[str] = MISSING
    # the organism's mechanism kinds to compare (sift.lm.latent.MECHANISM_KINDS; None or one kind: the primary only,
    # source.mechanism_kind); the extra kinds' runs use kind_seeds and kind_detectors (None: detectors + controls)
    mechanisms: list[str] | None = None
    kind_seeds: list[int] = field(default_factory=lambda: [0])
    kind_detectors: list[str] | None = None
    source: Any = MISSING  # the corpus source (configs/source: organism | hf), checked by the corpus stage
    conditions: Any = None  # the corpus axes (None: all ten)
    domains: Any = None  # organism domains (None: all)
    corpus_overrides: list[str] = field(default_factory=list)
    extract_overrides: list[str] = field(default_factory=list)
    train_overrides: list[str] = field(default_factory=list)
    workers: int = MISSING
    torch_threads: int = MISSING
    wandb: bool = MISSING
    wandb_project: str = MISSING
    # formats the job exports at its end (sift.export: hf | inspect; empty: none; `sift-export <job>` any time)
    export: list[str] = field(default_factory=list)
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


@dataclass
class ExtractionSettings:
    """``sift-extract``'s ``extraction`` node; :class:`sift.trajectories.extract.ExtractConfig` adds its checks and
    cache key. Every field enters the cache key except ``batch_size`` and ``shard_size``."""

    t_max: int = 64  # at most this many (binned) steps per trace
    attention_layer: int = -1  # layer (1..L, or negative from the end) whose attention gives attention stability
    padding_side: str = "left"
    batch_size: int = 64  # traces per forward pass
    shard_size: int = 512  # traces per cache shard
    state_dtype: str = "float16"  # dtype of the stored (binned) final-layer states used by the answer probe
    interventions: list[str] = field(default_factory=lambda: ["cot_deleted", "first_step_edit", "step_dropped"])
    value_pattern: str = r"-?\d+|true|false|True|False"  # a token whose stripped text matches is a "value"
    step_pattern: str = r";|\."  # a token whose stripped text matches (or that holds a newline) ends a step
    # the answer line's tokens (after the CoT, before the answer token; at most answer_line_max of them) are steps
    # of the trajectory too, after the CoT's binned steps and flagged by the ``answer_line`` channel; false: CoT
    # positions only (the switch under which answer_routing's trajectories are bit-identical across twins)
    answer_line: bool = True
    answer_line_max: int = 4
    # per-head attention mass on the prompt / cue / generated tokens, for every head of this many layers (evenly
    # spaced in depth, the last included); 0: none. Not renormalised: the prompt-vs-CoT split is the signal
    head_mass_layers: int = 8


@dataclass
class ExtractTrainerConfig:
    """The Lightning Trainer of the extraction's predict loop."""

    accelerator: str = MISSING
    devices: Any = MISSING  # an int, a list of ids or "auto"
    strategy: str = MISSING
    num_nodes: int = MISSING


@dataclass
class ExtractConfig:
    """``sift-extract`` (``configs/extract.yaml``)."""

    corpus_dir: str = MISSING
    output_dir: str = MISSING
    model_field: str = MISSING
    models: dict[str, str] = MISSING  # record[model_field] -> model folder, .gguf file or cached hub name
    families: list[str] | None = None
    dtype: str | None = None
    overwrite: bool = MISSING
    progress: bool = MISSING
    extraction: ExtractionSettings = field(default_factory=ExtractionSettings)
    trainer: ExtractTrainerConfig = field(default_factory=ExtractTrainerConfig)


# -------------------------------------------------------------------------------- companion (configs/companion)
@dataclass
class CompanionData:
    corpus_dir: str | None = None
    checkpoint_dir: str | None = None
    families: Any = MISSING  # "auto" or a list of families


@dataclass
class System1Config:
    enabled: bool = MISSING
    n_items: int | None = None
    n_traces: int | None = None
    conditions: list[str] = MISSING
    n_bins: int = MISSING
    resamples: int = MISSING


@dataclass
class IceConfig:
    enabled: bool = MISSING
    n_traces: int = MISSING
    conditions: list[str] = MISSING
    explainers: list[str] = MISSING
    operators: list[str] = MISSING
    k: float = MISSING
    n_null: int = MISSING
    span: str = MISSING
    blacklist_values: bool = MISSING
    resamples: int = MISSING
    alpha: float = MISSING
    step_level: bool = MISSING


@dataclass
class EdctConfig:
    enabled: bool = MISSING
    n_traces: int = MISSING
    conditions: list[str] = MISSING
    k: int = MISSING
    tau_in: float = MISSING
    tau_out: float = MISSING
    graded_scheme: str = MISSING
    resamples: int = MISSING


@dataclass
class JudgesConfig:
    enabled: bool = MISSING
    model: str = MISSING
    tokenizer: str | None = None
    tiny_config: Any = None
    dtype: str | None = None
    n_items: int = MISSING
    probes: list[str] = MISSING
    protocol: str = MISSING
    verdict_mode: str = MISSING
    max_explanation_tokens: int = MISSING
    chat_template: bool = MISSING
    favored_label: str = MISSING
    resamples: int = MISSING


@dataclass
class DetectorShapConfig:
    enabled: bool = MISSING
    run_dir: str | None = None
    n_explain: int = MISSING
    baseline: str = MISSING
    groups: Any = None  # name -> [channels | feature:<name> | prefix/]


@dataclass
class CompanionConfig:
    """The ``companion`` group (``configs/companion/all.yaml`` and the options built on it)."""

    enabled: bool = MISSING
    seed: int = MISSING
    progress: bool = MISSING
    data: CompanionData = field(default_factory=CompanionData)
    system1: System1Config = field(default_factory=System1Config)
    ice: IceConfig = field(default_factory=IceConfig)
    edct: EdctConfig = field(default_factory=EdctConfig)
    judges: JudgesConfig = field(default_factory=JudgesConfig)
    detector_shap: DetectorShapConfig = field(default_factory=DetectorShapConfig)


SCHEMAS = {"faithshift_schema": FaithShiftConfig, "train_schema": TrainConfig, "evaluate_schema": EvaluateConfig,
           "extract_schema": ExtractConfig}
#: schemas of config-group options: (group, name) -> node
GROUP_SCHEMAS = {("companion", "companion_schema"): CompanionConfig}


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent), where the configs' ``defaults`` find them."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for name, node in SCHEMAS.items():
        cs.store(name=name, node=node)
    for (group, name), node in GROUP_SCHEMAS.items():
        cs.store(group=group, name=name, node=node)


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
