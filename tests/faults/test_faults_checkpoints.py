"""Issue 13, untrusted files: a crafted checkpoint that runs code when unpickled is refused by every command
that accepts one (the payload never runs); garbage and remote checkpoints end in one clear line; last.ckpt
is every epoch's, and a killed run resumes to exactly the uninterrupted result."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sift.errors import SiftError

REPO = Path(__file__).resolve().parents[2]
SMALL_SIFT = ["detector.net.d_model=32", "detector.net.filters=16", "detector.net.n_layers=1",
              "detector.net.n_heads=4", "detector.net.dim_feedforward=64", "detector.net.mlp_hidden=32",
              "detector.objective.dann_hidden=32"]


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: the file appears iff the checkpoint's code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def evil(tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "pytorch-lightning_version": "2.6.6",
                "sift_detector": {"class": "sift.detectors.sift_model.SIFTDetector", "name": "sift", "threshold": 0.5},
                "sift_ensemble": {"members": [], "name": "e", "threshold": 0.5, "threshold_method": "youden"},
                "payload": _Payload(marker)}, str(path))
    assert not marker.exists()
    return path, marker


def test_crafted_checkpoint_is_refused_by_load_detector(evil):
    from sift.detectors import load_detector

    path, marker = evil
    with pytest.raises(SiftError, match=f"{path}: refused: the detector checkpoint holds Python objects"):
        load_detector(str(path))
    assert not marker.exists()


def test_crafted_ensemble_file_is_refused(evil):
    from sift.detectors import EnsembleDetector

    path, marker = evil
    with pytest.raises(SiftError, match="refused"):
        EnsembleDetector.load(path)
    assert not marker.exists()


def test_crafted_checkpoint_is_refused_by_sift_evaluate_resolution(evil):
    from sift.evaluation.run import resolve_detectors

    path, marker = evil
    with pytest.raises(SiftError, match="refused"):
        resolve_detectors([str(path)])
    assert not marker.exists()


def test_crafted_checkpoint_is_refused_as_sift_train_ckpt_path(evil, compose_train):
    from sift.training import train

    path, marker = evil
    with pytest.raises(SiftError, match="refused"):
        train(compose_train("detector=hidden_probe", f"ckpt_path={path}", "trainer.max_epochs=1"))
    assert not marker.exists()


@pytest.mark.parametrize("cmd", [
    ["sift.cli.evaluate", "data=synthetic", "data.generator.n_items=40", "detectors=[{ckpt}]"],
    ["sift.cli.train", "data=synthetic", "data.generator.n_items=40", "logger=none", "detector=hidden_probe",
     "ckpt_path={ckpt}", "trainer.max_epochs=1"],
])
def test_crafted_checkpoint_is_refused_by_the_commands(evil, tmp_path, cmd):
    path, marker = evil
    mod, *ov = cmd
    out = tmp_path / "out"
    ov = [o.replace("{ckpt}", str(path)) for o in ov] + [f"paths.output_dir={out}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "SIFT_NO_GIT": "1"}
    r = subprocess.run([sys.executable, "-m", mod, *ov], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "refused" in last and str(path) in last and "Traceback" not in r.stderr
    assert not marker.exists()


def test_garbage_checkpoint_is_one_clear_line(tmp_path):
    from sift.detectors import load_detector

    bad = tmp_path / "garbage.ckpt"
    bad.write_bytes(b"this is not a checkpoint at all" * 10)
    with pytest.raises(SiftError, match=f"{bad}: not a readable detector checkpoint"):
        load_detector(str(bad))


def test_remote_checkpoints_are_refused_unless_opted_in(compose_train):
    from sift.evaluation.run import resolve_detectors
    from sift.training import validate_train_config

    url = "http://127.0.0.1:9/model.ckpt"
    with pytest.raises(SiftError, match="is a remote location; sift loads only local files"):
        validate_train_config(compose_train(f"ckpt_path={url}"))
    validate_train_config(compose_train(f"ckpt_path={url}", "allow_remote_ckpt=true"))  # the user opted in
    with pytest.raises(SiftError, match="is a remote location"):
        resolve_detectors(["https://example.org/det.ckpt"])


# ------------------------------------------------------------------------------------ 3: last.ckpt
def test_last_ckpt_is_written_every_epoch_without_a_new_best(compose_train, tmp_path, monkeypatch):
    """Lightning writes last.ckpt only with a new best; ours follows every epoch."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    from sift.training import train

    real = ModelCheckpoint.check_monitor_top_k
    monkeypatch.setattr(ModelCheckpoint, "check_monitor_top_k",
                        lambda self, trainer, current=None: trainer.current_epoch == 0 and real(self, trainer, current))
    rec = train(compose_train("detector=sift", *SMALL_SIFT, "trainer.max_epochs=3"))
    last = torch.load(rec["last_ckpt"], weights_only=True)
    best = torch.load(rec["best_ckpt"], weights_only=True)
    assert best["epoch"] == 0 and last["epoch"] == 2 and last["global_step"] == rec["global_step"]
    assert not list(Path(rec["last_ckpt"]).parent.glob("*.tmp*"))  # written atomically, nothing left over


