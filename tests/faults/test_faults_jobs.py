"""Issue 13, jobs: a failure never deletes finished work, errors are one line and found before any work, one
process per output folder (PID lock), and interrupting a job stops every worker."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sift.errors import SiftError

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "SIFT_NO_GIT": "1", "PYTHONUNBUFFERED": "1"}
TINY = ["n_items=16", "detectors=[hidden_probe,biasing_features]", "seeds=[0,1]", "max_epochs=2", "ablations=[]",
        "factorial_seeds=[]", "transfer.detectors=[]", "bootstrap.resamples=30", "wandb=false", "workers=2",
        "instance_ensemble=[hidden_probe,biasing_features]", "mechanisms=null"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _children(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(kids - out)
            out |= kids
    return out


def _wait(cond, timeout: float, what: str) -> None:
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


# ------------------------------------------------------------------------------------ 1, 11: nothing deleted
def test_a_late_failure_keeps_the_finished_work(tmp_path, capsys):
    from sift.cli._common import clean_failure

    out = tmp_path / "new_out"
    with pytest.raises(SystemExit) as e:
        with clean_failure("sift-x", out):
            (out / "corpus").mkdir(parents=True)
            (out / "corpus" / "traces.jsonl").write_text("finished\n")
            (out / "runs" / "a").mkdir(parents=True)  # empty: created by the failing command
            raise SiftError("data.holdout_domain 'poetry' is not a corpus domain")
    assert e.value.code == 2
    assert (out / "corpus" / "traces.jsonl").read_text() == "finished\n"
    assert not (out / "runs").exists()  # only empty folders this command created are removed
    assert capsys.readouterr().err.strip() == "sift-x: error: data.holdout_domain 'poetry' is not a corpus domain"


def test_a_failure_before_any_output_leaves_no_folder(tmp_path, capsys):
    from sift.cli._common import clean_failure

    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(SystemExit):
        with clean_failure("sift-x", out):
            raise SiftError("bad")
    assert not (tmp_path / "a").exists()


def test_os_errors_are_one_line(tmp_path, capsys):
    from sift.cli._common import clean_failure

    with pytest.raises(SystemExit) as e:
        with clean_failure("sift-x", tmp_path / "o"):
            open(tmp_path / "o" / "missing" / "f.txt")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sift-x: error: ") and "f.txt: No such file or directory" in err and "\n" not in err


def test_unwritable_output_folder_is_one_line_before_any_work(tmp_path):
    from sift.config import compose
    from sift.faithshift import run_faithshift

    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = compose("faithshift", [f"paths.output_dir={blocker / 'out'}", *TINY])
    with pytest.raises(SiftError, match=f"paths.output_dir {blocker / 'out'}: not writable"):
        run_faithshift(cfg)


# ------------------------------------------------------------------------------------ 6-8: plan validation
@pytest.mark.parametrize("override, message", [
    ("detectors=[siftt,hidden_probe]", r"detector 'siftt': .*siftt"),
    ('train_overrides=["data.holdout_domain=poetry"]', r"data.holdout_domain='poetry' is not a corpus domain"),
    ("max_epochs=-1", r"max_epochs: expected an integer >= 1, got -1"),
    ('train_overrides=["trainer.max_epochs=-1"]', r"trainer.max_epochs must be an integer >= 1, got -1"),
    ("n_items=0", r"n_items: expected an integer >= 1, got 0"),
])
def test_the_whole_plan_is_validated_before_any_work(tmp_path, override, message):
    from sift.config import compose
    from sift.faithshift import run_faithshift

    out = tmp_path / "out"
    key = override.split("=", 1)[0]
    cfg = compose("faithshift", [f"paths.output_dir={out}", *[o for o in TINY if not o.startswith(key + "=")],
                                 override])
    with pytest.raises(SiftError, match=message):
        run_faithshift(cfg)
    assert not out.exists()  # refused before the first stage: not even the output folder was made


def test_train_refuses_endless_epochs_before_creating_its_folder(compose_train, tmp_path):
    from sift.training import train

    with pytest.raises(SiftError, match=r"trainer.max_epochs must be an integer >= 1, got -1"):
        train(compose_train("detector=hidden_probe", "trainer.max_epochs=-1", out=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()


def test_a_missing_checkpoint_to_resume_from_leaves_no_half_created_run_folder(compose_train, tmp_path):
    from sift.training import train

    with pytest.raises(SiftError, match=r"ckpt_path /nonexistent/x.ckpt: no such file"):
        train(compose_train("detector=hidden_probe", "ckpt_path=/nonexistent/x.ckpt", out=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()


def test_sift_corpus_refuses_a_non_integer_item_count(tmp_path):
    from hydra.errors import ConfigCompositionException

    from sift.config import compose

    with pytest.raises(ConfigCompositionException, match="n_items"):
        compose("corpus", [f"output_dir={tmp_path / 'c'}", "n_items=abc"])


def test_wandb_online_without_a_key_is_one_line(compose_train, tmp_path, monkeypatch):
    from sift.training import validate_train_config

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    cfg = compose_train("detector=hidden_probe", "logger=wandb", "logger.wandb.offline=false")
    with pytest.raises(SiftError, match="W&B is set online but no API key is configured"):
        validate_train_config(cfg)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    validate_train_config(cfg)


# ------------------------------------------------------------------------------------ 5: the lock
def test_lock_refuses_a_second_process_and_names_the_owner(tmp_path):
    from sift.lock import OutputLock

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from sift.lock import OutputLock
        OutputLock({str(tmp_path)!r}, "holder").acquire()
        print("held", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SiftError, match=rf"{tmp_path} is in use by another sift command \(pid {holder.pid} "):
            OutputLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with OutputLock(tmp_path):  # the owner died: the folder is free again
        assert f"pid {os.getpid()} " in (tmp_path / ".sift.lock").read_text()


def test_lock_takes_over_from_a_dead_owner(tmp_path, capsys):
    from sift.lock import OutputLock

    (tmp_path / ".sift.lock").write_text("pid 999999 host h command sift-faithshift started 2026-01-01T00:00:00\n")
    with OutputLock(tmp_path):
        pass
    assert "taking over" in capsys.readouterr().err


def test_two_main_jobs_on_one_folder_exactly_one_proceeds(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "sift.cli.faithshift", *TINY, f"paths.output_dir={out}"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=REPO)
    try:
        _wait(lambda: (out / ".sift.lock").is_file() and f"pid {first.pid} " in (out / ".sift.lock").read_text(),
              300, "the first job's lock")
        second = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=REPO, timeout=300)
        assert second.returncode == 2
        err = second.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(
            f"sift-faithshift: error: {out} is in use by another sift command (pid {first.pid} host ")
        assert err[0].endswith("wait for it to finish or choose another output folder")
        assert "[faithshift]" not in second.stdout  # the second job did no work at all
        assert first.poll() is None  # ... while the first one proceeds
        # interrupt it once it is doing work (a signal during its first imports is not what this tests)
        _wait(lambda: (out / "corpus").exists(), 300, "the first job's corpus stage")
    finally:
        first.send_signal(signal.SIGTERM)
        text = first.communicate(timeout=120)[0]
    assert first.returncode == 128 + signal.SIGTERM, text[-3000:]
    assert "interrupted (SIGTERM); rerun the same command to resume" in text


# ------------------------------------------------------------------------------------ 4: no orphan workers
POOL_SCRIPT = """
import os, signal, sys, time
from sift.cli._common import clean_failure
from sift.workers import process_pool

