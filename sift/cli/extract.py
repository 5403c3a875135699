"""``sift-extract``: corpus folder → trajectory folder (Hydra overrides, e.g. ``corpus_dir=... trainer.devices=2``)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from sift.cli._common import clean_failure, sift_main


def run(cfg: DictConfig) -> dict | None:
    """Extract ``cfg.corpus_dir`` into ``cfg.output_dir``; returns the manifest (None on DDP ranks ≠ 0)."""
    from sift.errors import SiftError
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


@sift_main("extract")
def main(cfg: DictConfig) -> None:
    with clean_failure("sift-extract", cfg.output_dir):
        m = run(cfg)
        if m is not None:
            n = sum(i["n_traces"] for i in m["models"].values())
            print(f"sift-extract: {n} traces of {len(m['models'])} model(s), {m['shards']['total']} shards "
                  f"({m['shards']['computed_by_rank0']} computed here) -> {cfg.output_dir}")


if __name__ == "__main__":
    main()
