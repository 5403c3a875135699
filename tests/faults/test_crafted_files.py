"""Issue 46: no file sift reads runs code. Every loader meets a crafted file whose payload, if anything unpickled it,
would create a marker: each refuses in one line naming the file, and the marker never appears.

Loaders: every detector and control kind (``load_detector``), a control's estimator entry (``load_detector``,
``ckpt_path=``, automatic resume from ``last.ckpt``, the ``sift-train`` command), the estimator's skops bytes,
trajectory shards, prediction and pair files, corpus files. The source scan (``scripts/scan_unsafe_loaders.py``)
keeps new loaders from reading files unsafely.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from sift.errors import SiftError

REPO = Path(__file__).resolve().parents[2]


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: the file appears iff the file's code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg.strip(), msg
    return msg


# ------------------------------------------------------------------------------- a trained control to tamper with
@pytest.fixture(scope="module")
def traj(toy_trajectories):
    return toy_trajectories[0]


@pytest.fixture(scope="module")
def controls(traj, trajectory_cfg, tmp_path_factory):
    """A trained text_bow and surface run each: {name: (results record, run folder)}."""
    from sift.training import train

    out = {}
    for name in ("text_bow", "surface"):
        run = tmp_path_factory.mktemp(name)
        out[name] = (train(trajectory_cfg(traj, name, run)), run)
    return out


def _tamper(src: str | Path, dst: Path, **entries) -> Path:
    """Copy a checkpoint with its estimator entry replaced by ``entries``."""
    ckpt = torch.load(str(src), weights_only=True)
    ckpt.pop("sift_estimator_skops", None)
    ckpt.update(entries)
    torch.save(ckpt, str(dst))
    return dst


@pytest.fixture
def crafted_text_bow(controls, tmp_path):
    """The text_bow checkpoint with its estimator blob replaced by a pickled payload (where the earlier format kept a
    pickled estimator)."""
    marker = tmp_path / "PWNED"
    path = _tamper(controls["text_bow"][0]["best_ckpt"], tmp_path / "crafted.ckpt",
                   sklearn_estimator=pickle.dumps(_Payload(marker)))
    return path, marker


def test_the_control_checkpoint_holds_no_pickle_and_reloads_to_the_same_predictions(traj, controls):
    from datamodules.trajectory_datamodule import TrajectoryDataModule
    from sift.checkpoints import is_pickle_blob
    from sift.detectors import load_detector

    dm = TrajectoryDataModule(traj / "traj")
    dm.setup()
    for name, (rec, _) in controls.items():
        ckpt = torch.load(rec["best_ckpt"], weights_only=True)
        assert "sklearn_estimator" not in ckpt and not any(is_pickle_blob(v) for v in ckpt.values())
        state = ckpt["sift_estimator_skops"]
        assert state.dtype == torch.uint8 and bytes(state[:2].tolist()) == b"PK"  # a skops zip
        det = load_detector(rec["best_ckpt"])
        assert type(det.estimator).__name__ == ("Pipeline" if name == "text_bow" else "HistGradientBoostingClassifier")
        p = det.predict_loader(dm.val_dataloader())["prob"].numpy()
        fresh = det.make_estimator()  # the stored estimator is the fitted one: its own predictions, not a refit's
        assert np.isfinite(p).all() and p.std() > 0 and fresh is not det.estimator


def test_crafted_control_checkpoint_is_refused_by_load_detector(crafted_text_bow):
    from sift.detectors import load_detector

    path, marker = crafted_text_bow
    with pytest.raises(SiftError) as e:
        load_detector(str(path))
    msg = _one_line(e.value)
    assert msg.startswith(f"{path}: refused: its scikit-learn estimator is stored as pickle bytes")
    assert "sift-train detector=text_bow" in msg  # how to retrain
    assert not marker.exists()


def test_crafted_control_checkpoint_is_refused_as_ckpt_path(crafted_text_bow, traj, trajectory_cfg, tmp_path):
    from sift.training import train

    path, marker = crafted_text_bow
    with pytest.raises(SiftError, match=f"{path}: refused: its scikit-learn estimator") as e:
        train(trajectory_cfg(traj, "text_bow", tmp_path / "run", f"ckpt_path={path}"))
    _one_line(e.value)
    assert not marker.exists()


def test_crafted_last_ckpt_is_refused_by_automatic_resume(crafted_text_bow, traj, trajectory_cfg, tmp_path):
    from sift.training import train

    path, marker = crafted_text_bow
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(path.read_bytes())
    with pytest.raises(SiftError, match=f"{last}: refused: its scikit-learn estimator") as e:
        train(trajectory_cfg(traj, "text_bow", run))
    _one_line(e.value)
    assert not marker.exists()


def test_crafted_last_ckpt_is_one_line_from_the_command(crafted_text_bow, traj, tmp_path):
    """``sift-train`` rerun in a run folder whose last.ckpt was replaced: exit 2, one line, no traceback."""
    path, marker = crafted_text_bow
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(path.read_bytes())
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "SIFT_NO_GIT": "1"}
    r = subprocess.run([sys.executable, "-m", "sift.cli.train", "detector=text_bow", "data=trajectory",
                        f"data.trajectory_dir={traj / 'traj'}", f"paths.output_dir={run}", "logger=none"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "refused" in last and "last.ckpt" in last and "Traceback" not in r.stderr
    assert not marker.exists()


def test_a_pickle_blob_under_any_entry_is_refused(controls, tmp_path):
    from sift.detectors import load_detector

    marker = tmp_path / "PWNED"
    path = _tamper(controls["surface"][0]["best_ckpt"], tmp_path / "c.ckpt",
                   sift_estimator_skops=torch.frombuffer(bytearray(pickle.dumps(_Payload(marker))), dtype=torch.uint8))
    with pytest.raises(SiftError, match=f"{path}: refused: entry 'sift_estimator_skops' is stored as pickle bytes"):
        load_detector(str(path))
    assert not marker.exists()


def test_skops_bytes_with_untrusted_types_are_refused(controls, tmp_path):
    """A skops file is data, but a crafted one can name any callable: only the detector's trusted types load."""
    import functools

    import skops.io as sio
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    from sift.detectors import load_detector
    from sift.detectors.estimator_state import dump_estimator

    marker = tmp_path / "PWNED"
    evil = Pipeline([("step", LogisticRegression())])
    evil.crafted_ = functools.partial(os.system, f"touch {marker}")
    path = _tamper(controls["text_bow"][0]["best_ckpt"], tmp_path / "evil.ckpt",
                   sift_estimator_skops=dump_estimator(evil))
    assert "posix.system" in sio.get_untrusted_types(data=sio.dumps(evil))
    with pytest.raises(SiftError, match="refused: the stored estimator holds types sift does not trust") as e:
        load_detector(str(path))
    _one_line(e.value)
    other = _tamper(controls["text_bow"][0]["best_ckpt"], tmp_path / "other.ckpt",
                    sift_estimator_skops=dump_estimator(LogisticRegression()))
    with pytest.raises(SiftError, match="refused: the stored estimator is a sklearn.linear_model"):
        load_detector(str(other))  # a trusted type, but not the control's estimator
    assert not marker.exists()


