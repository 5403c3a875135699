#!/usr/bin/env python
"""SIFT inference throughput (traces/s) at the paper architecture (Table 7), reference vs fast paths.

    python scripts/bench_sift_throughput.py                          # CPU, batch 512, T=64 full length, C=9
    python scripts/bench_sift_throughput.py --lengths /tmp/traj750   # lengths of a real trajectory cache
    python scripts/bench_sift_throughput.py --impl fast int8 --threads 1 --iters 20
    python scripts/bench_sift_throughput.py --device cuda --impl reference

Implementations (``--impl``, several allowed; default all three):

* ``reference``: ``SIFTNet.eval()`` under ``torch.inference_mode`` (the training module; torch's nested-tensor
  fast path skips padding inside the transformer);
* ``fast``: :class:`sift.detectors.fast_inference.SIFTInference`, the same function (BatchNorm folded, one fused
  TCN convolution, SDPA, length-bucketed chunks); the script checks it against ``reference`` on the timed batch
  (max |Δlogit| printed; it fails above 1e-4);
* ``int8``: ``fast`` with dynamic int8 quantisation of every Linear (approximate; max |ΔP| vs fp32 printed).

Lengths (``--lengths``): ``full`` (every trace T_max steps, the worst case), ``random`` (uniform in
[T_max/4, T_max]), or a path: a trajectory cache written by ``sift-extract`` (number of binned steps per
trace, from the shards' ``bin_offsets``) or a corpus ``traces.jsonl`` (CoT token count per trace clamped to
T_max, which is what extraction bins to). Lengths are drawn from that distribution for the batch.

Also printed (CPU): a roofline, the fast path's FLOPs per trace (``torch.utils.flop_counter``) against this
machine's measured fp32 GEMM rate, i.e. the most traces/s any fp32 implementation of the architecture can reach
here; it says whether a target is a matter of code or of cores. The GEMM rate is measured on the fast path's own
linear-layer matmuls (the ``mm`` shapes and counts one call on the timed batch performs,
:func:`sift.bench.gemm_shapes`; the attention's small batched products, ``bmm`` with a 16-wide inner dimension, run
at a fraction of that rate and are left out so that they cannot lower the yardstick), after a warm-up, as the best
of ``--roofline-repeats`` repeats with operands and outputs allocated once (:func:`sift.bench.gemm_rate`); the
min–max spread is printed next to it, so a disturbed run shows as one. ``--profile`` adds where one call's time
goes, by operator group, against what each group's FLOPs would take at that rate.

Defaults: T_max = 64 steps (``configs/extract.yaml``) and C = 9 channels (the organism: 4 blocks → 3 velocities,
4 drifts, EC, attention stability). Reported: wall-clock traces/s (median of ``--iters`` batches after
``--warmup`` untimed ones, with the best and the min–max spread) and traces per CPU-second of this process (on a
shared machine, the rate the busy wall clock cannot show).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def lengths_from(path: str, t_max: int) -> tuple[torch.Tensor, int | None]:
    """Per-trace step counts from a trajectory cache folder (shards) or a corpus ``traces.jsonl``;
    also the cache's channel count (None for a corpus)."""
    p = Path(path)
    if p.is_dir():
        from safetensors import safe_open

        shards = sorted(p.rglob("shard-*.safetensors"))
        if not shards:
            raise SystemExit(f"bench: no shard-*.safetensors under {p}")
        ns, channels = [], None
        for s in shards:
            with safe_open(str(s), "pt") as f:
                off = f.get_tensor("bin_offsets")
                meta = f.metadata() or {}
            ns.append(off[1:] - off[:-1])
            if channels is None and "channels" in meta:
                channels = len(json.loads(meta["channels"])) + 1  # + early commitment (added by the DataModule)
        return torch.cat(ns).clamp(max=t_max), channels
    n = []
    with open(p) as fh:
        for line in fh:
            r = json.loads(line)
            a, b = r["cot_span"]
            n.append(int(b) - int(a))
    return torch.tensor(n).clamp(min=1, max=t_max), None


def _time(fn, x, mask, iters: int, warmup: int, sync):
    """(wall, cpu) :class:`sift.bench.Spread` of ``iters`` calls after ``warmup`` untimed ones."""
    from sift.bench import repeat

    def call():
        fn(x, mask)
        sync()

    t = repeat(call, repeats=iters, warmup=warmup)
    return t.wall, t.cpu


