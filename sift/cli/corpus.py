"""``sift-corpus``: build a FaithShift trace corpus (Hydra overrides, e.g. ``n_items=100 source=hf``); its chunks
run as jobs on ``executor=local`` (``workers`` processes) or ``executor=slurm`` (an array job). The config is
checked against :mod:`sift.corpus.config` when composed; the build is :func:`sift.corpus.job.run_corpus`."""

from __future__ import annotations

from omegaconf import DictConfig

from sift.cli._common import clean_failure, sift_main
from sift.corpus.job import run_corpus


@sift_main("corpus")
def main(cfg: DictConfig) -> None:
    with clean_failure("sift-corpus", cfg.output_dir):
        m = run_corpus(cfg)
        print(f"sift-corpus: {m['traces']} traces, {m['pairs']} pairs -> {cfg.output_dir}")


if __name__ == "__main__":
    main()
