"""Shared test fixtures: offline W&B, no git calls, composed train configs pointed at tmp_path."""

from __future__ import annotations

import os
import warnings

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("SIFT_NO_GIT", "1")

#: a small synthetic data set
SMALL_DATA = ["data=synthetic", "data.generator.n_items=200", "data.generator.t_max=24"]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(nested tensors|does not have many workers|LeafSpec|"
                                "smaller than the logging interval|anonymous setting|configure_optimizers).*")
        yield


@pytest.fixture
def compose_train(tmp_path):
    """compose_train(*overrides, out=None) -> DictConfig with paths.output_dir under tmp_path."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sift.cli._common import CONFIG_DIR

    def make(*overrides: str, out: str | None = None):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose("train", overrides=[f"paths.output_dir={out or tmp_path / 'run'}", "logger=none",
                                              *SMALL_DATA, *overrides])
        GlobalHydra.instance().clear()
        return cfg

    return make


@pytest.fixture(scope="session")
def toy_trajectories(tmp_path_factory):
    """(root, models): a 24-item toy corpus (``root/corpus``), its two random toy models and their trajectories
    (``root/traj``; shards of 64, micro-batches of 32, at most 12 steps). Read-only for the tests that share it."""
    from sift.trajectories.extract import ExtractConfig
    from sift.trajectories.predict import extract_corpus
    from sift.trajectories.toy import save_toy_models, write_toy_corpus

    root = tmp_path_factory.mktemp("toy_trajectories")
    write_toy_corpus(root / "corpus", n_items=24)
    models = save_toy_models(root / "models")
    extract_corpus(root / "corpus", root / "traj", models, ExtractConfig(shard_size=64, batch_size=32, t_max=12))
    return root, models


def _compose_on_trajectories(root, detector: str, out, *extra: str):
    """The ``train`` config of ``detector`` on the trajectory DataModule of ``root/traj`` (no logger, 3 epochs)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sift.cli._common import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"detector={detector}", "data=trajectory",
                                          f"data.trajectory_dir={root / 'traj'}", f"paths.output_dir={out}",
                                          "logger=none", "trainer.max_epochs=3", "trainer.enable_progress_bar=false",
                                          *extra])
    GlobalHydra.instance().clear()
    return cfg


@pytest.fixture(scope="session")
def trajectory_cfg():
    """trajectory_cfg(root, detector, out, *overrides) -> the train config on ``root/traj``."""
    return _compose_on_trajectories
