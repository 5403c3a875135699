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
