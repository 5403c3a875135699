"""The output-confidence control (issue 43): log P(answer) and the top-2 margin at the position predicting the answer,
recomputed by hand from the source model's logits, reach the control's features and nothing else does."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sift.trajectories.extract import ExtractConfig, answer_index
from sift.trajectories.predict import extract_corpus
from sift.trajectories.toy import save_toy_models, write_toy_corpus


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    root = tmp_path_factory.mktemp("confidence")
    write_toy_corpus(root / "corpus", n_items=24)
    models = save_toy_models(root / "models")
    extract_corpus(root / "corpus", root / "traj", models, ExtractConfig(shard_size=64, batch_size=32, t_max=12))
    return root, models


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


def test_output_confidence_control_reads_only_its_features(traj, tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from datamodules.trajectory_datamodule import TrajectoryDataModule
    from sift.cli._common import CONFIG_DIR
    from sift.detectors.module import load_detector
    from sift.detectors.registry import is_control
    from sift.training import train

    root, _ = traj
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["detector=output_confidence", "data=trajectory",
                                          f"data.trajectory_dir={root / 'traj'}", f"paths.output_dir={tmp_path}",
                                          "logger=none", "trainer.max_epochs=2", "trainer.enable_progress_bar=false"])
    GlobalHydra.instance().clear()
    rec = train(cfg)
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
