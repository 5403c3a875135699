"""Benchmark sift's trajectory extraction against a plain batched forward pass, and its memory as N grows.

Prints
* time(sift extraction) / time(plain forward with output_hidden_states=True) on the same traces, model,
  batches and padding (target ≤ 1.10 for ``extract_corpus``), for the in-memory extractor and for the whole
  ``extract_corpus`` pipeline (Lightning predict loop + shard writing); both without the counterfactual
  interventions, which are extra forward passes by design (their cost is printed separately). The three paths run
  ``--repeats`` times interleaved in a rotating order, and each ratio is the median of the per-repeat ratios with
  its min–max: on a machine whose speed drifts by 15 % between seconds, adjacent runs compare fairly;
* with ``--profile N``: the N operators (torch.profiler, self CPU time) where ``extract_corpus`` spends most
  beyond the plain forward;
* peak RSS of ``extract_corpus`` in fresh subprocesses for N and 4N traces (target: differ by < 25%), also as
  the growth over the RSS after imports and model loading.

Usage (the trained organism; any corpus made by ``sift-corpus``)::

    python scripts/bench_extraction.py --corpus outputs/corpus --models-dir checkpoints/organism --n 2000
    python scripts/bench_extraction.py --n 400            # random-init toy organism + rendered toy corpus
    python scripts/bench_extraction.py --skip-memory --profile 15   # ratios and where the extra time goes
    python scripts/bench_extraction.py --models-dir checkpoints/organism --skip-time \
        --memory-corpora outputs/corpus750 outputs/corpus3000   # peak RSS on two whole corpora
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _records_for(corpus: Path | None, n: int, family: str) -> list[dict]:
    from sift.trajectories.cache import iter_records
    from sift.trajectories.toy import toy_records

    if corpus is None:
        recs = toy_records(max(1, n // 7 + 1), families=(family,))
    else:
        recs = [r for r in iter_records(corpus / "traces.jsonl") if r.get("family") == family]
    while len(recs) < n:  # repeat to reach n
        recs = recs + recs
    return recs[:n]


def _model(models_dir: Path | None, family: str, width: int, layers: int):
    from sift.trajectories.toy import toy_model, toy_tokenizer

    if models_dir is None:
        return toy_model(family, width=width, layers=layers, heads=4), toy_tokenizer()
    from sift.lm.loading import load_causal_lm

    return load_causal_lm(str(models_dir / family))


def _write_corpus(records: list[dict], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "traces.jsonl", "w") as fh:
        for i, r in enumerate(records):
            fh.write(json.dumps({**r, "trace_id": f"{r['trace_id']}#{i}"}) + "\n")
    (out / "pairs.jsonl").write_text("")
    return out


def time_ratio(args) -> None:
    import torch

    from sift.bench import Spread, repeat
    from sift.trajectories.extract import ExtractConfig, Extractor, plain_forward
    from sift.trajectories.predict import extract_corpus

    torch.set_num_threads(args.threads)
    recs = _records_for(args.corpus, args.n, args.family)
    model, tok = _model(args.models_dir, args.family, args.width, args.layers)
    cfg = ExtractConfig(batch_size=args.batch_size, shard_size=args.shard_size, interventions=[])
    ex = Extractor(model, cfg, tokenizer=tok)
    tok_count = sum(len(r["prompt_ids"]) + len(r["generated_ids"]) for r in recs)
    print(f"{len(recs)} traces ({tok_count} tokens), model {args.family} "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params), batch {args.batch_size}, "
          f"{torch.get_num_threads()} thread(s)")

    def plain():
        plain_forward(model, recs, ex.pad_id, args.batch_size, cfg.padding_side)

    order = sorted(range(len(recs)), key=lambda i: len(recs[i]["prompt_ids"]) + len(recs[i]["generated_ids"]))
    batches = [[recs[i] for i in order[s:s + args.batch_size]] for s in range(0, len(order), args.batch_size)]

    def plain_batch(b):  # plain_forward's pass over one of its batches
        plain_forward(model, b, ex.pad_id, len(b), cfg.padding_side)

    @torch.no_grad()
    def core_batch(b):  # the same batch through the in-memory extractor
        ex.extract(b)

    def core():
        for b in batches:
            core_batch(b)

    with tempfile.TemporaryDirectory() as tmp:
        corpus = _write_corpus(recs, Path(tmp) / "corpus")
        model_path = str(args.models_dir / args.family) if args.models_dir else "toy"
        k = [0]

        def pipeline():
            k[0] += 1
            extract_corpus(corpus, Path(tmp) / f"out{k[0]}", {args.family: model_path}, cfg,
                           loaded={args.family: (model, tok)})

        def interventions():
            from sift.trajectories.interventions import intervention_profiles

            ex.cfg.interventions = ["cot_deleted", "first_step_edit", "step_dropped"]
            try:
                intervention_profiles(ex, recs, torch.zeros(len(recs)))
            finally:
                ex.cfg.interventions = []

        def timed(fn, *a) -> tuple[float, float]:
            t0, c0 = time.perf_counter(), time.process_time()
            fn(*a)
            return time.perf_counter() - t0, time.process_time() - c0

        plain(), core(), pipeline()  # warm-up
        keys = ("plain", "pipeline", "plain_b", "core")
        wall: dict[str, list[float]] = {k: [] for k in keys}
        cpu: dict[str, list[float]] = {k: [] for k in keys}
        for r in range(args.repeats):
            # whole passes, plain and extract_corpus back to back (alternating which goes first) ...
            for name, fn in ((("plain", plain), ("pipeline", pipeline))[::1 if r % 2 else -1]):
                w, c = timed(fn)
                wall[name].append(w)
                cpu[name].append(c)
            # ... and the in-memory extractor against the plain forward batch by batch, alternating
            acc = {"plain_b": [0.0, 0.0], "core": [0.0, 0.0]}
            for i, b in enumerate(batches):
                for name, fn in ((("plain_b", plain_batch), ("core", core_batch))[::1 if (r + i) % 2 else -1]):
                    w, c = timed(fn, b)
                    acc[name][0] += w
                    acc[name][1] += c
            for name, (w, c) in acc.items():
                wall[name].append(w)
                cpu[name].append(c)
        t_int = repeat(interventions, repeats=1, warmup=0).wall.best
        if args.profile:
            profile_ops({"plain": plain, "pipeline": pipeline}, args.profile)
    print(f"{args.repeats} repeats; time: median (min–max); ratio to the plain forward: median (min–max) of the "
          f"per-repeat ratios, whole passes back to back for extract_corpus, batch by batch for the in-memory "
          f"extractor")
    print("                                           wall s                  CPU s                   "
          "ratio (wall)            ratio (CPU)")
    for k, base, label in (("plain", None, "plain forward (output_hidden_states=True):"),
                           ("core", "plain_b", "sift extraction, in memory:               "),
                           ("pipeline", "plain", "sift extract_corpus (predict loop+shards):")):
        w, c = Spread(tuple(wall[k])), Spread(tuple(cpu[k]))
        ratios = ""
        if base:
            rw = Spread(tuple(a / b for a, b in zip(wall[k], wall[base])))
            rc = Spread(tuple(a / b for a, b in zip(cpu[k], cpu[base])))
            ratios = f"  {_med(rw)}  {_med(rc)}"
        print(f"{label} {_med(w)}  {_med(c)}{ratios}")
    extra = t_int / Spread(tuple(wall["plain"])).median
    print(f"counterfactual interventions (3, extra):   {t_int:7.3f} s  (+{extra:.2f}× the forward; extra passes by "
          f"design, not in the ratio)")


def _med(s) -> str:
    return f"{s.median:6.3f} ({s.min:.3f}–{s.max:.3f})"


def profile_ops(fns: dict, top: int, rounds: int = 3) -> None:
    """torch.profiler: self CPU time per operator of each function (``rounds`` calls each, interleaved, averaged), and
    the operators where the second function spends the most beyond the first: what extraction does beyond a plain
    forward. Operators both run equally often (the model's own) differ by noise only; their net difference is
    printed as the noise level."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    got: dict[str, dict[str, list[float]]] = {k: defaultdict(lambda: [0.0, 0]) for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
            for e in prof.key_averages():
                got[name][e.key][0] += e.self_cpu_time_total / 1e3 / rounds
                got[name][e.key][1] += e.count / rounds
    a, b = list(fns)
    tot = {k: sum(t for t, _ in v.values()) for k, v in got.items()}
    ops = sorted(set(got[a]) | set(got[b]), key=lambda k: -(got[b][k][0] - got[a][k][0]))
    added = [k for k in ops if got[b][k][1] > got[a][k][1]]
    same = [k for k in ops if got[b][k][1] == got[a][k][1]]
    print(f"profile (torch.profiler, self CPU ms, mean of {rounds} interleaved calls each; the profiler's own per-call "
          f"cost inflates both): {a} {tot[a]:.0f} ms, {b} {tot[b]:.0f} ms; operators {b} calls more often: "
          f"+{sum(got[b][k][0] - got[a][k][0] for k in added):.0f} ms; operators both call equally often (the "
          f"model's own: noise): {sum(got[b][k][0] - got[a][k][0] for k in same):+.0f} ms")
    print(f"  {'operator':44s} {a + ' ms':>10s} {b + ' ms':>12s} {'extra ms':>9s}  calls")
    for k in added[:top]:
        x, y = got[a][k], got[b][k]
        print(f"  {k[:44]:44s} {x[0]:10.1f} {y[0]:12.1f} {y[0] - x[0]:9.1f}  {x[1]:.0f} → {y[1]:.0f}")
    for k in [k for k in ops if got[b][k][1] < got[a][k][1]]:  # work extraction leaves out
        x, y = got[a][k], got[b][k]
        print(f"  {k[:44]:44s} {x[0]:10.1f} {y[0]:12.1f} {y[0] - x[0]:9.1f}  {x[1]:.0f} → {y[1]:.0f}  (fewer calls)")


def memory_child(args) -> None:
    """Run in a fresh process: RSS after imports + model load, then peak RSS over extract_corpus."""
    import torch

    from sift.trajectories.extract import ExtractConfig
    from sift.trajectories.predict import extract_corpus

    torch.set_num_threads(args.threads)
    model, tok = _model(args.models_dir, args.family, args.width, args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = str(args.models_dir / args.family) if args.models_dir else "toy"
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        extract_corpus(args.child_corpus, Path(tmp) / "out", {args.family: model_path},
                       ExtractConfig(batch_size=args.batch_size, shard_size=args.shard_size),
                       loaded={args.family: (model, tok)}, families=[args.family])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"base_kb": base, "peak_kb": peak}))


