"""``sift-train``: train a detector (Hydra overrides, e.g. ``detector=sift seed=1 data=synthetic``; ``-m`` sweeps)."""

from __future__ import annotations

from omegaconf import DictConfig

from sift.cli._common import clean_failure, sift_main


@sift_main("train")
def main(cfg: DictConfig) -> float | None:
    from sift.training import train

    with clean_failure("sift-train", cfg.paths.output_dir):
        rec = train(cfg)
        m = rec.get("metrics", {})
        shown = " ".join(f"{k}={m[k]:.3f}" for k in ("val/auroc", "test/auroc", "transfer/auroc")
                         if m.get(k) is not None)
        print(f"sift-train: {rec['kind']} {rec['detector']} seed={rec['seed']} {shown} -> {cfg.paths.output_dir}")
        v = m.get(str(cfg.monitor))
        return float(v) if v is not None else None  # for Hydra sweepers that optimise a metric
    return None


if __name__ == "__main__":
    main()