def work(i):
    time.sleep(120)

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even when started in the background
    with clean_failure("pool", None):
        with process_pool(2) as pool:
            jobs = [pool.submit(work, i) for i in range(2)]
            time.sleep(0.5)
            print("workers", *[p.pid for p in pool._processes.values()], flush=True)
            [j.result() for j in jobs]
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_killing_the_parent_stops_every_pool_worker(tmp_path, sig):
    script = tmp_path / "pool.py"
    script.write_text(POOL_SCRIPT)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=ENV, cwd=REPO)
    line = p.stdout.readline().split()
    assert line[0] == "workers", p.stderr.read()
    workers = [int(w) for w in line[1:]]
    _wait(lambda: all(_alive(w) for w in workers), 30, "workers")
    p.send_signal(sig)
    p.wait(60)
    _wait(lambda: not any(_alive(w) for w in workers), 30, "the workers to stop")
    if sig != signal.SIGKILL:
        assert p.returncode == 128 + sig and "interrupted" in p.stderr.read()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_main_job_with_runs_in_flight_leaves_no_worker(tmp_path, sig):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "sift.cli.faithshift", *TINY, f"paths.output_dir={out}"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=REPO)
    seen: set[int] = set()

    def in_flight() -> bool:
        seen.update(_children(p.pid))
        return p.poll() is not None or (len(list(out.glob("runs/main/*/seed*"))) >= 2 and len(seen) >= 2)

    _wait(in_flight, 900, "runs in flight")
    assert p.poll() is None
    p.send_signal(sig)
    p.wait(120)
    _wait(lambda: not any(_alive(k) for k in seen), 30, "every worker to stop")
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=REPO, timeout=1800)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads((out / "report" / "results.json").read_text())["main_table"]
