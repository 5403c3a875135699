"""Slow: what the invariance objective does to SIFT on synthetic data with known structure."""

import warnings

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from datamodules.synthetic_datamodule import SyntheticDataModule
from sift.detectors import DataSpec, SIFTDetector
from sift.metrics import auroc

pytestmark = pytest.mark.slow
SMALL = dict(filters=16, d_model=32, n_layers=1, n_heads=4, dim_feedforward=64, mlp_hidden=32, dann_hidden=32)


def _fit(dm, epochs, seed=0, **kw):
    pl.seed_everything(seed, verbose=False)
    m = SIFTDetector(**DataSpec.from_datamodule(dm).as_kwargs(), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False).fit(m, dm)
    return m.eval()


def _env_probe_accuracy(m, dm) -> float:
    """Accuracy of a fresh logistic probe that reads the environment from SIFT's pooled representation."""
    from sklearn.linear_model import LogisticRegression

    def reps(split):
        zs, es = [], []
        with torch.no_grad():
            for b in dm._loader(dm.dataset(split), False, 256):
                zs.append(m.encode(b)[1])
                es.append(b.env)
        return torch.cat(zs).numpy(), torch.cat(es).numpy()

    ztr, etr = reps("train")
    zte, ete = reps("test")
    return LogisticRegression(max_iter=2000).fit(ztr, etr).score(zte, ete)


def test_dann_removes_environment_information_from_the_representation():
    dm = SyntheticDataModule(n_items=300, env_offset=2.0)
    dm.setup()
    erm = _fit(dm, 6, use_irm=False, use_dann=False, **SMALL)
    dann = _fit(dm, 6, use_irm=False, use_dann=True, dann_weight=1.0, **SMALL)
    a_erm, a_dann = _env_probe_accuracy(erm, dm), _env_probe_accuracy(dann, dm)
    assert a_erm > 0.9  # without DANN the environment is readable from z
    assert a_dann < a_erm - 0.15, (a_erm, a_dann)


def test_paper_size_sift_learns_the_trajectory_shape():
    dm = SyntheticDataModule(n_items=300)
    dm.setup()
    m = _fit(dm, 6)  # Table 7 architecture and objective (IRM λ=1, DANN 0.5)
    out = m.predict_loader(dm.test_dataloader())
    assert auroc(out["prob"].numpy(), out["label"].numpy()) >= 0.9
    shift = m.predict_loader(dm.transfer_dataloader())
    assert np.isfinite(shift["prob"].numpy()).all()
