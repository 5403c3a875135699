"""Issue 13, evaluation: a report interrupted half-way resumes (finished appendix sections are reused, with
identical numbers), and an up-to-date report is not recomputed; W&B offline makes no network call."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from sift.report import Section

REPO = Path(__file__).resolve().parents[2]


def test_interrupted_appendix_resumes_from_finished_sections(tmp_path, monkeypatch):
    from sift.evaluation import appendix
    from sift.evaluation.faithshift_report import appendix_sections

    names = [a.name for a in appendix.APPENDIX_ANALYSES]
    calls: list[str] = []

    def fake(inputs, names, common, options):
        calls.append(names[0])
        if len(calls) == 3 and fail["on"]:
            raise KeyboardInterrupt  # the job is killed during the third section
        return [Section(f"appendix_{names[0]}", names[0], "text",
                        results={"x": np.float64(1 / 3), "n": np.int64(7), "f": np.float32(0.1), "nan": float("nan")})]

    monkeypatch.setattr(appendix, "run_appendix", fake)
    cfg = OmegaConf.create({"workers": 1, "appendix_resamples": 10, "bootstrap_resamples": 10, "seed": 0,
                            "sgr": {"alpha": 0.25, "delta": 0.05}})
    fail = {"on": True}
    with pytest.raises(KeyboardInterrupt):
        appendix_sections(cfg, {}, tmp_path / "sections", "key1")
    assert calls == names[:3]
    fail["on"] = False
    calls.clear()
    first = appendix_sections(cfg, {}, tmp_path / "sections", "key1")
    assert calls == names[2:]  # the two finished sections were reused
    calls.clear()
    again = appendix_sections(cfg, {}, tmp_path / "sections", "key1")
    assert calls == []
    dump = lambda secs: json.dumps([s.results for s in secs], default=str)  # noqa: E731 (as results.json)
    assert dump(again) == dump(first)
    appendix_sections(cfg, {}, tmp_path / "sections", "key2")  # other inputs: computed afresh
    assert calls == names


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_wandb_offline_makes_no_dns_lookup(tmp_path):
    script = f"""
import os
os.environ.pop("WANDB_API_KEY", None)
os.environ.pop("WANDB_ERROR_REPORTING", None)
os.environ["WANDB_MODE"] = "offline"
from omegaconf import OmegaConf
from sift.training import build_loggers
cfg = OmegaConf.create({{"logger": {{"wandb": {{"_target_": "pytorch_lightning.loggers.WandbLogger",
    "project": "sift", "save_dir": {str(tmp_path)!r}, "offline": True, "name": "t"}}}}}})
lg = build_loggers(cfg)[0]
lg.experiment.log({{"a": 1}})
import wandb
wandb.finish()
"""
    trace = tmp_path / "trace"
    r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), sys.executable, "-c", script],
                       capture_output=True, text=True, cwd=REPO, timeout=600,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")},
                            "HOME": str(tmp_path), "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    dns = [line for line in trace.read_text().splitlines() if "htons(53)" in line]
    assert dns == []
