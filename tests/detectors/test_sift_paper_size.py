"""Slow: the paper-size SIFT (Table 7 architecture and objective) learns the synthetic trajectory shape."""

import warnings

import numpy as np
import pytest
import pytorch_lightning as pl

from datamodules.synthetic_datamodule import SyntheticDataModule
from sift.detectors import DataSpec, SIFTDetector
from sift.metrics import auroc

pytestmark = pytest.mark.slow


def _fit(dm, epochs, seed=0, **kw):
    pl.seed_everything(seed, verbose=False)
    m = SIFTDetector(data=DataSpec.from_datamodule(dm), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False).fit(m, dm)
    return m.eval()


def test_paper_size_sift_learns_the_trajectory_shape():
    dm = SyntheticDataModule(generator=dict(n_items=300))
    dm.setup()
    m = _fit(dm, 6)  # Table 7 architecture and objective (IRM λ=1, DANN 0.5)
    out = m.predict_loader(dm.test_dataloader())
    assert auroc(out["prob"].numpy(), out["label"].numpy()) >= 0.9
    shift = m.predict_loader(dm.transfer_dataloader())
    assert np.isfinite(shift["prob"].numpy()).all()
