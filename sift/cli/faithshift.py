"""``sift-faithshift``: the main job, end to end on the embedded organism (``preset=quick`` for a fast look)."""

from __future__ import annotations

from omegaconf import DictConfig

import sift.corpus.config  # noqa: F401  (registers the source schemas the config's `source` group uses)
from sift.cli._common import clean_failure, sift_main


@sift_main("faithshift")
def main(cfg: DictConfig) -> None:
    from sift.faithshift import run_faithshift

    with clean_failure("sift-faithshift", cfg.paths.output_dir):
        res = run_faithshift(cfg)
        print(f"sift-faithshift: {res['runs']} runs; report {res['report']}; numbers {res['results']}")


if __name__ == "__main__":
    main()
