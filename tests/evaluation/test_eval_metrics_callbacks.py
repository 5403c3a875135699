"""torchmetrics metrics and the Lightning evaluation callback on the hand-computable toy (ev_toy.py)."""

import math

import ev_toy as toy
import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from datamodules.batch import PairIndex, TraceExample, collate
from sift.evaluation.callbacks import MetaEvalCallback
from sift.evaluation.training_metrics import (
    AlterationSensitivity,
    InvarianceViolationRate,
    MetaFaithfulness,
    SelectiveGuaranteedRisk,
)
from sift.metrics import alteration_sensitivity, ivr_per_axis, sgr


def test_ivr_and_as_metrics_match_functional_and_merge_like_ddp():
    rng = np.random.default_rng(0)
    n = 200
    a, b = rng.integers(0, 2, n), rng.integers(0, 2, n)
    axes = rng.choice(["x", "y", "z"], n)
    whole, half1, half2 = (InvarianceViolationRate(["x", "y", "z"]) for _ in range(3))
    whole.update(torch.tensor(a), torch.tensor(b), list(axes))
    half1.update(torch.tensor(a[:90]), torch.tensor(b[:90]), list(axes[:90]))
    half2.update(torch.tensor(a[90:]), torch.tensor(b[90:]), list(axes[90:]))
    half1.merge_state(half2)  # what the DDP reduction (sum) does
    ref = ivr_per_axis(a, b, axes)
    for m in (whole, half1):
        out = m.compute()
        for k, v in ref.items():
            assert float(out[k]) == pytest.approx(v, abs=1e-6)
    lb = rng.integers(0, 2, n)
    la = 1 - lb
    la[:10] = lb[:10]  # not altering: left out
    m = AlterationSensitivity()
    m.update(torch.tensor(a), torch.tensor(b), torch.tensor(lb), torch.tensor(la))
    assert float(m.compute()) == pytest.approx(alteration_sensitivity(a[10:], b[10:], lb[10:], la[10:]), abs=1e-6)


def test_sgr_metric_cat_states_merge():
    rng = np.random.default_rng(1)
    rho, ok = rng.uniform(0.5, 1, 500), (rng.uniform(size=500) < 0.9).astype(int)
    items = [f"item{k}" for k in rng.integers(0, 60, 500)]
    m1, m2 = SelectiveGuaranteedRisk(alpha=0.2, delta=0.1), SelectiveGuaranteedRisk(alpha=0.2, delta=0.1)
    m1.update(torch.tensor(rho[:200]), torch.tensor(ok[:200]), items[:200])
    m2.update(torch.tensor(rho[200:]), torch.tensor(ok[200:]), items[200:])
    m1.merge_state(m2)
    out, ref = m1.compute(), sgr(rho, ok, 0.2, 0.1, groups=items)
    assert ref.n_items == 60
    assert float(out["threshold"]) == pytest.approx(ref.threshold)
    assert float(out["coverage"]) == pytest.approx(ref.coverage)


def _toy_verdict_inputs():
    p0 = toy.predictions(0)
    idx = p0.index()
    pr = toy.pairs()
    s = np.array([idx[t] for t in pr.source_id])
    d = np.array([idx[t] for t in pr.shifted_id])
    return p0, pr, s, d


def test_meta_faithfulness_metric_hand_values():
    p0, pr, s, d = _toy_verdict_inputs()
    v, rho = torch.tensor(p0.verdict), torch.tensor(p0.confidence)
    m = MetaFaithfulness(["paraphrase", "hint_format"], alpha=0.7, delta=0.5, candidates=[0.75])
    half = len(pr) // 2
    for sl in (slice(0, half), slice(half, None)):
        m.update_pairs(axis=list(pr.axis[sl]), kind=list(pr.kind[sl]), verdict_source=v[s[sl]],
                       verdict_shifted=v[d[sl]], label_source=torch.tensor(pr.phi_source[sl]),
                       label_shifted=torch.tensor(pr.phi_shifted[sl]), rho_source=rho[s[sl]], rho_shifted=rho[d[sl]])
    m.update_traces(rho, torch.tensor(p0.correct), list(p0.base_item))
    out = {k: float(x) for k, x in m.compute().items()}
    assert out["ivr/paraphrase"] == pytest.approx(0.5) and out["ivr/hint_format"] == pytest.approx(1 / 3)
    assert out["ivr"] == pytest.approx(5 / 12) and out["as"] == pytest.approx(0.5)
    assert out["mfs"] == pytest.approx(7 / 13, abs=1e-6)
    assert out["coverage"] == pytest.approx(7 / 15) and out["sgr_threshold"] == pytest.approx(0.75)
    assert out["cert/ivr"] == 0.0 and out["cert/as"] == 1.0 and out["cert/mfs"] == pytest.approx(7 / 15)


