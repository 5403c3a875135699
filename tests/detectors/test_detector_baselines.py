"""Baselines: feature selection by the agreed prefixes, the LR equals scikit-learn, the attribution score."""

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from datamodules.batch import TraceBatch
from datamodules.features import BEHAVIOUR_PREFIX, CF_PREFIX, CUE_PREFIX, INTERNAL_PREFIX, organism_channel_names
from datamodules.synthetic_datamodule import SyntheticDataModule
from sift.detectors import DataSpec, LogisticDetector, MLPDetector
from sift.errors import SiftError
from sift.metrics import auroc


@pytest.fixture(scope="module")
def dm():
    d = SyntheticDataModule(generator=dict(n_items=200, t_max=24))
    d.setup()
    return d


@pytest.fixture(scope="module")
def spec(dm):
    return DataSpec.from_datamodule(dm)


def test_prefix_selection(spec):
    cue = LogisticDetector(data=spec, inputs={"kind": "features", "prefixes": [CUE_PREFIX]})
    assert cue.selector.names and all(n.startswith("cue/") for n in cue.selector.names)
    inst = MLPDetector(data=spec, inputs={"kind": "features", "prefixes": [BEHAVIOUR_PREFIX, INTERNAL_PREFIX]},
                       net={"hidden": 128})
    assert {n.split("/")[0] for n in inst.selector.names} == {"beh", "int"}
    assert inst.net.body[0].out_features == 128
    cf = MLPDetector(data=spec, inputs={"kind": "features", "prefixes": [CF_PREFIX]}, net={"hidden": 64})
    assert all(n.startswith("cf/") for n in cf.selector.names) and cf.net.body[0].out_features == 64
    with pytest.raises(SiftError, match="no feature name starts with"):
        LogisticDetector(data={**spec.as_dict(), "feature_names": ["beh/x"]},
                         inputs={"kind": "features", "prefixes": [CUE_PREFIX]})


def test_attribution_score_is_masked_mean():
    ch = organism_channel_names(4)
    m = LogisticDetector(data={"channel_names": ch}, inputs={"kind": "channel_mean", "channel": "attention_stability"})
    x = torch.zeros(2, 4, 9)
    x[0, :, -1] = torch.tensor([1.0, 2.0, 3.0, 99.0])
    x[1, :, -1] = torch.tensor([4.0, 99.0, 99.0, 99.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    b = TraceBatch(x=x, mask=mask, label=torch.zeros(2), env=torch.zeros(2, dtype=torch.long),
                   domain=torch.zeros(2, dtype=torch.long), model=torch.zeros(2, dtype=torch.long),
                   pooled=torch.zeros(2, 1), features=torch.zeros(2, 0))
    torch.testing.assert_close(m.selector(b), torch.tensor([[2.0], [4.0]]))


def test_logistic_matches_sklearn(dm, spec):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    m = LogisticDetector(data=spec, inputs="pooled", C=1.0)
    tr = [b for bs in dm.train_dataloader() for b in bs]
    X = torch.cat([m.selector(b) for b in tr]).numpy()
    y = torch.cat([b.label for b in tr]).numpy()
    m.fit_arrays(X, y)
    val = next(iter(dm.val_dataloader()))
    sc = StandardScaler().fit(X)
    ref = LogisticRegression(C=1.0, max_iter=1000).fit(sc.transform(X), y.astype(int))
    expect = ref.predict_proba(sc.transform(m.selector(val).numpy()))[:, 1]
    np.testing.assert_allclose(m(val).detach().numpy(), expect, atol=1e-5)


@pytest.mark.parametrize("kind", ["biasing_features", "counterfactual", "hidden_probe", "instance_level",
                                  "attribution_consistency"])
def test_each_baseline_trains_through_lightning(dm, spec, kind, tmp_path):
    from omegaconf import OmegaConf

    from sift.cli._common import CONFIG_DIR
    from sift.training import DETECTOR_RUN_KEYS, instantiate_node

    cfg = OmegaConf.load(f"{CONFIG_DIR}/detector/{kind}.yaml")
    pl.seed_everything(0)
    m = instantiate_node(cfg, exclude=DETECTOR_RUN_KEYS, data=spec.as_dict())
    tr = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=tmp_path)
    tr.fit(m, dm)
    if isinstance(m, LogisticDetector):
        assert bool(m.fitted) and tr.current_epoch == 1  # one pass, then it stops
    out = m.predict_loader(dm.test_dataloader())
    assert set(out) >= {"prob", "verdict", "rho", "label"}
    assert torch.equal(out["verdict"], (out["prob"] >= m.threshold).long())
    assert auroc(out["prob"].numpy(), out["label"].numpy()) > 0.6


def test_logistic_without_flat_loader_fits_on_first_epoch(dm, spec, tmp_path):
    m = LogisticDetector(data=spec, inputs={"kind": "features", "prefixes": [CUE_PREFIX]})
    tr = pl.Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=tmp_path)
    tr.fit(m, train_dataloaders=dm.train_dataloader(), val_dataloaders=dm.val_dataloader())
    assert bool(m.fitted) and tr.current_epoch == 1 and float(m.threshold) != 0.5