# ------------------------------------------------------------------------------- every detector kind
def _detector_classes() -> list[str]:
    d = REPO / "sift" / "configs" / "detector"
    return sorted({yaml.safe_load(p.read_text())["_target_"] for p in d.glob("*.yaml")})


@pytest.mark.parametrize("cls", _detector_classes())
def test_crafted_checkpoint_of_every_detector_kind_is_refused(cls, tmp_path):
    from sift.detectors import load_detector

    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "pytorch-lightning_version": "2.6.6",
                "sift_detector": {"class": cls, "name": "x", "threshold": 0.5}, "payload": _Payload(marker)}, str(path))
    with pytest.raises(SiftError, match=f"{path}: refused: the detector checkpoint holds Python objects") as e:
        load_detector(str(path))
    _one_line(e.value)
    assert not marker.exists()


def test_every_detector_kind_is_covered():
    names = {c.rsplit(".", 1)[1] for c in _detector_classes()}
    assert {"SIFTDetector", "TextSIFTDetector", "TextBowDetector", "SurfaceDetector", "LogisticDetector",
            "MLPDetector"} <= names


# ------------------------------------------------------------------------------- data files
def test_crafted_trajectory_shard_is_refused(traj, tmp_path):
    from sift.trajectories import cache as C

    marker = tmp_path / "PWNED"
    shard = tmp_path / "shard-00000.safetensors"
    shard.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(SiftError, match=f"{shard}: truncated or corrupt shard") as e:
        C.read_shard(shard)
    _one_line(e.value)
    assert not marker.exists()


