"""``sift-evaluate``: evaluate detector checkpoints (or saved predictions) → report.md, results.json, figures.

    sift-evaluate data.trajectory_dir=outputs/trajectories 'detectors=[outputs/sweeps/<date>]'
    sift-evaluate data=synthetic 'detectors=[outputs/train/sift/seed=0,outputs/train/sift/seed=1]'
    sift-evaluate 'predictions=[outputs/evaluate/<date>/predictions]'     (no models: saved .npz + pairs.npz)
"""

from __future__ import annotations

from omegaconf import DictConfig

from sift.cli._common import clean_failure, sift_main


@sift_main("evaluate")
def main(cfg: DictConfig) -> None:
    from sift.evaluation.run import evaluate

    with clean_failure("sift-evaluate", cfg.paths.output_dir):
        rec = evaluate(cfg)
        print(f"sift-evaluate: {rec['n_predictions']} prediction sets, sections {', '.join(rec['sections'])} "
              f"-> {rec['report']}")


if __name__ == "__main__":
    main()
