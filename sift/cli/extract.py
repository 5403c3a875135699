"""``sift-extract``: corpus folder → trajectory folder (Hydra overrides, e.g. ``corpus_dir=... trainer.devices=2``);
the work is :func:`sift.trajectories.job.run_extract`."""

from __future__ import annotations

from omegaconf import DictConfig

from sift.cli._common import clean_failure, sift_main
from sift.trajectories.job import run_extract


@sift_main("extract")
def main(cfg: DictConfig) -> None:
    with clean_failure("sift-extract", cfg.output_dir):
        m = run_extract(cfg)
        if m is not None:
            n = sum(i["n_traces"] for i in m["models"].values())
            print(f"sift-extract: {n} traces of {len(m['models'])} model(s), {m['shards']['total']} shards "
                  f"({m['shards']['computed_by_rank0']} computed here) -> {cfg.output_dir}")


if __name__ == "__main__":
    main()
