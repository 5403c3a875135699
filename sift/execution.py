"""The execution engine of the main job's training runs and corpus chunks: ``executor=local`` or ``executor=slurm``.

Both take the same job list and give the same records; only where the runs execute differs.

* ``local`` (default): ``workers`` spawned processes on this machine (:mod:`sift.workers`), one torch thread
  each. This is deliberately *not* submitit's ``LocalExecutor``: that starts a fresh interpreter per job
  (torch + Lightning imports, ~5–10 s each, i.e. minutes over the 82 runs of ``full`` on 2 cores) and its jobs
  are not tied to the parent's life, while the pool keeps its workers warm and guarantees that Ctrl-C,
  SIGTERM or SIGKILL of the job stops every worker (tests/faults).
* ``slurm``: submitit's ``SlurmExecutor``; the runs go out as one array job (``executor.array_parallelism``
  tasks at a time), logs in ``executor.folder``.

Either way: progress lines (runs done / total), a failed run is resubmitted ``executor.retries`` times (its log
path is printed), finished runs are skipped by their run hash inside the job (``skip_if_done``), and a job that
asks for ``trainer=gpu`` takes one GPU. Corpus chunks (:func:`sift.corpus.store.run_chunks`) go through the same
:func:`run_jobs` with their own label, log folder and job name.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sift.errors import PermanentError, SiftError

#: ``fn(cfg_yaml, out, spec, gpu)`` → result; one call per job
JobFn = Callable[..., Any]
#: ``on_done(spec, result)``, called in completion order
OnDone = Callable[[Any, Any], None]


def gpus_per_job(cfg: DictConfig) -> int:
    """GPUs each training job takes: ``executor.gpus_per_job``, or with ``auto`` 1 when the runs train on a
    GPU (``trainer=gpu`` in ``train_overrides``), else 0."""
    g = cfg.executor.get("gpus_per_job", "auto")
    if g == "auto":
        ov = [str(o).replace(" ", "") for o in cfg.get("train_overrides") or []]
        return int(any(o in ("trainer=gpu", "trainer.accelerator=gpu", "trainer.accelerator=cuda") for o in ov))
    if isinstance(g, bool) or not isinstance(g, int) or g < 0:
        raise SiftError(f"executor.gpus_per_job: expected auto or an integer >= 0, got {g!r}")
    return g


def validate_executor(cfg: DictConfig) -> None:
    """Check ``cfg.executor`` before any work; raises SiftError naming the first problem."""
    e = cfg.get("executor")
    if e is None or e.get("kind") not in ("local", "slurm"):
        raise SiftError("executor: expected executor=local or executor=slurm, "
                        f"got {None if e is None else e.get('kind')!r}")
    gpus_per_job(cfg)
    _retries(cfg)
    if e.kind == "slurm":
        for key in ("timeout_min", "mem_gb", "cpus_per_task", "array_parallelism"):
            v = e.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SiftError(f"executor.{key}: expected an integer >= 1, got {v!r}")
        import shutil

        if shutil.which("sbatch") is None:
            raise SiftError("executor=slurm: `sbatch` is not on PATH (run the job on a SLURM login node)")


@dataclass(frozen=True)
class JobLabels:
    """How a batch of jobs is named in progress lines, failure logs and SLURM."""

    tag: str = "faithshift"  # progress-line prefix: ``[tag] ...``
    noun: str = "run"  # one job: "run" | "chunk"
    log_root: str = "runs"  # a failed local job's log: ``<out>/<log_root>/<spec.key>/failed-attempt<n>.log``
    job_name: str = "sift-train"  # SLURM job name unless ``executor.job_name`` is set


TRAINING = JobLabels()


def run_jobs(cfg: DictConfig, out: Path, specs: Sequence[Any], fn: JobFn, on_done: OnDone, *,
             labels: JobLabels = TRAINING, gpus: int | None = None) -> None:
    """Run ``fn`` for every spec (an object with a ``key``) on ``cfg.executor`` (``cfg.workers`` processes
    with ``local``) and call ``on_done`` as each finishes; raises once a job has failed ``1 + executor.retries``
    times (the other jobs are stopped). ``gpus``: GPUs per job (default :func:`gpus_per_job`)."""
    kind = cfg.executor.get("kind")
    n_gpus = gpus_per_job(cfg) if gpus is None else gpus
    if kind == "local":
        _run_local(cfg, out, specs, fn, on_done, labels, n_gpus)
    elif kind == "slurm":
        _run_slurm(cfg, out, specs, fn, on_done, labels, n_gpus)
    else:
        raise SiftError(f"executor.kind: expected local or slurm, got {kind!r}")


def _retries(cfg: DictConfig) -> int:
    r = cfg.executor.get("retries", 1)
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise SiftError(f"executor.retries: expected an integer >= 0, got {r!r}")
    return r


def _failure_log(out: Path, spec: Any, attempt: int, exc: BaseException, labels: JobLabels) -> Path:
    """Write a failed local job's traceback next to its output; return the log's path."""
    from sift.atomic import write_text

    log = out / labels.log_root / spec.key / f"failed-attempt{attempt}.log"
    write_text(log, "".join(traceback.format_exception(exc)))
    return log


def _local_gpus(n: int) -> list[str]:
    """The GPU ids local jobs are spread over (``CUDA_VISIBLE_DEVICES`` or every visible device)."""
    import os

    if n == 0:
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        ids = [i for i in env.split(",") if i.strip()]
    else:
        import torch

        ids = [str(i) for i in range(torch.cuda.device_count())]
    if not ids:
        raise SiftError("the jobs ask for a GPU each (trainer=gpu, source.device=cuda or executor.gpus_per_job) "
                        "and this machine shows none")
    return ids


def _run_local(cfg: DictConfig, out: Path, specs: Sequence[Any], fn: JobFn, on_done: OnDone, labels: JobLabels,
               n_gpus: int) -> None:
    from concurrent.futures import FIRST_COMPLETED, wait

    from sift.workers import process_pool

    retries, workers = _retries(cfg), min(int(cfg.workers), len(specs))
    gpus = _local_gpus(n_gpus) or None  # each worker process keeps one of these (see select_gpu)

    def failed(spec: Any, attempt: int, e: BaseException) -> bool:
        log = _failure_log(out, spec, attempt, e, labels)
        permanent = isinstance(e, PermanentError)  # bad input: the same failure again on a retry
        print(f"[{labels.tag}] {labels.noun} {spec.key} failed (attempt {attempt}/{retries + 1}"
              f"{', not retried: ' + str(e) if permanent else ''}), log {log}", flush=True)
        return attempt <= retries and not permanent  # retry?

    if workers <= 1:  # in this process (no GPU juggling: the trainer's own device choice applies)
        for spec in specs:
            attempt = 1
            while True:
                try:
                    result = fn(None, str(out), spec, None, cfg=cfg)
                    break
                except Exception as e:
                    if not failed(spec, attempt, e):
                        raise
                    attempt += 1
            on_done(spec, result)
        return
    cfg_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    with process_pool(workers) as pool:  # a failure, Ctrl-C or SIGTERM stops every worker at once
        running = {pool.submit(fn, cfg_yaml, str(out), spec, gpus): (spec, 1) for spec in specs}
        while running:
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                spec, attempt = running.pop(fut)
                try:
                    result = fut.result()
                except Exception as e:
                    if not failed(spec, attempt, e) or _pool_broken(pool):
                        raise
                    running[pool.submit(fn, cfg_yaml, str(out), spec, gpus)] = (spec, attempt + 1)
                    continue
                on_done(spec, result)


def _pool_broken(pool: Any) -> bool:
    return bool(getattr(pool, "_broken", False))


def _permanent_line(e: BaseException) -> str | None:
    """The message of a :class:`PermanentError` raised in a SLURM job (submitit passes on its traceback as
    text), or None for any other failure."""
    if isinstance(e, PermanentError):
        return str(e)
    for line in str(e).splitlines():
        if "PermanentError:" in line:
            return line.split("PermanentError:", 1)[1].strip()
    return None


def select_gpu(gpus: Sequence[str] | None) -> None:
    """In a local worker process: keep one of ``gpus`` (by the worker's index), before CUDA starts."""
    import multiprocessing as mp
    import os

    if not gpus:
        return
    ident = (mp.current_process()._identity or (1,))[0]
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpus[(ident - 1) % len(gpus)])