def test_killed_run_resumes_to_exactly_the_uninterrupted_result(compose_train, tmp_path, monkeypatch):
    from sift.detectors import SIFTDetector, load_detector
    from sift.training import train

    def preds(rec):
        from datamodules.synthetic_datamodule import SyntheticDataModule

        c = rec["config"]["data"]
        dm = SyntheticDataModule(**{k: v for k, v in c.items() if k not in ("_target_", "cache_dir")})
        dm.setup()
        return load_detector(rec["last_ckpt"]).predict_loader(dm.test_dataloader())["prob"]

    ov = ["detector=sift", *SMALL_SIFT, "trainer.max_epochs=4", "monitor=val/loss", "monitor_mode=min"]
    clean = train(compose_train(*ov, out=str(tmp_path / "clean")))

    class Killed(Exception):
        pass

    def crash(self):
        if self.current_epoch == 2:
            raise Killed()

    monkeypatch.setattr(SIFTDetector, "on_train_epoch_start", crash)
    with pytest.raises(Killed):
        train(compose_train(*ov, out=str(tmp_path / "killed")))
    monkeypatch.undo()
    resumed = train(compose_train(*ov, out=str(tmp_path / "killed")))
    assert resumed["epochs"] == clean["epochs"] and resumed["global_step"] == clean["global_step"]
    assert torch.equal(preds(resumed), preds(clean))
    assert resumed["metrics"] == clean["metrics"]


def test_training_order_depends_on_seed_and_epoch_only_and_never_draws_global_rng():
    """The two halves of the exact-resume fix: a fresh loader at epoch N yields the same order as one that has
    already run epochs 0..N-1, and creating or iterating a loader leaves the global torch RNG untouched."""
    from datamodules.batch import EpochShuffleSampler
    from datamodules.synthetic_datamodule import SyntheticDataModule

    class Clock:
        current_epoch = 0

    def order(dm):
        return [b.trace_id for batches in dm.train_dataloader() for b in batches]

    torch.manual_seed(3)
    long_run = SyntheticDataModule(generator=dict(n_items=60, t_max=20))
    long_run.trainer = Clock()
    seen = []
    for epoch in range(3):
        long_run.trainer.current_epoch = epoch
        before = torch.get_rng_state()
        seen.append(order(long_run))
        assert torch.equal(torch.get_rng_state(), before)  # no draw from the global RNG
    assert seen[0] != seen[1] != seen[2]
    torch.manual_seed(3)
    resumed = SyntheticDataModule(generator=dict(n_items=60, t_max=20))
    resumed.trainer = Clock()
    resumed.trainer.current_epoch = 2
    assert order(resumed) == seen[2]
    assert list(EpochShuffleSampler(50, 7, lambda: 4)) == list(EpochShuffleSampler(50, 7, lambda: 4))
    assert list(EpochShuffleSampler(50, 7, lambda: 4)) != list(EpochShuffleSampler(50, 8, lambda: 4))
