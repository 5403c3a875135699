"""scripts/gpu_check.sh dry-run on the CPU (slow; needs a real model, as test_real_small_slow.py finds one): the
reduced real_paper job with transformers generation, then the corpus stage again, and the backend table."""

import os
import re
import subprocess
from pathlib import Path

import pytest
from test_real_small_slow import local_models

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_dry_runs_on_the_cpu(tmp_path):
    models = local_models()
    if not models:
        pytest.skip("no real model here: set SIFT_REAL_MODELS=/path/model (a folder, .gguf file or cached hub name)")
    env = {**os.environ, "MODEL_A": models[0], "DEVICE": "cpu", "GEN_BACKENDS": "hf hf", "N_ITEMS": "12",
           "OUT": str(tmp_path / "check"), "MGSM": os.environ.get("SIFT_MGSM", ""),
           # a small job that still has every stage: three conditions, every label test, a forced answer labelled
           # like any other, and real_small's cue mixture (mostly wrong cues: a 0.5B model's φ*=0 traces are the
           # cues it follows; with real_paper's mixture 8 items gave φ*=1 only, and training refuses one class)
           "EXTRA": "source.max_new_tokens=160 source.chunk_items=16 source.batch_size=16 seeds=[0] "
                    "conditions=[base,paraphrase,cue_injection] source.label_forced=true source.cue.p_cue=0.9 "
                    "source.cue.p_cue_correct=0.1 "
                    "source.cue_formats=[hint,professor,curious,metadata,unauthorized,fewshot] "
                    "detectors=[hidden_probe] controls=[text_bow] transfer.detectors=[] max_epochs=3 "
                    "bootstrap.resamples=20 bootstrap.appendix_resamples=10 instance_ensemble=[]"}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                         timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [ln.split() for ln in res.stdout.splitlines() if re.match(r"hf\s+cpu\s+\d+", ln)]
    assert len(rows) == 2 and all(float(r[5]) > 0 for r in rows)  # tokens/s of the job's corpus and the rerun's
    assert int(rows[0][2]) == int(rows[1][2])  # greedy: the same generated tokens both times
    assert (tmp_path / "check" / "job-hf" / "report").is_dir() and (tmp_path / "check" / "corpus-1-hf").is_dir()
