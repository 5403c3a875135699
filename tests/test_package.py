"""The package installs like one: configs and organism weights are package data (importlib.resources), the
wheel holds them, and ``--config-dir`` overrides the packaged configs."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import sift
from sift.resources import config_dir, organism_checkpoints

ROOT = Path(__file__).resolve().parents[1]


def test_resources_resolve_inside_the_installed_package():
    pkg = Path(sift.__file__).resolve().parent
    assert config_dir() == pkg / "configs" and organism_checkpoints() == pkg / "weights" / "organism"
    for f in ("corpus.yaml", "extract.yaml", "train.yaml", "evaluate.yaml", "faithshift.yaml", "preset/quick.yaml",
              "executor/local.yaml", "executor/slurm.yaml", "wandb_sweep/seeds.yaml"):
        assert (config_dir() / f).is_file(), f
    for fam in ("gpt2", "llama"):
        assert (organism_checkpoints() / fam / "model.safetensors").stat().st_size > 100_000


def test_extract_config_points_at_the_packaged_weights_from_any_directory(tmp_path, monkeypatch):
    from sift.config import compose

    monkeypatch.chdir(tmp_path)
    c = compose("extract", ["corpus_dir=x", "output_dir=y"])
    assert c.models.gpt2 == str(organism_checkpoints() / "gpt2")
    assert c.models.llama == str(organism_checkpoints() / "llama")


def test_config_dir_overrides_the_packaged_configs(tmp_path):
    (tmp_path / "detector").mkdir()
    text = (config_dir() / "detector" / "sift.yaml").read_text()
    (tmp_path / "detector" / "sift.yaml").write_text(text.replace("\n  lr: 1.0e-3", "\n  lr: 0.000123"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    env.pop("SIFT_CONFIG_DIR", None)

    def lr(*args):
        out = subprocess.run([sys.executable, "-m", "sift.cli.train", *args, "detector=sift", "--cfg", "job"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return [ln.split(":")[1].strip() for ln in out.stdout.splitlines() if ln.startswith("    lr:")]

    assert lr("--config-dir", str(tmp_path)) == ["0.000123"]
    assert lr() == ["0.001"]
    bad = subprocess.run([sys.executable, "-m", "sift.cli.train", "--config-dir", str(tmp_path / "nope")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and f"--config-dir {tmp_path / 'nope'}: no such folder" in bad.stderr


def test_wheel_holds_every_config_and_the_weights(tmp_path):
    st = pytest.importorskip("setuptools")
    if int(st.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {st.__version__} < 77 cannot build this project (.ci/run installs a newer one)")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (whl,) = tmp_path.glob("sift-*.whl")
    with zipfile.ZipFile(whl) as z:
        infos = {i.filename: i.file_size for i in z.infolist()}
    configs = {f"sift/configs/{p.relative_to(config_dir()).as_posix()}" for p in config_dir().rglob("*.yaml")}
    assert configs and configs <= set(infos)
    weights = {k: v for k, v in infos.items() if k.startswith("sift/weights/organism/")}
    for fam in ("gpt2", "llama"):
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            assert f"sift/weights/organism/{fam}/{f}" in weights
            assert f"sift/weights/organism/cot_routing/{fam}/{f}" in weights  # the cot_routing kind's own weights
        assert f"sift/weights/organism/cot_routing/{fam}/mechanism_adapter.safetensors" in weights
    assert sum(weights.values()) <= 20 * 2**20  # the shipped checkpoints stay ≤ 20 MB
    assert "hydra_plugins/sift_config_dir/__init__.py" in infos