def flops_per_trace(fn, x: torch.Tensor, mask: torch.Tensor) -> float:
    """Floating-point operations of one call per trace (torch's FlopCounterMode: matmuls, convolutions,
    attention; elementwise ops are not counted, so this is a lower bound of the work)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(x, mask)
    return counter.get_total_flops() / x.shape[0]


def gemm_rate(fn=None, x=None, mask=None, repeats: int = 7, warmup_s: float = 0.5):
    """This machine's fp32 GEMM rate on the matmuls one call ``fn(x, mask)`` performs (without ``fn``: SIFT's typical
    shape, [4096, 128] @ [128, 384]), best of ``repeats`` after a warm-up: a :class:`sift.bench.GemmRate`."""
    from sift.bench import gemm_rate as measure
    from sift.bench import gemm_shapes

    gemms = gemm_shapes(fn, x, mask) if fn is not None else None
    if gemms:  # the linear layers' matmuls: the attention's small batched products run far below the GEMM rate and
        gemms = {g: n for g, n in gemms.items() if g[0] == "mm"} or gemms  # must not lower the yardstick
    return measure(gemms or None, repeats=repeats, warmup_s=warmup_s)


#: the profile's operator groups (torch.profiler names), in print order
PROFILE_GROUPS = {
    "linear layers (addmm, mm)": ("aten::addmm", "aten::mm"),
    "attention products (bmm, baddbmm)": ("aten::bmm", "aten::baddbmm",
                                          "aten::_scaled_dot_product_flash_attention_for_cpu"),  # (SDPA's kernel)
    "softmax": ("aten::_softmax",),  # (inside SDPA's kernel, where it is used, it counts as attention)
    "layout copies (head split/merge, windows)": ("aten::copy_", "aten::index", "aten::constant_pad_nd", "aten::cat"),
    "layer norms, residual adds, activations": ("aten::native_layer_norm", "aten::add", "aten::add_", "aten::mul",
                                                "aten::clamp_min_", "aten::relu_", "aten::gelu", "aten::masked_fill_"),
}


def profile_breakdown(fn, x, mask, rate: float, repeats: int = 3) -> list[dict]:
    """Where one call's time goes, by operator group (torch.profiler self CPU time of the calling thread, which
    includes its intra-op workers), against what the group's FLOPs (:func:`sift.bench.gemm_shapes`) would take at
    the roofline's GEMM ``rate``: the excess is what is bound by something other than FLOPs."""
    from torch.profiler import ProfilerActivity, profile

    from sift.bench import gemm_flops, gemm_shapes

    gemms = gemm_shapes(fn, x, mask)
    flops = {"linear layers (addmm, mm)": sum(gemm_flops(g) * n for g, n in gemms.items() if g[0] == "mm"),
             "attention products (bmm, baddbmm)": sum(gemm_flops(g) * n for g, n in gemms.items() if g[0] == "bmm")}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fn(x, mask)
    ms = {e.key: e.self_cpu_time_total / 1e3 / repeats for e in prof.key_averages()}
    rows, seen = [], set()
    for group, ops in PROFILE_GROUPS.items():
        t = sum(ms.get(o, 0.0) for o in ops)
        seen.update(ops)
        f = flops.get(group, 0)
        rows.append({"group": group, "ms": t, "gflop": f / 1e9, "ms_at_roofline": 1e3 * f / rate,
                     "gflop_per_s": f / 1e6 / t if t and f else None})
    rest = sum(v for k, v in ms.items() if k not in seen)
    rows.append({"group": "everything else (dispatch, views, allocation)", "ms": rest, "gflop": 0.0,
                 "ms_at_roofline": 0.0, "gflop_per_s": None})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--t-max", type=int, default=64)
    ap.add_argument("--channels", type=int, default=None, help="default: the cache's, else 9")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lengths", default="full", help="full | random | PATH (trajectory cache or traces.jsonl)")
    ap.add_argument("--impl", nargs="+", choices=("reference", "fast", "int8"),
                    default=["reference", "fast", "int8"])
    ap.add_argument("--chunk", type=int, default=None,
                    help="fast/int8: traces per length bucket (default: the engine's DEFAULT_CHUNK; 0 = one)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--roofline-repeats", type=int, default=7, help="timed repeats of the GEMM rate (best is kept)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON line per implementation only")
    ap.add_argument("--profile", action="store_true",
                    help="CPU: also print where the fast path's time goes against the roofline, by operator group")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    from sift.detectors.fast_inference import SIFTInference
    from sift.detectors.sift_model import SIFTNet

    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    g = torch.Generator().manual_seed(a.seed)
    cache_channels = None
    if a.lengths == "full":
        lengths = torch.full((a.batch,), a.t_max)
        src = "full"
    elif a.lengths == "random":
        lengths = torch.randint(max(1, a.t_max // 4), a.t_max + 1, (a.batch,), generator=g)
        src = "random"
    else:
        pool, cache_channels = lengths_from(a.lengths, a.t_max)
        lengths = pool[torch.randint(0, len(pool), (a.batch,), generator=g)]
        src = (f"{a.lengths} (n={len(pool)}, mean {pool.float().mean():.1f}, median {pool.median().item()}, "
               f"max {pool.max().item()})")
    C = a.channels or cache_channels or 9
    T = int(lengths.max())
    net = SIFTNet(C).to(dev)
    with torch.no_grad():  # non-trivial BatchNorm statistics (a trained model has them; folding must use them)
        net.train()
        for _ in range(3):
            net(torch.randn(64, 32, C, device=dev) * 1.5 + 0.2, torch.ones(64, 32, dtype=torch.bool, device=dev))
    net.eval()
    x = torch.randn(a.batch, T, C, device=dev, generator=None)
    mask = torch.arange(T, device=dev)[None, :] < lengths.to(dev)[:, None]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def reference(x, mask):
        with torch.inference_mode():
            return net(x, mask)

    impls = {"reference": reference}
    if "fast" in a.impl or "int8" in a.impl:
        impls["fast"] = SIFTInference(net, chunk=a.chunk).to(dev)
    if "int8" in a.impl:
        if dev.type != "cpu":
            raise SystemExit("bench: --impl int8 (dynamic quantisation) runs on CPU only")
        impls["int8"] = SIFTInference(net, chunk=a.chunk, int8=True)
    ref_logits = reference(x, mask)[0]
    fast_logits = impls["fast"](x, mask)[0] if "fast" in impls else None
    results = []
    roofline = None
    if dev.type == "cpu" and "fast" in impls:
        fl = flops_per_trace(impls["fast"], x, mask)
        measured = gemm_rate(impls["fast"], x, mask, repeats=a.roofline_repeats)
        rate = measured.rate.best
        roofline = {"flops_per_trace": fl, "gemm_flops_per_s": rate, "max_traces_per_s": rate / fl,
                    "gemm_rate": measured.as_dict()}
    for name in a.impl:
        fn = impls[name]
        check = ""
        if name == "fast":
            d = (fast_logits - ref_logits).abs().max().item()
            if d > 1e-4:
                raise SystemExit(f"bench: fast path differs from the reference by {d:.2e} (> 1e-4)")
            check = f"max |Δlogit| vs reference {d:.1e}"
        elif name == "int8":
            dp = (torch.sigmoid(fn(x, mask)[0]) - torch.sigmoid(ref_logits)).abs().max().item()
            check = f"max |ΔP| vs fp32 {dp:.1e}"
        wall, cpu = _time(fn, x, mask, a.iters, a.warmup, sync)
        med, cpu_med = wall.median, cpu.median
        rates = wall.rate(a.batch)
        res = {"impl": name, "traces_per_s": a.batch / med, "best_traces_per_s": rates.best,
               "traces_per_s_spread": rates.as_dict(),
               "traces_per_cpu_s": a.batch / cpu_med if dev.type == "cpu" and cpu_med > 0 else None,
               "batch": a.batch, "t_max": a.t_max, "mean_len": float(lengths.float().mean()),
               "lengths": src, "channels": C, "device": str(dev), "threads": torch.get_num_threads(),
               "median_batch_s": med, "check": check, "torch": torch.__version__,
               "parameters": sum(p.numel() for p in net.parameters()), "roofline": roofline}
        results.append(res)
        if a.json:
            print(json.dumps(res))
        else:
            print(f"SIFT {name:9s}: {res['traces_per_s']:8,.0f} traces/s (median of {a.iters}; best "
                  f"{rates.best:,.0f}, min–max {rates.min:,.0f}–{rates.max:,.0f})"
                  + (f", {res['traces_per_cpu_s']:,.0f} traces/CPU-s" if res["traces_per_cpu_s"] else "")
                  + (f"; {check}" if check else ""))
    if not a.json:
        print(f"  on {dev}, {torch.get_num_threads()} threads, batch {a.batch}, C={C}, T_max={a.t_max}, lengths "
              f"{src}, batch mean length {res['mean_len']:.1f}, {res['parameters']:,} parameters, torch "
              f"{torch.__version__}")
        if roofline:
            g = measured.rate
            print(f"  roofline: {roofline['flops_per_trace'] / 1e6:.1f} MFLOP per trace (fast path, matmul/conv/"
                  f"attention only); this machine's fp32 GEMM rate at {torch.get_num_threads()} threads on the fast "
                  f"path's own {sum(measured.gemms.values())} matmuls ({len(measured.gemms)} shapes): best "
                  f"{g.best / 1e9:.1f} GFLOP/s of {len(g.values)} repeats after a warm-up (min / median / max "
                  f"{g.min / 1e9:.1f} / {g.median / 1e9:.1f} / {g.max / 1e9:.1f}) → at most "
                  f"{roofline['max_traces_per_s']:,.0f} traces/s in fp32 for this architecture")
        if roofline and a.profile:
            rows = profile_breakdown(impls["fast"], x, mask, roofline["gemm_flops_per_s"])
            total = sum(r["ms"] for r in rows)
            print(f"  profile of one fast-path call (torch.profiler, mean of 3): {total:.0f} ms; its FLOPs at the "
                  f"roofline rate: {sum(r['ms_at_roofline'] for r in rows):.0f} ms")
            for r in rows:
                rate = f"{r['gflop_per_s']:6.1f} GFLOP/s" if r["gflop_per_s"] else " " * 13
                print(f"    {r['group']:46s} {r['ms']:7.1f} ms {100 * r['ms'] / total:5.1f} %  {rate}  "
                      f"at roofline {r['ms_at_roofline']:6.1f} ms  excess {r['ms'] - r['ms_at_roofline']:6.1f} ms")
    return results


if __name__ == "__main__":
    main()
