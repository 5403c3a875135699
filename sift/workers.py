"""Worker processes that never outlive the job: a spawned process pool whose workers exit when the parent
dies (even by SIGKILL), and which is torn down at once when the parent is interrupted or a job fails."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

#: seconds between a worker's checks that its parent is alive
PARENT_POLL_S = 0.5


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent:
            os._exit(1)  # the job that started us is gone: stop writing into its folder


def _init_worker(parent: int) -> None:
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="sift-parent-watch").start()


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Terminate every worker of ``pool`` now (SIGTERM, then SIGKILL after 5 s) and drop pending jobs."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.time() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join(1)
    pool.shutdown(wait=False, cancel_futures=True)


@contextmanager
def process_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A spawn-context pool of ``workers`` processes; on any exception (a failed job, Ctrl-C, SIGTERM turned
    into KeyboardInterrupt) every worker is stopped before the exception propagates."""
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                               initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)
