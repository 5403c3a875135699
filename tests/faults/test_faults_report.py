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
    cfg = OmegaConf.create({"workers": 1, "bootstrap": {"resamples": 10, "appendix_resamples": 10, "seed": 0},
                            "sgr": {"alpha": 0.25, "delta": 0.05}, "detectors": ["sift", "instance_level"]})
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


# ------------------------------------------------------------------------------------ W&B offline: no network
#: Runs in a child process: every hostname lookup of the Python process is recorded (and fails, as it would
#: offline); then PAYLOAD; the lookups are written to argv[1]. Under strace, W&B's own service process
#: (wandb-core, a Go binary that does not use Python's socket module) is watched as well.
NET_HARNESS = """
import json, os, socket, sys
lookups = []

def _blocked(name):
    def lookup(*args, **kwargs):
        lookups.append(f"{name}{args[:2]!r}")
        raise socket.gaierror(socket.EAI_NONAME, f"lookup blocked by the test: {name}")
    return lookup

for _name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo", "getfqdn"):
    setattr(socket, _name, _blocked(_name))
try:
{payload}
finally:
    with open(sys.argv[1], "w") as fh:
        json.dump(lookups, fh)
"""

#: a real sift training run logging to W&B offline (one worker-less SIFT-free run: a baseline, two epochs)
TRAIN_WITH_WANDB = """
from hydra import compose, initialize_config_dir
from sift.cli._common import CONFIG_DIR
from sift.training import train
out = sys.argv[2]
with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
    cfg = compose("train", overrides=[f"paths.output_dir={out}", "logger=wandb", "logger.wandb.offline=true",
                                      "data=synthetic", "data.generator.n_items=60", "data.generator.t_max=20",
                                      "detector=hidden_probe", "trainer.max_epochs=2", "provenance.git=false"])
rec = train(cfg)
assert rec["wandb"] and rec["wandb"]["mode"] == "offline", rec["wandb"]
"""

#: the harness must see a lookup when there is one: one in this process, one packet towards port 53 from a child
LOOKUP = """
try:
    socket.getaddrinfo("api.wandb.ai", 443)
except OSError:
    pass
import subprocess
subprocess.run([sys.executable, "-c", "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                "s.connect(('127.0.0.1', 53)); s.close()"], check=True)
"""


def _network_calls(tmp_path: Path, payload: str) -> tuple[list[str], list[str]]:
    """(hostname lookups of the Python process, ``connect`` calls to a network address by any process)."""
    script = tmp_path / "harness.py"
    body = "\n".join("    " + line for line in payload.strip().splitlines())
    script.write_text(NET_HARNESS.replace("{payload}", body))
    found, trace = tmp_path / "lookups.json", tmp_path / "trace"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}, "HOME": str(tmp_path),
           "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", "SIFT_NO_GIT": "1"}
    strace = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace)] if shutil.which("strace") else []
    r = subprocess.run([*strace, sys.executable, str(script), str(found), str(tmp_path / "run")],
                       capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    net = [line for line in trace.read_text().splitlines() if "AF_INET" in line] if strace else []
    return json.loads(found.read_text()), net


def test_the_network_probe_sees_a_lookup(tmp_path):
    lookups, net = _network_calls(tmp_path, LOOKUP)
    assert lookups == ["getaddrinfo('api.wandb.ai', 443)"]
    if shutil.which("strace"):
        assert any("htons(53)" in line for line in net), net


def test_a_training_run_logging_to_wandb_offline_makes_no_network_call(tmp_path):
    lookups, net = _network_calls(tmp_path, TRAIN_WITH_WANDB)
    assert lookups == [], f"hostname lookups during an offline W&B run: {lookups}"
    assert net == [], f"network connections during an offline W&B run: {net}"
    assert list((tmp_path / "run").glob("wandb/offline-run-*")), "the run logged nothing to W&B offline"