def _peak(corpus: Path, args) -> dict:
    """Peak RSS of extracting ``corpus`` (one family) in a fresh subprocess."""
    cmd = [sys.executable, __file__, "--memory-child", str(corpus), "--family", args.family,
           "--batch-size", str(args.batch_size), "--shard-size", str(args.shard_size),
           "--width", str(args.width), "--layers", str(args.layers), "--threads", str(args.threads)]
    if args.models_dir:
        cmd += ["--models-dir", str(args.models_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    if res.returncode:
        sys.exit(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def memory_corpora(args) -> None:
    """Peak RSS of extracting two whole corpus folders (e.g. 750 and 3,000 base items)."""
    small, large = args.memory_corpora
    n = {c: sum(1 for line in open(c / "traces.jsonl") if f'"family": "{args.family}"' in line) for c in (small, large)}
    a, b = _peak(small, args), _peak(large, args)
    print(f"peak RSS  {small} ({n[small]} {args.family} traces): {a['peak_kb'] / 1024:.0f} MiB   "
          f"{large} ({n[large]} traces): {b['peak_kb'] / 1024:.0f} MiB   "
          f"differ {100 * (b['peak_kb'] / a['peak_kb'] - 1):+.1f}% (target < 25%)")
    print(f"growth over imports+model: {(a['peak_kb'] - a['base_kb']) / 1024:.0f} MiB vs "
          f"{(b['peak_kb'] - b['base_kb']) / 1024:.0f} MiB")


def memory(args) -> None:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (args.n, 4 * args.n):
            corpus = _write_corpus(_records_for(args.corpus, n, args.family), Path(tmp) / f"c{n}")
            out[n] = _peak(corpus, args)
    a, b = out[args.n], out[4 * args.n]
    ga, gb = a["peak_kb"] - a["base_kb"], b["peak_kb"] - b["base_kb"]
    print(f"peak RSS  N={args.n}: {a['peak_kb'] / 1024:.0f} MiB   4N={4 * args.n}: {b['peak_kb'] / 1024:.0f} MiB   "
          f"differ {100 * (b['peak_kb'] / a['peak_kb'] - 1):+.1f}% (target < 25%)")
    print(f"growth over imports+model: N: {ga / 1024:.0f} MiB   4N: {gb / 1024:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=400, help="traces (memory: N and 4N)")
    ap.add_argument("--corpus", type=Path, default=None, help="a sift-corpus folder (default: a rendered toy corpus)")
    ap.add_argument("--models-dir", type=Path, default=None,
                    help="folder with <family>/ HF models (default: random toy)")
    ap.add_argument("--family", default="gpt2")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--shard-size", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=15, help="interleaved timed repeats of each path")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print the N operators where extract_corpus spends most beyond the plain forward")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-time", action="store_true")
    ap.add_argument("--memory-corpora", type=Path, nargs=2, metavar=("SMALL", "LARGE"), default=None,
                    help="peak RSS on two whole sift-corpus folders (e.g. 750 and 3,000 base items) instead of N/4N")
    ap.add_argument("--memory-child", type=Path, default=None, dest="child_corpus", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_corpus is not None:
        return memory_child(args)
    if not args.skip_time:
        time_ratio(args)
    if args.memory_corpora:
        memory_corpora(args)
    elif not args.skip_memory:
        memory(args)


if __name__ == "__main__":
    main()
