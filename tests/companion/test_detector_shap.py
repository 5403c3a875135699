"""S1-SHAP over descriptor groups: exact on a logit-additive detector; runs on a SIFT trained on synthetic data."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from datamodules.batch import collate  # noqa: E402
from datamodules.synthetic_datamodule import SyntheticDataModule  # noqa: E402
from sift.companion.detector_shap import default_groups, explain_detector_groups  # noqa: E402
from sift.errors import SiftError  # noqa: E402


class AdditiveDetector(torch.nn.Module):
    """logit = b + Σ_c w_c · mean_t x[:, t, c] + u · features[:, 0]: logit-additive in any channel grouping."""

    def __init__(self, channel_names, feature_names, w, u=0.0, b=0.3):
        super().__init__()
        self.channel_names, self.feature_names = list(channel_names), list(feature_names)
        self.w, self.u, self.b = torch.tensor(w, dtype=torch.float32), u, b
        self.threshold = torch.tensor(0.5)

    def probs(self, batch):
        m = batch.mask.float().unsqueeze(-1)
        mean = (batch.x * m).sum(1) / m.sum(1)
        return torch.sigmoid(self.b + mean @ self.w + self.u * batch.features[:, 0])


@pytest.fixture(scope="module")
def data():
    dm = SyntheticDataModule(generator=dict(n_items=60, data_seed=0))
    dm.setup()
    return dm, collate(dm.dataset("test")[:12])


def test_logit_additive_detector_recovered_exactly(data):
    dm, batch = data
    ch = dm.channel_names
    rng = np.random.default_rng(0)
    w = rng.normal(size=len(ch)).astype(np.float32)
    det = AdditiveDetector(ch, dm.feature_names, w, u=0.7)
    groups = {"velocity": ["velocity/"], "drift": ["drift/"], "ec": ["early_commitment"],
              "as": ["attention_stability"], "cue": [f"feature:{dm.feature_names[0]}"]}
    ga = explain_detector_groups(det, batch, groups, baseline="mean")
    # analytic: φ_g = ± Σ_{c∈g} w_c (mean_t x_ic − baseline_c); sign + for y* = faithful, − otherwise
    mask = batch.mask.bool()
    base = batch.x[mask].mean(0).numpy()
    m = batch.mask.float().unsqueeze(-1)
    mean = ((batch.x * m).sum(1) / m.sum(1)).numpy()
    contrib = (mean - base) * w
    sign = np.where(ga.prediction == 1, 1.0, -1.0)
    cols = {g: [i for i, c in enumerate(ch) if c.startswith(groups[g][0])] for g in ("velocity", "drift", "ec", "as")}
    for j, g in enumerate(ga.groups[:4]):
        np.testing.assert_allclose(ga.phi_logit[:, j], sign * contrib[:, cols[g]].sum(1), atol=2e-4)
    f0 = batch.features[:, 0].numpy()
    np.testing.assert_allclose(ga.phi_logit[:, 4], sign * 0.7 * (f0 - f0.mean()), atol=2e-4)
    assert ga.efficiency_error() < 1e-9 and ga.n_detector_calls == 32
    # probability-space KernelSHAP obeys efficiency in probability units too
    p_full = np.where(ga.prediction == 1, ga.prob_faithful, 1 - ga.prob_faithful)
    assert np.all(np.abs(ga.phi_prob.sum(1) - (p_full - 1 / (1 + np.exp(-ga.base_logit)))) < 1e-6)


def test_groups_resolution_and_errors(data):
    dm, batch = data
    g = default_groups(dm.channel_names, dm.feature_names)
    assert list(g)[:4] == ["velocity", "drift", "early_commitment", "attention_stability"]
    assert {"cue", "cf", "beh", "int"} <= set(g)
    det = AdditiveDetector(dm.channel_names, dm.feature_names, np.zeros(len(dm.channel_names), np.float32))
    with pytest.raises(SiftError, match="matches nothing"):
        explain_detector_groups(det, batch, {"x": ["nonexistent"]})
    with pytest.raises(SiftError, match="at most"):
        explain_detector_groups(det, batch, {f"g{i}": ["drift/"] for i in range(13)})


def test_trained_sift_detector_groups(data):
    import pytorch_lightning as pl

    from sift.detectors import DataSpec
    from sift.detectors.sift_model import SIFTDetector

    dm, batch = data
    pl.seed_everything(0)
    det = SIFTDetector(data=DataSpec.from_datamodule(dm),
                       net={"d_model": 16, "filters": 4, "n_layers": 1, "n_heads": 2, "dim_feedforward": 32,
                            "mlp_hidden": 16}, objective={"use_irm": False, "use_dann": False})
    pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(det, dm.train_dataloader())
    was = det.training
    ga = explain_detector_groups(det, batch)
    assert ga.groups[:4] == ("velocity", "drift", "early_commitment", "attention_stability")
    assert ga.phi_logit.shape == (12, len(ga.groups)) and ga.efficiency_error() < 1e-9
    feats = [j for j, g in enumerate(ga.groups) if g in ("cue", "cf", "beh", "int")]
    assert feats and np.all(np.abs(ga.phi_logit[:, feats]) < 1e-9)  # SIFT reads the descriptor channels only
    assert det.training == was  # mode restored