def slurm_executor(cfg: DictConfig, n_gpus: int, job_name: str = "sift-train") -> Any:
    """A submitit ``SlurmExecutor`` set up from ``cfg.executor`` (partition, GPUs, time, memory, CPUs, array
    parallelism, extra ``#SBATCH`` flags and setup lines)."""
    import submitit

    e = cfg.executor
    folder = Path(str(e.folder)).expanduser().resolve()
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
    params: dict[str, Any] = dict(job_name=str(e.get("job_name") or job_name), time=int(e.timeout_min),
                                  mem=f"{int(e.mem_gb)}GB", cpus_per_task=int(e.cpus_per_task), nodes=1,
                                  ntasks_per_node=1, array_parallelism=int(e.array_parallelism))
    if n_gpus:
        params["gpus_per_node"] = n_gpus
    if e.get("partition"):
        params["partition"] = str(e.partition)
    if e.get("additional"):
        params["additional_parameters"] = OmegaConf.to_container(e.additional, resolve=True)
    if e.get("setup"):
        params["setup"] = [str(s) for s in e.setup]
    ex.update_parameters(**params)
    return ex


def _run_slurm(cfg: DictConfig, out: Path, specs: Sequence[Any], fn: JobFn, on_done: OnDone, labels: JobLabels,
               n_gpus: int) -> None:
    retries = _retries(cfg)
    ex = slurm_executor(cfg, n_gpus, labels.job_name)
    cfg_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    n = len(specs)
    if not n:
        return
    # one array job for every run; the job sees its GPU through SLURM's CUDA_VISIBLE_DEVICES (gpu=None)
    jobs = ex.map_array(fn, [cfg_yaml] * n, [str(out)] * n, list(specs), [None] * n)
    print(f"[{labels.tag}] submitted {n} {labels.noun}s to SLURM as array job {jobs[0].job_id.split('_')[0]} "
          f"(logs in {ex.folder})", flush=True)
    pending = [(job, spec, 1) for job, spec in zip(jobs, specs)]
    poll = float(cfg.executor.get("poll_s", 15))
    try:
        while pending:
            still = []
            for job, spec, attempt in pending:
                if not job.done():
                    still.append((job, spec, attempt))
                    continue
                try:
                    result = job.result()
                except Exception as e:  # submitit's FailedJobError / UncompletedJobError
                    log = job.paths.stderr
                    print(f"[{labels.tag}] {labels.noun} {spec.key} failed (attempt {attempt}/{retries + 1}, SLURM job "
                          f"{job.job_id}), log {log}", flush=True)
                    # a PermanentError in the job (its traceback is in the message) fails the same way again
                    permanent = _permanent_line(e)
                    if permanent is not None:
                        raise SiftError(f"{labels.noun} {spec.key} failed on SLURM, not retried: {permanent} "
                                        f"(log {log})") from e
                    if attempt > retries:
                        raise SiftError(f"{labels.noun} {spec.key} failed {attempt} times on SLURM; last log {log}: "
                                        f"{str(e).strip().splitlines()[-1] if str(e).strip() else e!r}") from e
                    still.append((ex.submit(fn, cfg_yaml, str(out), spec, None), spec, attempt + 1))
                    continue
                on_done(spec, result)
            pending = still
            if pending:
                time.sleep(poll)
    except BaseException:
        for job, _, _ in pending:  # Ctrl-C / SIGTERM / a failed run: cancel what is still queued or running
            try:
                job.cancel(check=False)
            except Exception:
                pass
        raise