# ------------------------------------------------------------------------------ callback with a fake detector
class ToyDM(pl.LightningDataModule):
    """The toy's traces as one 'val' and 'test' split: x[0, 0] carries the seed-0 probability."""

    def __init__(self):
        super().__init__()
        p0 = toy.predictions(0)
        self.examples = [TraceExample(x=torch.full((2, 1), float(p)), label=int(y), env=0, domain=0, model=0,
                                      pooled=torch.zeros(1), features=torch.zeros(1), trace_id=t,
                                      base_item=t.split("/")[0])
                         for t, y, p in zip(p0.trace_id, p0.label, p0.prob)]
        idx = p0.index()
        pr = toy.pairs()
        self._pairs = [PairIndex(a, k, idx[s], idx[d], int(ys), int(yd)) for a, k, s, d, ys, yd in
                       zip(pr.axis, pr.kind, pr.source_id, pr.shifted_id, pr.phi_source, pr.phi_shifted)]

    def dataset(self, split):
        return self.examples

    def pairs(self, split, kind=None, axis=None):
        return [p for p in self._pairs if (kind is None or p.kind == kind) and (axis is None or p.axis == axis)]

    def _dl(self):
        return torch.utils.data.DataLoader(self.examples, batch_size=4, collate_fn=collate)

    val_dataloader = test_dataloader = _dl

    def pair_dataloader(self, split, kind=None, axis=None, batch_size=None):
        from datamodules.trajectory_datamodule import PairBatch

        ps = self.pairs(split, kind, axis)
        b = batch_size or 3
        for i in range(0, len(ps), b):
            ch = ps[i:i + b]
            yield PairBatch(collate([self.examples[p.source] for p in ch]),
                            collate([self.examples[p.shifted] for p in ch]), ch)


class FakeDetector(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.register_buffer("threshold", torch.tensor(0.5))
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.threshold_method = "youden"

    def forward(self, batch):
        return batch.x[:, 0, 0] + 0 * self.w

    def validation_step(self, batch, i):
        return None

    test_step = validation_step


def test_callback_logs_hand_values_in_validate_and_test():
    cb = MetaEvalCallback(alpha=0.7, delta=0.5, candidates=[0.75], batch_size=3)
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, callbacks=[cb],
                         accelerator="cpu")
    out = trainer.validate(FakeDetector(), datamodule=ToyDM(), verbose=False)[0]
    assert out["val/ivr/paraphrase"] == pytest.approx(0.5) and out["val/ivr/hint_format"] == pytest.approx(1 / 3)
    assert out["val/ivr"] == pytest.approx(5 / 12) and out["val/as"] == pytest.approx(0.5)
    assert out["val/mfs"] == pytest.approx(7 / 13, abs=1e-6)
    assert out["val/coverage"] == pytest.approx(7 / 15) and out["val/sgr_coverage"] == out["val/coverage"]
    assert out["val/cert/mfs"] == pytest.approx(7 / 15)
    t = trainer.test(FakeDetector(), datamodule=ToyDM(), verbose=False)[0]
    assert t["test/ivr"] == pytest.approx(5 / 12)
    # max_pairs keeps the first pairs only (4 paraphrase pairs)
    vals = MetaEvalCallback(max_pairs=4).compute(FakeDetector(), ToyDM(), "val")
    assert vals["ivr/paraphrase"] == pytest.approx(0.5) and "ivr/hint_format" not in vals
    assert math.isnan(vals["as"])


def test_callback_during_fit_on_synthetic_data_feeds_checkpointing(compose_train, tmp_path):
    from sift.training import train

    cfg = compose_train("detector=instance_level", "callbacks=meta_eval", "monitor=val/ivr", "monitor_mode=min",
                        "trainer.max_epochs=2", "data.generator.n_items=120")
    rec = train(cfg)
    m = rec["metrics"]
    for k in ("val/ivr", "val/ivr/env1", "val/ivr/env2", "val/coverage", "val/sgr_coverage", "test/ivr", "test/as",
              "test/mfs"):
        assert k in m, k
    assert 0.0 <= m["test/as"] <= 1.0 and 0.0 <= m["test/ivr"] <= 1.0
    assert rec["best_ckpt"] and rec["best_ckpt"].endswith(".ckpt")
    ck = torch.load(rec["best_ckpt"], weights_only=False)
    mc = [v for k, v in ck["callbacks"].items() if "ModelCheckpoint" in k][0]
    assert mc["monitor"] == "val/ivr" and mc["best_model_score"] is not None
