"""Stacked seeds against separate runs (issue 44): wall time of S seeds of a detector trained one after the other
(``sift.training.train``, as the main job did) and stacked in one process (``sift.training.train_stacked``), on
the main job's trajectories, with the main job's run configs (epoch and step caps, batch sizes).

    python scripts/bench_seed_stack.py --work /tmp/bench_stack                  # default preset, sift + text_sift
    python scripts/bench_seed_stack.py --work /tmp/bench_stack --repeats 3 --detectors sift
    python scripts/bench_seed_stack.py --work /tmp/bench_stack --job /tmp/fs_q3  # a main job's trajectories
    python scripts/bench_seed_stack.py --work /tmp/x --step             # the training step alone, random inputs

``--step``: one SIFTNet training step (forward + backward) of S seeds, each on its own batch (B traces, T steps,
the default preset's shapes), separately and stacked, with and without dropout: where the time goes without the
run around it. ``--job``: a main job's output folder whose corpus and trajectories are reused (default: build
the preset's into ``<work>/job`` first, or reuse them from an earlier call). Each repeat trains both settings
afresh (separate first, then stacked) and prints wall time, CPU time and the ratio stacked / separate; the summary
gives the ratio's median and range over the repeats, and whether each seed's stacked run stopped where its
separate run did.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import torch

from sift.config import compose
from sift.faithshift import RunSpec, build_corpus, extract, train_config
from sift.training import train, train_stacked


def timed(fn) -> tuple[float, float, object]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def step_bench(seeds: int, batch: int, steps: int, channels: int, iters: int) -> None:
    """Mean seconds of one training step of ``seeds`` SIFTNets, separate and stacked (best of two rounds)."""
    from sift.detectors.sift_model import SIFTNet

    g = torch.Generator().manual_seed(0)
    inputs = []
    for _ in range(seeds):
        lengths = torch.randint(steps // 4, steps + 1, (batch,), generator=g)
        inputs.append((torch.randn(batch, steps, channels, generator=g), torch.arange(steps)[None] < lengths[:, None]))
    for dropout in (0.1, 0.0):
        torch.manual_seed(0)
        nets = [SIFTNet(channels, dropout=dropout).train() for _ in range(seeds)]
        gens = [torch.Generator().manual_seed(s) for s in range(seeds)] if dropout else None

        def separate(nets=nets) -> None:
            for n, (x, m) in zip(nets, inputs):
                logits, z = n(x, m)
                (logits.sum() + z.sum()).backward()

        def stacked(nets=nets, gens=gens) -> None:
            logits, z = SIFTNet.stacked_forward(nets, inputs, gens, steps)
            (logits.sum() + z.sum()).backward()

        best = {}
        for _ in range(2):
            for f in (separate, stacked):
                f()
                t = time.perf_counter()
                for _ in range(iters):
                    f()
                best[f.__name__] = min(best.get(f.__name__, float("inf")), (time.perf_counter() - t) / iters)
        ratio = best["stacked"] / best["separate"]
        print(f"[bench] step of {seeds} SIFTNets (B {batch}, T {steps}, dropout {dropout}): separate "
              f"{best['separate']:.3f} s, stacked {best['stacked']:.3f} s, ratio {ratio:.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="scratch folder")
    ap.add_argument("--job", type=Path, default=None, help="a main job's folder to take the trajectories from")
    ap.add_argument("--preset", default="full", help="the main job's preset (its run configs and data)")
    ap.add_argument("--detectors", default="sift,text_sift")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the machine's cores)")
    ap.add_argument("--gpu", action="store_true", help="train on the GPU (trainer=gpu)")
    ap.add_argument("--override", action="append", default=[], help="extra main-job override (repeatable)")
    ap.add_argument("--step", action="store_true", help="time the training step alone (random inputs) and stop")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.step:
        # the default preset's step: 10 environments x env_batch_size 16 traces, at most 36 steps (32 CoT + answer
        # line), 9 descriptor channels
        step_bench(len(a.seeds.split(",")), 160, 36, 9, iters=4)
        return
    job = a.job or a.work / "job"
    cfg = compose("faithshift", [f"preset={a.preset}", f"paths.output_dir={job}", "wandb=false", "mechanisms=null",
                                 f"torch_threads={a.threads}", *(["train_overrides=[trainer=gpu]"] if a.gpu else []),
                                 *a.override])
    if a.job is None:
        print(f"[bench] corpus and trajectories of preset={a.preset} in {job} (reused when there)", flush=True)
        build_corpus(cfg, job)
        extract(cfg, job)
    seeds = [int(s) for s in a.seeds.split(",")]
    rows: dict[str, list[float]] = {}
    for rep in range(a.repeats):
        for d in a.detectors.split(","):
            runs = {}
            for setting in ("separate", "stacked"):
                specs = [RunSpec(f"{setting}/{d}/seed{s}", "main", d, s, [f"detector={d}"]) for s in seeds]
                cfgs = []
                for spec in specs:
                    c = train_config(cfg, job, spec)
                    c.paths.output_dir = str(a.work / "runs" / spec.key)
                    c.paths.ckpt_dir = str(a.work / "runs" / spec.key / "checkpoints")
                    shutil.rmtree(c.paths.output_dir, ignore_errors=True)
                    cfgs.append(c)
                if setting == "separate":
                    wall, cpu, recs = timed(lambda cfgs=cfgs: [train(c) for c in cfgs])
                else:
                    wall, cpu, recs = timed(lambda cfgs=cfgs: train_stacked(cfgs))
                runs[setting] = (wall, cpu, recs)
                steps = [r["global_step"] for r in recs]
                aurocs = [round(r["metrics"].get("test/auroc", float("nan")), 3) for r in recs]
                print(f"[bench] repeat {rep + 1} {d} {setting:8s}: {wall:7.1f} s wall, {cpu:7.1f} s CPU; steps per "
                      f"seed {steps}; test AUROC {aurocs}", flush=True)
            ratio = runs["stacked"][0] / runs["separate"][0]
            same_stop = [a_["global_step"] == b_["global_step"] for a_, b_ in zip(runs["stacked"][2],
                                                                                   runs["separate"][2])]
            rows.setdefault(d, []).append(ratio)
            print(f"[bench] repeat {rep + 1} {d}: stacked / separate = {ratio:.3f} (wall); CPU "
                  f"{runs['stacked'][1] / runs['separate'][1]:.3f}; same stop step per seed {same_stop}", flush=True)
    print("\n| detector | seeds | repeats | stacked / separate wall time: median | min | max |")
    print("|---|---|---|---|---|---|")
    for d, r in rows.items():
        print(f"| {d} | {len(seeds)} | {len(r)} | {statistics.median(r):.3f} | {min(r):.3f} | {max(r):.3f} |")


if __name__ == "__main__":
    main()