def test_crafted_prediction_and_pair_files_are_refused(tmp_path):
    from sift.evaluation.predictions import Predictions
    from sift.evaluation.run import load_pairs

    marker = tmp_path / "PWNED"
    for name, load, what in (("preds.npz", Predictions.load, "predictions"), ("pairs.npz", load_pairs, "pairs")):
        path = tmp_path / name
        np.savez(path, header=np.array([_Payload(marker)], dtype=object),  # an object array is a pickle
                 trace_id=np.array([_Payload(marker)], dtype=object), a=np.array([_Payload(marker)], dtype=object))
        with pytest.raises(SiftError, match=f"{path}: not a sift {what} file") as e:
            load(path)
        _one_line(e.value)
    assert not marker.exists()


def test_crafted_corpus_files_are_refused(tmp_path):
    from sift.corpus.store import read_jsonl
    from sift.trajectories import cache as C

    marker = tmp_path / "PWNED"
    traces = tmp_path / "traces.jsonl"
    traces.write_bytes(pickle.dumps(_Payload(marker)))
    for read in (read_jsonl, lambda p: list(C.iter_records(p)), C.index_corpus):
        with pytest.raises(SiftError, match=f"{traces}:1: not a JSON") as e:
            read(traces)
        _one_line(e.value)
    assert not marker.exists()


# ------------------------------------------------------------------------------- the scan
def _scanner():
    spec = importlib.util.spec_from_file_location("scan_unsafe_loaders", REPO / "scripts" / "scan_unsafe_loaders.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def test_no_unsafe_loader_in_sift_datamodules_or_scripts():
    n, found = _scanner().scan()
    assert n > 150  # it walked the tree
    assert found == [], "\n".join(map(str, found))


@pytest.mark.parametrize("src, call", [
    ("import pickle\npickle.loads(b)", "pickle.loads"),
    ("import pickle as p\np.load(fh)", "pickle.load"),
    ("from pickle import Unpickler\nUnpickler(fh).load()", "pickle.Unpickler"),
    ("import joblib\njoblib.load(path)", "joblib.load"),
    ("import torch\ntorch.load(path)", "torch.load"),
    ("import torch\ntorch.load(path, weights_only=False)", "torch.load"),
    ("from torch import load\nload(path, map_location='cpu')", "torch.load"),
    ("import numpy as np\nnp.load(path, allow_pickle=True)", "numpy.load"),
    ("import yaml\nyaml.load(text)", "yaml.load"),
    ("import yaml\nyaml.load(text, Loader=yaml.FullLoader)", "yaml.load"),
    ("import yaml\nyaml.unsafe_load(text)", "yaml.unsafe_load"),
    ("eval(open(p).read())", "builtins.eval"),
    ("exec(line)", "builtins.exec"),
    ("import pandas as pd\npd.read_pickle(p)", "pandas.read_pickle"),
])
def test_the_scan_finds_each_unsafe_form(src, call):
    found = _scanner().scan_source(src)
    assert [f.call for f in found] == [call]


@pytest.mark.parametrize("src", [
    "import torch\ntorch.load(path, weights_only=True)",
    "import numpy as np\nnp.load(path, allow_pickle=False)\nnp.load(path)",
    "import yaml\nyaml.safe_load(text)\nyaml.load(text, Loader=yaml.SafeLoader)",
    "import ast\nast.literal_eval(s)",
    "model.eval()\nself.load(x)",
])
def test_the_scan_passes_the_safe_forms(src):
    assert _scanner().scan_source(src) == []
