"""A step-capped run (``trainer.max_steps``, as SIFT's in the presets) killed right after an epoch's ``last.ckpt``
resumes to the uninterrupted run's numbers: the crash matrix's "mid SIFT run" point, pinned deterministically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sift.detectors import SIFTDetector
from sift.training import train

SMALL_SIFT = ["detector.net.d_model=32", "detector.net.filters=16", "detector.net.n_layers=1",
              "detector.net.n_heads=4", "detector.net.dim_feedforward=64", "detector.net.mlp_hidden=32",
              "detector.objective.dann_hidden=32"]


def _compose_trajectory(tmp_path):
    """compose_train without the synthetic data's overrides."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sift.cli._common import CONFIG_DIR

    def make(*overrides: str, out: str | None = None):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose("train", overrides=[f"paths.output_dir={out or tmp_path / 'run'}", "logger=none",
                                              "trainer.enable_progress_bar=false", *overrides])
        GlobalHydra.instance().clear()
        return cfg

    return make


class Killed(Exception):
    """Stands in for SIGKILL: the run ends without writing anything more."""


def _kill_at_epoch(monkeypatch, epoch: int) -> None:
    real = SIFTDetector.on_train_epoch_start

    def hook(self):
        if self.current_epoch == epoch:
            raise Killed
        return real(self)

    monkeypatch.setattr(SIFTDetector, "on_train_epoch_start", hook)


def _numbers(rec: dict) -> dict:
    keep = ("global_step", "epochs", "threshold", "metrics", "training")
    return json.loads(json.dumps({k: rec[k] for k in keep}))


@pytest.fixture(scope="module")
def toy_trajectories(tmp_path_factory):
    """The TrajectoryDataModule's input (environment-balanced loader, per-epoch order), from the toy models."""
    from sift.trajectories.extract import ExtractConfig
    from sift.trajectories.predict import extract_corpus
    from sift.trajectories.toy import save_toy_models, write_toy_corpus

    root = tmp_path_factory.mktemp("cap_resume")
    corpus = write_toy_corpus(root / "corpus", n_items=24)
    extract_corpus(corpus, root / "traj", save_toy_models(root / "models"),
                   ExtractConfig(shard_size=64, batch_size=32, t_max=12), progress=False)
    return root / "traj"


@pytest.mark.parametrize("data", ["synthetic", "trajectory"])
@pytest.mark.parametrize("cap", ["loose", "binding"])
def test_step_capped_run_killed_after_an_epoch_resumes_exactly(compose_train, tmp_path, monkeypatch, cap, data,
                                                                request):
    args = ["detector=sift", *SMALL_SIFT, "trainer.max_epochs=4"]
    if data == "trajectory":
        traj = request.getfixturevalue("toy_trajectories")
        args += ["data=trajectory", f"data.trajectory_dir={traj}", "data.batch_size=8"]
        compose_train = _compose_trajectory(tmp_path)
    probe = train(compose_train(*args, "trainer.max_epochs=1", out=str(tmp_path / "probe")))
    per_epoch = int(probe["global_step"])
    steps = 1000 if cap == "loose" else 3 * per_epoch - 1   # binding: stops one step into the third epoch's end
    args.append(f"++trainer.max_steps={steps}")
    clean = train(compose_train(*args, out=str(tmp_path / "clean")))
    assert clean["global_step"] == min(steps, 4 * per_epoch)

    out = tmp_path / "killed"
    with monkeypatch.context() as m:
        _kill_at_epoch(m, 2)   # after epoch 1's validation wrote last.ckpt
        with pytest.raises(Killed):
            train(compose_train(*args, out=str(out)))
    assert (out / "checkpoints" / "last.ckpt").is_file() and not (out / "results.json").exists()
    resumed = train(compose_train(*args, out=str(out)))
    assert _numbers(resumed) == _numbers(clean)
    assert Path(resumed["best_ckpt"]).name == Path(clean["best_ckpt"]).name
