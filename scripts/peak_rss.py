"""Peak memory of a job and all its processes: the RSS of a process and every descendant, summed, sampled every
``--every`` seconds until it exits. Writes one line per sample (time, total GB, each process's GB) to ``log`` and
prints the peak. Used for docs/real_lm.md's per-phase memory:

    sift-faithshift ... & python scripts/peak_rss.py $! run_rss.log
"""
from __future__ import annotations

import argparse
import time

import psutil


def watch(pid: int, log: str, every: float = 2.0) -> tuple[float, str]:
    """Sample until process ``pid`` exits; returns (peak GB, its sample line)."""
    root = psutil.Process(pid)
    peak = (0.0, "")
    with open(log, "w") as out:
        while root.is_running() and root.status() != psutil.STATUS_ZOMBIE:
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            parts = []
            for p in procs:
                try:
                    parts.append(p.memory_info().rss / 1e9)
                except psutil.Error:
                    pass
            line = f"{time.strftime('%H:%M:%S')} {sum(parts):.2f} " + " ".join(f"{x:.2f}" for x in parts)
            out.write(line + "\n")
            out.flush()
            if sum(parts) > peak[0]:
                peak = (sum(parts), line)
            time.sleep(every)
        out.write(f"PEAK {peak[1]}\n")
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pid", type=int)
    ap.add_argument("log")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    a = ap.parse_args()
    gb, line = watch(a.pid, a.log, a.every)
    print(f"peak RSS {gb:.2f} GB at {line.split(' ', 1)[0] if line else '-'}")


if __name__ == "__main__":
    main()
