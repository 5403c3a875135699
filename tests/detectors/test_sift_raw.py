"""``sift_raw`` (paper Appendix Q): SIFT's network over the per-step final-layer states, trained through sift-train;
the states are the shards' binned final-layer states, it reads them and nothing else, and its checkpoint reloads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

SMALL = ["detector.net.filters=8", "detector.net.d_model=16", "detector.net.n_layers=1", "detector.net.n_heads=2",
         "detector.net.dim_feedforward=32", "detector.net.mlp_hidden=16", "detector.projection.dim=8",
         "detector.objective.dann_hidden=16", "detector.early_stopping.min_steps=0"]


@pytest.fixture(scope="module")
def traj(toy_trajectories):
    return toy_trajectories[0]


def test_batches_carry_each_steps_final_layer_state(traj):
    from datamodules.trajectory_datamodule import TrajectoryDataModule
    from sift.trajectories import cache as C

    dm = TrajectoryDataModule(traj / "traj")
    dm.setup()
    man = C.read_manifest(traj / "traj")
    t, meta = C.read_shard(traj / "traj" / man["models"]["gpt2"]["shards"][0])
    off = t["bin_offsets"].tolist()
    row = {tid: i for i, tid in enumerate(meta["trace_ids"])}
    examples = [e for e in dm.dataset("train").examples if e.trace_id in row]
    assert examples
    for e in examples[:20]:
        i = row[e.trace_id]
        assert e.states.shape == (e.x.shape[0], dm.pooled_dim)  # one state per descriptor step
        torch.testing.assert_close(e.states, t["final"][off[i]:off[i + 1]].float())
        # the pooled state is the token mean; the binned states average to it when every bin holds one token
        if int(t["n_tokens"][i]) == e.x.shape[0]:
            torch.testing.assert_close(e.states.mean(0), e.pooled, atol=1e-5, rtol=1e-4)
    from datamodules.batch import collate

    e0, e1 = examples[0], examples[1]
    short = dataclasses.replace(e1, x=e1.x[:3], states=e1.states[:3])
    b = collate([e0, short])
    assert b.states.shape[:2] == b.x.shape[:2] and int(b.mask[1].sum()) == 3
    torch.testing.assert_close(b.states[1, :3], e1.states[:3])
    assert float(b.states[1, 3:].abs().max()) == 0.0  # padding is zero


def test_sift_raw_trains_reads_only_the_states_and_reloads(traj, trajectory_cfg, tmp_path):
    from datamodules.trajectory_datamodule import TrajectoryDataModule
    from sift.detectors.module import load_detector
    from sift.training import train

    rec = train(trajectory_cfg(traj, "sift_raw", tmp_path / "run", *SMALL))
    assert rec["status"] == "done" and rec["detector"] == "sift_raw" and rec["global_step"] > 0
    assert 0.0 < rec["threshold"] < 1.0 and np.isfinite(rec["metrics"]["test/auroc"])
    det = load_detector(rec["best_ckpt"]).eval()
    dm = TrajectoryDataModule(traj / "traj")
    dm.setup()
    b = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        p = det(b)
        blind = dataclasses.replace(b, x=torch.zeros_like(b.x), pooled=torch.zeros_like(b.pooled),
                                    features=torch.zeros_like(b.features), token_ids=None, token_segment=None)
        torch.testing.assert_close(det(blind), p)  # descriptors, pooled states, features, tokens: not read
        moved = dataclasses.replace(b, states=b.states + torch.randn_like(b.states) * b.mask[..., None])
        assert not torch.allclose(det(moved), p)
    again = load_detector(rec["best_ckpt"]).predict_loader(dm.test_dataloader())["prob"]
    torch.testing.assert_close(det.predict_loader(dm.test_dataloader())["prob"], again)
