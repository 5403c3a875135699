#!/usr/bin/env python
"""SIFT inference throughput (traces/s) at the paper architecture (Table 7).

    python scripts/bench_sift_throughput.py                      # CPU, batch 512, T=64, C=9, all threads
    python scripts/bench_sift_throughput.py --threads 1 --lengths random
    python scripts/bench_sift_throughput.py --device cuda

Defaults: T_max = 64 steps and C = 9 channels (the organism: 4 blocks → 3 velocities, 4 drifts, EC,
attention stability). ``--lengths full`` times every trace at T_max (worst case); ``random`` draws lengths
uniformly in [T_max/4, T_max] (padding is skipped by the transformer's nested-tensor fast path in eval).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--t-max", type=int, default=64)
    ap.add_argument("--channels", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lengths", choices=("full", "random"), default="full")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    from sift.detectors.features import organism_channel_names
    from sift.detectors.sift_model import SIFTNet

    torch.manual_seed(0)
    dev = torch.device(a.device)
    net = SIFTNet(a.channels).to(dev).eval()
    x = torch.randn(a.batch, a.t_max, a.channels, device=dev)
    if a.lengths == "full":
        lengths = torch.full((a.batch,), a.t_max, device=dev)
    else:
        lengths = torch.randint(max(1, a.t_max // 4), a.t_max + 1, (a.batch,), device=dev)
    mask = torch.arange(a.t_max, device=dev)[None, :] < lengths[:, None]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        for _ in range(a.warmup):
            net(x, mask)
        sync()
        times, cpu = [], []
        for _ in range(a.iters):
            t0, c0 = time.perf_counter(), time.process_time()
            net(x, mask)
            sync()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    times.sort()
    cpu.sort()
    med = times[len(times) // 2]
    cpu_med = cpu[len(cpu) // 2]
    res = {"traces_per_s": a.batch / med, "batch": a.batch, "t_max": a.t_max, "channels": a.channels,
           "lengths": a.lengths, "device": str(dev), "threads": torch.get_num_threads(),
           "median_batch_s": med, "best_traces_per_s": a.batch / times[0],
           # CPU seconds of this process (all its threads): on a shared machine, batch/cpu_s estimates the
           # one-core rate the wall clock cannot show (× threads for an idle machine, if scaling were ideal)
           "traces_per_cpu_s": a.batch / cpu_med if dev.type == "cpu" and cpu_med > 0 else None,
           "parameters": sum(p.numel() for p in net.parameters()), "torch": torch.__version__,
           "channel_names": organism_channel_names(4) if a.channels == 9 else None}
    if a.json:
        print(json.dumps(res))
    else:
        print(f"SIFT inference: {res['traces_per_s']:,.0f} traces/s (median of {a.iters}; best "
              f"{res['best_traces_per_s']:,.0f}) on {dev} with {res['threads']} threads, batch {a.batch}, "
              f"T={a.t_max} ({a.lengths} lengths), C={a.channels}, {res['parameters']:,} parameters"
              + (f"; {res['traces_per_cpu_s']:,.0f} traces per CPU-second" if res["traces_per_cpu_s"] else ""))
    return res


if __name__ == "__main__":
    main()
