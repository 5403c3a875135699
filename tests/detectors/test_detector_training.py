"""train(cfg) end to end on synthetic data: learning, determinism, resume, thresholds, ensembles, results."""

import json

import pytest
import pytorch_lightning as pl
import torch

from sift.detectors import EnsembleDetector, SIFTDetector, fit_threshold, load_detector
from sift.training import git_state, hparams_hash, run_hash, train

#: a small SIFT (same architecture, narrower) for fast tests
SMALL_SIFT = ["detector.net.d_model=32", "detector.net.filters=16", "detector.net.n_layers=1",
              "detector.net.n_heads=4", "detector.net.dim_feedforward=64", "detector.net.mlp_hidden=32",
              "detector.objective.dann_hidden=32"]


def _preds(rec, dm_loader="test"):
    from datamodules.synthetic_datamodule import SyntheticDataModule

    m = load_detector(rec["best_ckpt"])
    c = rec["config"]["data"]
    dm = SyntheticDataModule(**{k: v for k, v in c.items() if k != "_target_"})
    dm.setup()
    return m, dm, m.predict_loader(getattr(dm, f"{dm_loader}_dataloader")())


def test_sift_learns_synthetic_and_freezes_threshold(compose_train, tmp_path):
    cfg = compose_train("detector=sift", *SMALL_SIFT, "trainer.max_epochs=6", "data.generator.n_items=300")
    rec = train(cfg)
    assert rec["status"] == "done" and rec["kind"] == "single" and rec["seed"] == 0
    assert rec["metrics"]["test/auroc"] >= 0.9
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config_hash"] == hparams_hash(cfg) and saved["run_hash"] == run_hash(cfg)
    assert saved["sift_version"] and "commit" in saved["git"]
    # the threshold was frozen on validation and travels in the checkpoint
    m, dm, val = _preds(rec, "val")
    assert float(m.threshold) == pytest.approx(rec["threshold"])
    assert float(m.threshold) == pytest.approx(fit_threshold(val["prob"].numpy(), val["label"].numpy()), abs=1e-6)
    ck = torch.load(rec["best_ckpt"], weights_only=False)
    assert ck["sift_detector"]["threshold"] == pytest.approx(rec["threshold"])
    # validating on shifted data afterwards never retunes it
    pl.Trainer(logger=False, enable_progress_bar=False).validate(m, dataloaders=dm.transfer_dataloader(), verbose=False)
    assert float(m.threshold) == pytest.approx(rec["threshold"])
    out = m.predict_loader(dm.test_dataloader())
    torch.testing.assert_close(out["rho"], torch.maximum(out["prob"], 1 - out["prob"]))


def test_same_seed_same_predictions(compose_train, tmp_path):
    recs = [train(compose_train("detector=sift", *SMALL_SIFT, "trainer.max_epochs=2", f"seed={s}",
                                out=str(tmp_path / f"r{i}"))) for i, s in enumerate([0, 0, 1])]
    p = [_preds(r)[2]["prob"] for r in recs]
    assert torch.equal(p[0], p[1])
    assert not torch.allclose(p[0], p[2])
    assert recs[0]["config_hash"] == recs[2]["config_hash"] and recs[0]["run_hash"] != recs[2]["run_hash"]


def test_resume_continues_epochs_and_optimizer(compose_train, tmp_path, monkeypatch):
    out = str(tmp_path / "resume")
    rec1 = train(compose_train("detector=sift", *SMALL_SIFT, "trainer.max_epochs=2", out=out))
    last = torch.load(rec1["last_ckpt"], weights_only=False)
    spe = rec1["global_step"] // 2
    adam_steps = [s["step"] for s in last["optimizer_states"][0]["state"].values()]
    assert rec1["epochs"] == 2 and all(int(s) == 2 * spe for s in adam_steps)

    seen: dict = {"epochs": []}

    def on_train_start(self):
        opt = self.trainer.optimizers[0]
        seen["start"] = (self.current_epoch, self.global_step, int(next(iter(opt.state.values()))["step"]))
        seen["weights"] = {k: v.clone() for k, v in self.state_dict().items()}

    monkeypatch.setattr(SIFTDetector, "on_train_start", on_train_start)
    monkeypatch.setattr(SIFTDetector, "on_train_epoch_start", lambda self: seen["epochs"].append(self.current_epoch))
    rec2 = train(compose_train("detector=sift", *SMALL_SIFT, "trainer.max_epochs=3", out=out))
    assert seen["start"] == (2, 2 * spe, 2 * spe)  # epoch counter, global step and Adam state continue
    assert seen["epochs"] == [2]  # only the missing epoch was trained
    for k, v in last["state_dict"].items():
        torch.testing.assert_close(seen["weights"][k], v)
    assert rec2["global_step"] == 3 * spe and rec2["epochs"] == 3


def test_finished_run_is_skipped(compose_train, tmp_path, capsys):
    cfg = compose_train("detector=hidden_probe")
    rec = train(cfg)
    assert train(cfg)["time_s"] == rec["time_s"]
    assert "skipping" in capsys.readouterr().out


def test_instance_level_ensemble(compose_train, tmp_path):
    from sift.training import load_results

    cfg = compose_train("detector=instance_level", "ensemble.n_members=2", "trainer.max_epochs=3", "seed=1")
    rec = train(cfg)
    assert rec["kind"] == "ensemble" and rec["member_seeds"] == [2, 3]
    assert [load_results(tmp_path / "run" / f"member_{i}")["seed"] for i in range(2)] == [2, 3]
    ens = EnsembleDetector.load(rec["ensemble_file"])
    from datamodules.synthetic_datamodule import SyntheticDataModule

    dm = SyntheticDataModule(**{k: v for k, v in rec["config"]["data"].items() if k != "_target_"})
    dm.setup()
    b = next(iter(dm.test_dataloader()))
    members = [load_detector(p).eval() for p in rec["members"]]
    with torch.no_grad():
        torch.testing.assert_close(ens.probs(b), torch.stack([m(b) for m in members]).mean(0))
    val = ens.predict_loader(dm.val_dataloader())
    assert float(ens.threshold) == pytest.approx(fit_threshold(val["prob"].numpy(), val["label"].numpy()))
    assert rec["metrics"]["test/auroc"] > 0.6
    # the run spec of the ensemble (run folder or ensemble file) names the members' detector: its role, not its name
    from sift.evaluation.run import resolve_detectors

    for entry in (str(tmp_path / "run"), rec["ensemble_file"]):
        (spec,) = resolve_detectors([entry])
        assert spec.kind == "ensemble" and spec.meta["ensemble_of"] == "instance_level"


def test_git_state_reads_commit_without_git(tmp_path, monkeypatch):
    monkeypatch.setenv("SIFT_NO_GIT", "1")
    g = tmp_path / "repo" / ".git"
    (g / "refs" / "heads").mkdir(parents=True)
    (g / "HEAD").write_text("ref: refs/heads/main\n")
    (g / "refs" / "heads" / "main").write_text("a" * 40 + "\n")
    (tmp_path / "repo" / "pkg").mkdir()
    assert git_state(tmp_path / "repo" / "pkg") == {"commit": "a" * 40, "dirty": None, "branch": "main"}
    (g / "refs" / "heads" / "main").unlink()
    (g / "packed-refs").write_text("# pack-refs\n" + "b" * 40 + " refs/heads/main\n")
    assert git_state(tmp_path / "repo")["commit"] == "b" * 40
