"""The main job's execution engine: ``executor=slurm`` against a simulated cluster (fake ``sbatch``, ``srun``,
``sacct``, ``scancel`` on PATH that run the submitted script here), and ``executor=local`` retries."""

import json
import os
import re
import stat
import sys
from pathlib import Path

import cloudpickle
import pytest
from omegaconf import OmegaConf

from sift.config import compose
from sift.errors import SiftError
from sift.execution import gpus_per_job, run_jobs, validate_executor
from sift.faithshift import RunSpec

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # SLURM tasks unpickle this module's job functions

SBATCH = r'''#!PYTHON
"""Fake sbatch: keep the script, answer with a job id, then run every array task in the background (as a
cluster would: submitit moves its pickled jobs into place only once it has the id), recording each state."""
import os, re, subprocess, sys
from pathlib import Path
state = Path(os.environ["FAKE_SLURM_DIR"])
script_path = sys.argv[-1]
script = Path(script_path).read_text()
counter = state / "next_id"
jid = int(counter.read_text()) if counter.exists() else 1000
counter.write_text(str(jid + 1))
(state / f"submitted_{jid}.sh").write_text(script)
kept = state / f"run_{jid}.bash"
kept.write_text(script)
m = re.search(r"^#SBATCH --array=0-(\d+)%(\d+)$", script, re.M)
folder = Path(re.search(r"^#SBATCH --output=(.*)$", script, re.M).group(1)).parent
tasks = list(range(int(m.group(1)) + 1)) if m else [None]
runner = f"""
import os, subprocess, time
from pathlib import Path
for t in {tasks!r}:
    name = "{jid}" if t is None else f"{jid}_{{t}}"
    pkl = Path("{folder}") / f"{{name}}_submitted.pkl"
    for _ in range(600):
        if pkl.exists():
            break
        time.sleep(0.05)
    env = {{**os.environ, "SLURM_JOB_ID": str({jid} if t is None else {jid} * 100 + t), "SLURM_NTASKS": "1",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "fakenode", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "FAKE_JOB": name}}
    if t is not None:
        env.update(SLURM_ARRAY_JOB_ID=str({jid}), SLURM_ARRAY_TASK_ID=str(t))
    rc = subprocess.run(["bash", "{kept}"], env=env).returncode
    with open("{state / 'sacct.txt'}", "a") as f:
        f.write(f"{{name}}|{{'COMPLETED' if rc == 0 else 'FAILED'}}|fakenode\\n")
"""
subprocess.Popen([sys.executable, "-c", runner], start_new_session=True, stdout=subprocess.DEVNULL,
                 stderr=open(state / f"runner_{jid}.err", "w"))
print(f"Submitted batch job {jid}")
'''
SRUN = r'''#!PYTHON
"""Fake srun: --output/--error with SLURM's %A %a %j %t patterns, then the command."""
import os, subprocess, sys
args, files = sys.argv[1:], {}
while args and args[0].startswith("--"):
    a = args.pop(0)
    if a in ("--output", "--error"):
        files[a] = args.pop(0)
job = os.environ["FAKE_JOB"]
sub = lambda p: (p.replace("%A", job.split("_")[0]).replace("%a", job.split("_")[-1]).replace("%j", job)
                 .replace("%t", "0"))
out = open(sub(files["--output"]), "a")
err = open(sub(files.get("--error", files["--output"])), "a")
sys.exit(subprocess.run(args, stdout=out, stderr=err).returncode)
'''
SACCT = r'''#!PYTHON
import os
from pathlib import Path
p = Path(os.environ["FAKE_SLURM_DIR"]) / "sacct.txt"
print("JobID|State|NodeList")
print(p.read_text() if p.exists() else "", end="")
'''
SCANCEL = r'''#!PYTHON
import os, sys
from pathlib import Path
with open(Path(os.environ["FAKE_SLURM_DIR"]) / "scancel.txt", "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
'''


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A fake SLURM on PATH; returns its state folder (submitted scripts, sacct lines, scancel calls)."""
    bin_dir, state = tmp_path / "bin", tmp_path / "slurm-state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in (("sbatch", SBATCH), ("srun", SRUN), ("sacct", SACCT), ("scancel", SCANCEL)):
        f = bin_dir / name
        f.write_text(text.replace("PYTHON", sys.executable, 1))
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(state))
    # submitit caches finished jobs' sacct states by job id in one class-level watcher; every fake cluster
    # restarts its ids at 1000, so a state cached by an earlier test would mark this test's job done at once
    import submitit
    submitit.SlurmJob.watcher.clear()
    yield state
    submitit.SlurmJob.watcher.clear()


def _cfg(tmp_path, **executor):
    slurm = Path(__file__).resolve().parents[2] / "sift/configs/executor/slurm.yaml"
    base = OmegaConf.to_container(OmegaConf.load(slurm))
    base.update(folder=str(tmp_path / "logs"), poll_s=0.05, partition="gpu-test", array_parallelism=2, **executor)
    return OmegaConf.create({"workers": 1, "train_overrides": ["trainer=gpu"], "executor": base})


def _specs(n):
    return [RunSpec(f"main/d/seed{i}", "main", "d", i) for i in range(n)]


def _job(cfg_yaml, out, spec, gpus):
    """Stands in for a training run: fails on its first attempt when asked to, else reports where it ran."""
    marker = Path(out) / f"fail-once-{spec.seed}"
    if marker.exists():
        marker.unlink()
        raise RuntimeError(f"transient failure of {spec.key}")
    if (Path(out) / f"fail-always-{spec.seed}").exists():
        raise RuntimeError(f"permanent failure of {spec.key}")
    if (Path(out) / f"bad-input-{spec.seed}").exists():
        from sift.errors import PermanentError

        raise PermanentError(f"bad input of {spec.key}")
    return {"key": spec.key, "task": os.environ.get("SLURM_ARRAY_TASK_ID"), "job": os.environ["SLURM_JOB_ID"],
            "threads": json.loads(cfg_yaml.split("workers: ")[1].split()[0])}


def test_slurm_writes_an_array_submission_and_collects_every_result(tmp_path, cluster, capsys):
    cfg = _cfg(tmp_path, mem_gb=12, cpus_per_task=3, timeout_min=30, additional={"account": "proj"},
               setup=["echo setting-up"])
    got = {}
    run_jobs(cfg, tmp_path, _specs(3), _job, lambda spec, res: got.__setitem__(spec.key, res))
    scripts = sorted(cluster.glob("submitted_*.sh"))
    assert [s.name for s in scripts] == ["submitted_1000.sh"]  # one array job for all three runs
    text = scripts[0].read_text()
    logs = str(tmp_path / "logs")
    for line in ("#SBATCH --partition=gpu-test", "#SBATCH --gpus-per-node=1", "#SBATCH --array=0-2%2",
                 "#SBATCH --mem=12GB", "#SBATCH --cpus-per-task=3", "#SBATCH --time=30", "#SBATCH --account=proj",
                 "#SBATCH --job-name=sift-train", f"#SBATCH --output={logs}/%A_%a_0_log.out",
                 f"#SBATCH --error={logs}/%A_%a_0_log.err", "echo setting-up"):
        assert line in text.splitlines(), line
    assert re.search(r"srun --unbuffered --output \S+/%A_%a_%t_log.out --error \S+/%A_%a_%t_log.err .*"
                     r"-m submitit.core._submit", text)
    assert got == {f"main/d/seed{i}": {"key": f"main/d/seed{i}", "task": str(i), "job": str(100000 + i),
                                       "threads": 1} for i in range(3)}
    assert {p.name for p in (tmp_path / "logs").glob("*_log.out")} == {f"1000_{i}_0_log.out" for i in range(3)}
    assert "submitted 3 runs to SLURM as array job 1000" in capsys.readouterr().out


def test_slurm_retries_a_failed_task_once_and_names_its_log(tmp_path, cluster, capsys):
    (tmp_path / "fail-once-1").touch()
    got = {}
    run_jobs(_cfg(tmp_path), tmp_path, _specs(2), _job, lambda spec, res: got.__setitem__(spec.key, res))
    assert set(got) == {"main/d/seed0", "main/d/seed1"} and got["main/d/seed1"]["task"] is None  # the retry
    retry = (cluster / "submitted_1001.sh").read_text()
    assert "--array" not in retry and "#SBATCH --partition=gpu-test" in retry
    out = capsys.readouterr().out
    log = tmp_path / "logs" / "1000_1_0_log.err"
    assert f"run main/d/seed1 failed (attempt 1/2, SLURM job 1000_1), log {log}" in out
    assert "transient failure of main/d/seed1" in log.read_text()


def test_slurm_gives_up_after_the_retry(tmp_path, cluster):
    (tmp_path / "fail-always-0").touch()
    with pytest.raises(SiftError, match=r"run main/d/seed0 failed 2 times on SLURM; last log .*1001_0_log.err"):
        run_jobs(_cfg(tmp_path, gpus_per_job=0), tmp_path, _specs(1), _job, lambda *a: None)
    assert "gpus-per-node" not in (cluster / "submitted_1000.sh").read_text()


def test_slurm_does_not_retry_a_permanent_failure(tmp_path, cluster):
    (tmp_path / "bad-input-0").touch()
    with pytest.raises(SiftError, match=r"run main/d/seed0 failed on SLURM, not retried: bad input of "
                                        r"main/d/seed0 \(log "):
        run_jobs(_cfg(tmp_path, gpus_per_job=0), tmp_path, _specs(1), _job, lambda *a: None)
    assert not (cluster / "submitted_1001.sh").exists()  # no resubmission


def test_executor_config_is_checked_before_any_work(tmp_path, cluster, monkeypatch):
    cfg = compose("faithshift", [f"paths.output_dir={tmp_path}", "executor=slurm", "executor.mem_gb=0"])
    with pytest.raises(SiftError, match="executor.mem_gb: expected an integer >= 1, got 0"):
        validate_executor(cfg)
    assert gpus_per_job(compose("faithshift", ["executor=slurm", 'train_overrides=["trainer=gpu"]'])) == 1
    assert gpus_per_job(compose("faithshift", ["executor=local"])) == 0
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SiftError, match="`sbatch` is not on PATH"):
        validate_executor(compose("faithshift", ["executor=slurm"]))


def _local_job(cfg_yaml, out, spec, gpus, cfg=None):
    return _job(cfg_yaml or "workers: 1\n", out, spec, gpus) if os.environ.get("SLURM_JOB_ID") else \
        _job_local(out, spec)


def _job_local(out, spec):
    marker = Path(out) / f"fail-once-{spec.seed}"
    if marker.exists():
        marker.unlink()
        raise RuntimeError(f"transient failure of {spec.key}")
    return {"key": spec.key, "pid": os.getpid()}


@pytest.mark.parametrize("workers", [1, 2])
def test_local_retries_a_failed_run_once(tmp_path, capsys, workers):
    (tmp_path / "fail-once-0").touch()
    cfg = OmegaConf.create({"workers": workers, "train_overrides": [], "executor": {"kind": "local", "retries": 1}})
    got = {}
    run_jobs(cfg, tmp_path, _specs(3), _local_job, lambda spec, res: got.__setitem__(spec.key, res["key"]))
    assert got == {f"main/d/seed{i}": f"main/d/seed{i}" for i in range(3)}
    log = tmp_path / "runs" / "main/d/seed0" / "failed-attempt1.log"
    assert "transient failure of main/d/seed0" in log.read_text()
    assert f"run main/d/seed0 failed (attempt 1/2), log {log}" in capsys.readouterr().out


def _chunk(tag, chunk):
    """Stands in for a corpus chunk builder (picklable through functools.partial)."""
    return [{"item": i, "tag": tag, "job": os.environ.get("SLURM_JOB_ID")} for i in chunk]


def test_slurm_runs_the_missing_corpus_chunks_as_one_array_job(tmp_path, cluster, capsys):
    from functools import partial

    from sift.corpus.store import engine_config, run_chunks

    parts = tmp_path / ".parts"
    parts.mkdir()
    (parts / "chunk-0001-h.jsonl").write_text('{"item": 2, "tag": "cached"}\n{"item": 3, "tag": "cached"}\n')
    engine = engine_config(_cfg(tmp_path, gpus_per_job="auto").executor, 1)
    recs, reused = run_chunks([[0, 1], [2, 3], [4, 5]], parts, "h", partial(_chunk, "new"), desc="chunks",
                              progress=False, engine=engine, gpus=1)
    assert reused == 1 and [r["item"] for r in recs] == list(range(6))
    assert [r["tag"] for r in recs] == ["new", "new", "cached", "cached", "new", "new"]
    assert {r["job"] for r in recs if r["tag"] == "new"} == {"100000", "100001"}  # array tasks 0 and 1
    text = (cluster / "submitted_1000.sh").read_text().splitlines()
    for line in ("#SBATCH --job-name=sift-corpus", "#SBATCH --array=0-1%2", "#SBATCH --gpus-per-node=1"):
        assert line in text, line
    assert "submitted 2 chunks to SLURM as array job 1000" in capsys.readouterr().out


def test_the_corpus_stage_takes_the_main_jobs_executor_and_workers(tmp_path):
    from sift.faithshift import corpus_config

    cfg = compose("faithshift", [f"paths.output_dir={tmp_path}", "executor=slurm", "workers=3",
                                 "executor.partition=big"])
    c = corpus_config(cfg, tmp_path)
    assert c.workers == 3 and c.executor.kind == "slurm" and c.executor.partition == "big"
    assert c.executor.folder == str(tmp_path / "slurm")
    own = corpus_config(compose("faithshift", [f"paths.output_dir={tmp_path}", "workers=3",
                                               "corpus_overrides=['workers=1']"]), tmp_path)
    assert own.workers == 1 and own.executor.kind == "local"
