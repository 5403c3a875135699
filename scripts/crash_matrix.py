"""Crash matrix: SIGKILL the main job at every stage boundary and mid-stage, rerun it, compare with a clean run.

    python scripts/crash_matrix.py --work /tmp/crash                 # the quick preset (docs table)
    python scripts/crash_matrix.py --tiny --work /tmp/crash_tiny     # a tiny config (minutes; the slow test)

For each kill point the job is started in a fresh folder, killed with SIGKILL when the point is reached (a
progress line, a file appearing, or a delay into a stage measured on the clean run), checked for surviving
worker processes, then rerun to completion in the same folder. ``report/results.json`` must equal the
uninterrupted run's number for number (|Δ| ≤ 1e-12, strings and nulls equal). Prints a Markdown table; exit
status 1 when any row fails. Linux only (reads /proc for the job's worker processes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare_results import differences  # scripts/ is on sys.path when this runs as a script

REPO = Path(__file__).resolve().parents[1]
TOL = 1e-12

#: a tiny main job: both SIFT (checkpointed epochs, dropout; its two seeds one stacked group) and a baseline, two
#: workers, every stage
TINY = ["n_items=16", "detectors=[sift,hidden_probe]", "seeds=[0,1]", "trainer.stack_seeds=[sift]", "max_epochs=3",
        "ablations=[]",
        "factorial_seeds=[]", "transfer.detectors=[hidden_probe]", "transfer.seeds=[0]",
        "transfer.holdout_domains=[boolean]", "transfer.holdout_models=[]", "bootstrap.resamples=20",
        "bootstrap.appendix_resamples=10", "wandb=false", "workers=2", "instance_ensemble=[hidden_probe]"]
QUICK = ["preset=quick"]


@dataclass
class KillPoint:
    name: str
    line: str | None = None  # kill when a stdout line matches this regular expression ...
    file: str | None = None  # ... or when this file (glob, relative to the output folder) exists ...
    stage: str | None = None  # ... or this far (fraction) into this stage of the clean run
    fraction: float = 0.5
    after_extraction: bool = False  # start from a copy of the clean run's corpus/ and trajectories/


POINTS = [
    KillPoint("mid corpus (a chunk saved, no manifest)", file="corpus/.parts/chunk-*.jsonl"),
    KillPoint("corpus → trajectories", line=r"\[faithshift\] corpus done"),
    KillPoint("mid trajectories (a shard written, others pending)",
              line=r"\[extract\] shard \S+ written \(1 computed of"),
    KillPoint("trajectories → training", line=r"\[faithshift\] trajectories done"),
    KillPoint("mid SIFT run (after an epoch's last.ckpt)", file="runs/main/sift/seed0/checkpoints/last.ckpt",
              after_extraction=True),
    KillPoint("mid training (a run finished, others in flight)", line=r"\[faithshift\] run 1/\d+ done",
              after_extraction=True),
    # a stacked group (tiny: SIFT's two seeds) killed once a seed has written an epoch's last.ckpt: each seed
    # resumes from its own checkpoint, with its own dropout stream, whichever epoch the other reached
    KillPoint("mid stacked group (seed 1's last.ckpt written)", file="runs/main/sift/seed1/checkpoints/last.ckpt",
              after_extraction=True),
    KillPoint("training → evaluation", line=r"\[faithshift\] training .* done \(", after_extraction=True),
    KillPoint("mid evaluation (a report section saved)", file="report/.sections/*.json", after_extraction=True),
]


def command(overrides: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "sift.cli.faithshift", *overrides, f"paths.output_dir={out}"]


def env() -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
         "WANDB_MODE": "offline", "WANDB_SILENT": "true", "SIFT_NO_GIT": "1", "PYTHONUNBUFFERED": "1"}
    return e


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc/<pid>/task/*/children)."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for k in kids:
                if k not in out:
                    out.add(k)
                    todo.append(k)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run_clean(overrides: list[str], out: Path, log: Path) -> dict[str, float]:
    """Run to completion; returns each stage's duration in seconds (from the progress lines)."""
    t0 = time.time()
    starts: dict[str, float] = {}
    stages: dict[str, float] = {}
    with open(log, "w") as fh:
        p = subprocess.Popen(command(overrides, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env(), cwd=REPO)
        for line in p.stdout:  # type: ignore[union-attr]
            fh.write(line)
            m = re.match(r"\[faithshift\] (\w+).*\.\.\.$", line.strip())
            if m:
                starts[m.group(1)] = time.time()
            m = re.match(r"\[faithshift\] (\w+).* done \(\d+ s\)$", line.strip())
            if m and m.group(1) in starts:
                stages[m.group(1)] = time.time() - starts[m.group(1)]
        if p.wait() != 0:
            raise SystemExit(f"crash_matrix: the run into {out} failed (exit {p.returncode}); see {log}")
    stages["total"] = time.time() - t0
    return stages


def run_killed(overrides: list[str], out: Path, point: KillPoint, stages: dict[str, float],
               log: Path) -> tuple[bool, int, float]:
    """Start the job, SIGKILL it at ``point``; returns (killed before the end, workers left alive, seconds)."""
    import threading

    t0 = time.time()
    p = subprocess.Popen(command(overrides, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env(), cwd=REPO)
    fire = threading.Event()
    stage_start: dict[str, float] = {}
    fh = open(log, "w")

    def reader() -> None:
        for line in p.stdout:  # type: ignore[union-attr]
            fh.write(line)
            s = line.strip()
            m = re.match(r"\[faithshift\] (\w+).*\.\.\.$", s)
            if m:
                stage_start[m.group(1)] = time.time()
            if point.line and re.search(point.line, s):
                fire.set()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    while p.poll() is None and not fire.is_set():
        if point.file and list(out.glob(point.file)):
            fire.set()
        if point.stage and point.stage in stage_start:
            if time.time() - stage_start[point.stage] >= point.fraction * stages.get(point.stage, 0.0):
                fire.set()
        time.sleep(0.05)
    if p.poll() is not None:
        th.join(5)
        fh.close()
        return False, 0, time.time() - t0
    kids = descendants(p.pid)
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.time() + 30
    while time.time() < deadline and any(alive(k) for k in kids):
        time.sleep(0.2)
    left = sum(alive(k) for k in kids)
    th.join(5)
    fh.close()
    return True, left, time.time() - t0


def _epoch_of(ckpt: Path) -> int | None:
    try:
        import torch

        return int(torch.load(str(ckpt), map_location="cpu", weights_only=True)["epoch"])
    except Exception:  # a checkpoint being written when the job died counts as absent
        return None


def left_behind(out: Path) -> str:
    """What the killed job left for the rerun to resume from: finished stages, finished runs, runs with an
    epoch-end ``last.ckpt`` (the rerun continues them from the next epoch), saved report sections."""
    parts: list[str] = []
    if (out / "corpus" / "manifest.json").is_file():
        parts.append("corpus")
    else:
        n = len(list((out / "corpus" / ".parts").glob("chunk-*.jsonl")))
        parts.append(f"no corpus ({n} chunk(s) saved)" if n else "nothing")
        return ", ".join(parts)
    if (out / "trajectories" / "trajectories.json").is_file():
        parts.append("trajectories")
    else:
        n = len(list((out / "trajectories" / "shards").glob("**/*.pt")))
        parts.append(f"{n} trajectory shard(s)")
        return ", ".join(parts)
    done, partial = 0, []
    for res in sorted((out / "runs").glob("**/checkpoints/last.ckpt")):
        run = res.parent.parent
        r = run / "results.json"
        if r.is_file() and json.loads(r.read_text()).get("status") == "done":
            done += 1
        else:
            e = _epoch_of(res)
            partial.append(f"{run.relative_to(out / 'runs')} at epoch {e}" if e is not None else str(run))
    n_runs = len(json.loads((out / "runs" / "index.json").read_text())) if (out / "runs" / "index.json").is_file() \
        else None
    parts.append(f"{done}{'/' + str(n_runs) if n_runs else ''} runs done")
    if partial:
        parts.append("resumed from last.ckpt: " + "; ".join(partial))
    sections = len(list((out / "report" / ".sections").glob("*.json")))
    if sections:
        parts.append(f"{sections} report section(s)")
    if (out / "report" / "results.json").is_file():
        parts.append("report")
    return ", ".join(parts)


def max_abs_diff(a: Any, b: Any) -> float:
    if isinstance(a, dict) and isinstance(b, dict):
        return max([max_abs_diff(a[k], b[k]) for k in set(a) & set(b)], default=0.0)
    if isinstance(a, list) and isinstance(b, list):
        return max([max_abs_diff(x, y) for x, y in zip(a, b)], default=0.0)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if math.isnan(a) or math.isnan(b):
            return 0.0 if (math.isnan(a) and math.isnan(b)) else math.inf
        return abs(a - b)
    return 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="scratch folder (one output folder per kill point)")
    ap.add_argument("--tiny", action="store_true", help="a tiny config instead of preset=quick")
    ap.add_argument("--points", default="", help="comma-separated indices of the kill points to run (default all)")
    ap.add_argument("--override", action="append", default=[], help="extra sift-faithshift override (repeatable)")
    ap.add_argument("--reuse-stages", action="store_true",
                    help="for kill points after extraction, start from a copy of the clean run's corpus and "
                         "trajectories (saves two stages per point; the rerun still checks them by content hash)")
    args = ap.parse_args(argv)
    overrides = [*(TINY if args.tiny else QUICK), *args.override]
    args.work.mkdir(parents=True, exist_ok=True)
    points = [POINTS[int(i)] for i in args.points.split(",")] if args.points else POINTS
    ref = args.work / "clean"
    print(f"crash_matrix: clean run -> {ref}", flush=True)
    stages = run_clean(overrides, ref, args.work / "clean.log")
    reference = json.loads((ref / "report" / "results.json").read_text())
    rows, ok_all = [], True
    for i, pt in enumerate(points):
        out = args.work / f"kill{i}"
        if pt.after_extraction and args.reuse_stages:  # the stages before this point are deterministic: copy them
            import shutil

            for stage in ("corpus", "trajectories"):
                shutil.copytree(ref / stage, out / stage)
        killed, left, t_kill = run_killed(overrides, out, pt, stages, args.work / f"kill{i}.log")
        found = left_behind(out)
        t1 = time.time()
        run_clean(overrides, out, args.work / f"kill{i}.rerun.log")
        got = json.loads((out / "report" / "results.json").read_text())
        diffs = differences(reference, got, TOL, ignore=())
        ok = killed and left == 0 and not diffs
        ok_all &= ok
        rows.append([pt.name, f"{t_kill:.0f}", "yes" if killed else "no (finished first)", str(left), found,
                     f"{time.time() - t1:.0f}", f"{max_abs_diff(reference, got):.1e}",
                     "identical" if not diffs else f"{len(diffs)} differ, e.g. {diffs[0]}",
                     "pass" if ok else "FAIL"])
        print(f"crash_matrix: {pt.name}: {rows[-1][-1]}", flush=True)
    head = ["kill point", "killed at (s)", "killed", "workers left", "left for the rerun", "rerun (s)", "max abs Δ",
            "results.json", "verdict"]
    print(f"\nclean run: {stages['total']:.0f} s ("
          f"{', '.join(f'{k} {v:.0f} s' for k, v in stages.items() if k != 'total')})"
          f"; overrides: {' '.join(overrides)}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
