"""The output-confidence control (issue 43): log P(answer) and the top-2 margin at the position predicting the answer,
recomputed by hand from the source model's logits, reach the control's features and nothing else does."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sift.trajectories.extract import answer_index


@pytest.fixture(scope="module")
def traj(toy_trajectories):
    return toy_trajectories


def test_confidence_features_are_the_answers_logp_and_top2_margin(traj):
    from transformers import AutoModelForCausalLM

    from datamodules.trajectory_datamodule import TrajectoryDataModule
    from sift.trajectories import cache as C

    root, models = traj
    dm = TrajectoryDataModule(root / "traj")
    dm.setup()
    i_lp, i_m = dm.feature_names.index("conf/answer_logp"), dm.feature_names.index("conf/answer_margin")
    assert dm.feature_groups["confidence"] == [i_lp, i_m]
    recs = {r["trace_id"]: r for r in C.iter_records(root / "corpus" / "traces.jsonl")}
    model = AutoModelForCausalLM.from_pretrained(models["gpt2"]).eval()
    checked = 0
    for e in dm.dataset("train").examples:
        r = recs[e.trace_id]
        a = answer_index(r)
        if r["family"] != "gpt2" or a is None:
            continue
        ids = list(r["prompt_ids"]) + list(r["generated_ids"])
        with torch.no_grad():
            lp = model(input_ids=torch.tensor([ids])).logits[0, len(r["prompt_ids"]) + a - 1].log_softmax(-1)
        top = lp.topk(2).values
        assert float(e.features[i_lp]) == pytest.approx(float(lp[r["generated_ids"][a]]), abs=1e-4)
        assert float(e.features[i_m]) == pytest.approx(float(top[0] - top[1]), abs=1e-4)
        checked += 1
        if checked == 10:
            break
    assert checked == 10


def test_output_confidence_control_reads_only_its_features(traj, trajectory_cfg, tmp_path):
    from datamodules.trajectory_datamodule import TrajectoryDataModule
    from sift.detectors.module import load_detector
    from sift.detectors.registry import is_control
    from sift.training import train

    root, _ = traj
    rec = train(trajectory_cfg(root, "output_confidence", tmp_path, "trainer.max_epochs=2"))
    assert rec["status"] == "done" and np.isfinite(rec["metrics"]["test/auroc"])
    assert is_control("output_confidence")
    det = load_detector(rec["best_ckpt"]).eval()
    dm = TrajectoryDataModule(root / "traj")
    dm.setup()
    b = next(iter(dm.test_dataloader()))
    keep = torch.zeros(b.features.shape[1], dtype=torch.bool)
    keep[dm.feature_groups["confidence"]] = True
    blind = dataclasses.replace(b, x=torch.zeros_like(b.x), pooled=torch.zeros_like(b.pooled), states=None,
                                features=torch.where(keep, b.features, torch.zeros_like(b.features)))
    with torch.no_grad():
        torch.testing.assert_close(det(blind), det(b))
        moved = dataclasses.replace(b, features=b.features + keep * 1.0)
        assert not torch.allclose(det(moved), det(b))
