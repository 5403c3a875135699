"""The trajectory stage as a library call: a composed ``extract`` config in, a trajectory folder out."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from sift.errors import SiftError


def run_extract(cfg: DictConfig) -> dict | None:
    """Extract ``cfg.corpus_dir`` into ``cfg.output_dir``; returns the manifest (None on DDP ranks ≠ 0)."""
    from sift.trajectories.extract import ExtractConfig
    from sift.trajectories.predict import extract_corpus

    ex = OmegaConf.to_container(cfg.extraction, resolve=True)
    unknown = set(ex) - set(ExtractConfig.__dataclass_fields__)
    if unknown:
        raise SiftError(f"extraction: unknown key(s) {sorted(unknown)}")
    models = OmegaConf.to_container(cfg.models, resolve=True) or {}
    return extract_corpus(cfg.corpus_dir, cfg.output_dir, {str(k): str(v) for k, v in models.items()},
                          ExtractConfig(**ex), model_field=cfg.model_field,
                          families=list(cfg.families) if cfg.families is not None else None, dtype=cfg.dtype,
                          trainer_kwargs=OmegaConf.to_container(cfg.trainer, resolve=True), overwrite=cfg.overwrite,
                          progress=cfg.progress)
