"""scripts/collect_sweep.py collects results.json files into one table without W&B."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sift.results import aggregate, load_records, rows, to_csv, to_markdown

ROOT = Path(__file__).resolve().parents[2]


def _write(d: Path, det: str, seed: int, auc: float, kind: str = "single") -> None:
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({
        "status": "done", "kind": kind, "detector": det, "data": "synthetic", "seed": seed,
        "config_hash": f"h{det}", "metrics": {"val/auroc": auc, "test/auroc": auc - 0.01}}))


def test_collect_table(tmp_path):
    for det, s, a in [("sift", 0, 0.9), ("sift", 1, 0.8), ("hidden_probe", 0, 0.7)]:
        _write(tmp_path / f"{det}_{s}", det, s, a)
    _write(tmp_path / "sift_0" / "member_0", "sift", 5, 0.1, kind="member")
    recs = load_records(tmp_path)
    assert len(recs) == 3 and len(load_records(tmp_path, include_members=True)) == 4
    t = rows(recs, ["val/auroc", "test/auroc"])
    md = to_markdown(t)
    assert md.count("\n") == 5 and "| sift | synthetic | single | 1 |" in md
    agg = aggregate(t, ["val/auroc"])
    sift = next(r for r in agg if r["detector"] == "sift")
    assert sift["n_seeds"] == 2 and sift["val/auroc"] == "0.850 ± 0.071"
    assert to_csv(t).splitlines()[0].startswith("detector,data,kind,seed")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "collect_sweep.py"), str(tmp_path), "--aggregate"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "0.850 ± 0.071" in r.stdout


@pytest.mark.slow
def test_multirun_two_detectors_two_seeds_offline(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "SIFT_NO_GIT": "1",
           "OMP_NUM_THREADS": "1"}
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "sift.cli.train", "-m", "detector=sift,hidden_probe", "seed=0,1", "data=synthetic",
           "data.generator.n_items=100", "trainer.max_epochs=2", f"hydra.sweep.dir={sweep}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("sift-train: single") == 4
    res = sorted(sweep.glob("*/results.json"))
    assert len(res) == 4
    assert all(list((p.parent / "wandb").glob("offline-run-*")) for p in res)  # W&B ran offline
    assert all((p.parent / "checkpoints" / "last.ckpt").is_file() for p in res)
    t = subprocess.run([sys.executable, str(ROOT / "scripts" / "collect_sweep.py"), str(sweep)],
                       capture_output=True, text=True, timeout=120)
    assert t.returncode == 0 and t.stdout.count("| synthetic | single |") == 4
    print(t.stdout)
