"""``sift-extract`` under DDP (2 CPU processes, gloo): the union of the shards equals the single-process result."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sift.trajectories import cache as C
from sift.trajectories.toy import save_toy_models, write_toy_corpus

ROOT = Path(__file__).resolve().parents[2]


def _cli(corpus, out, models, *extra):
    cmd = [sys.executable, "-m", "sift.cli.extract", f"corpus_dir={corpus}", f"output_dir={out}", "progress=false",
           f"models.gpt2={models['gpt2']}", f"models.llama={models['llama']}", "extraction.shard_size=7",
           "extraction.batch_size=8", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.mark.slow
def test_ddp_two_processes_union_equals_single_process(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus", n_items=4)
    models = save_toy_models(tmp_path / "models")
    _cli(corpus, tmp_path / "single", models)
    res = _cli(corpus, tmp_path / "ddp", models, "trainer.devices=2", "trainer.strategy=ddp", "trainer.accelerator=cpu")
    assert "Starting with 2 processes" in res.stdout + res.stderr
    single = sorted(p.relative_to(tmp_path / "single") for p in (tmp_path / "single").glob("shards/*/*.safetensors"))
    ddp = sorted(p.relative_to(tmp_path / "ddp") for p in (tmp_path / "ddp").glob("shards/*/*.safetensors"))
    assert single == ddp and len(single) >= 4
    for rel in single:
        a, ma = C.read_shard(tmp_path / "single" / rel)
        b, mb = C.read_shard(tmp_path / "ddp" / rel)
        assert ma == mb
        for k in C.SHARD_TENSORS:
            assert torch.allclose(a[k].float(), b[k].float(), atol=1e-6, equal_nan=True), (rel, k)
    ms, md = C.read_manifest(tmp_path / "single"), C.read_manifest(tmp_path / "ddp")
    assert ms["models"] == md["models"]
    assert 0 < md["shards"]["computed_by_rank0"] < md["shards"]["total"]  # rank 0 did only its part
