"""What one forward pass of a real model costs on this machine, by dtype and batch size: prefill and decode step.

For each dtype and batch size: one prefill over ``batch × prompt_len`` random token ids, then ``steps`` decode
steps of one token per row with the KV cache (``logits_to_keep=1``, as sift's loop decodes). Prints CPU seconds
(comparable on a busy machine) and wall seconds, with tokens/s of each. This is the measurement behind
``dtype: auto`` (bfloat16 where the CPU computes it natively) and real_small's ``source.batch_size``.

    python scripts/bench_decode_step.py --model /m/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --dtypes float32 bfloat16 --batch-sizes 1 8 32 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def _measure(model, batch: int, prompt_len: int, steps: int, vocab: int) -> dict[str, float]:
    from sift.lm.generation import cache_arg, cache_of

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, min(vocab, 5000), (batch, prompt_len), generator=g)
    name = cache_arg(model)
    with torch.no_grad():
        w, c = time.perf_counter(), time.process_time()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        pre_wall, pre_cpu = time.perf_counter() - w, time.process_time() - c
        cache, nxt = cache_of(out), out.logits[:, -1].argmax(-1, keepdim=True)
        w, c = time.perf_counter(), time.process_time()
        for _ in range(steps):
            out = model(input_ids=nxt, use_cache=True, logits_to_keep=1, **{name: cache})
            cache, nxt = cache_of(out), out.logits[:, -1].argmax(-1, keepdim=True)
        dec_wall, dec_cpu = (time.perf_counter() - w) / steps, (time.process_time() - c) / steps
    return {"batch": batch, "prefill_cpu_s": round(pre_cpu, 3), "prefill_wall_s": round(pre_wall, 3),
            "prefill_tokens_per_wall_s": round(batch * prompt_len / pre_wall, 1),
            "decode_step_cpu_ms": round(1000 * dec_cpu, 1), "decode_step_wall_ms": round(1000 * dec_wall, 1),
            "decode_tokens_per_wall_s": round(batch / dec_wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="hub name in the local cache, a local folder or a .gguf file")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from sift.lm.loading import load_causal_lm, resolve_dtype
    from sift.lm.states import model_dims

    rows = []
    for dtype in args.dtypes:
        model, _ = load_causal_lm(args.model, dtype=dtype)
        vocab = model_dims(model)["vocab_size"]
        for b in args.batch_sizes:
            row = {"dtype": resolve_dtype(dtype), **_measure(model, b, args.prompt_len, args.steps, vocab)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del model
    print(json.dumps({"model": args.model, "threads": args.threads, "prompt_len": args.prompt_len,
                      "auto_dtype_here": resolve_dtype("auto"), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
