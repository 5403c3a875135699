"""Where the CoT edits of a real-LM corpus landed, and how its labels fall per model (issue 26's must-shows).

    python scripts/check_edit_spans.py <corpus_dir>                  # counts
    python scripts/check_edit_spans.py <corpus_dir> --list           # and every edit that missed the model's result
    python scripts/check_edit_spans.py <corpus_dir> --sample 20 --seed 0   # and 20 random traces per φ* class,
                                                                          # in full, for a hand check of the labels

For every trace with ``verification.edit_span`` the edited text is classed as a step or list label (``Step 4``,
``4.``), inside a clause that names the cue ("A Stanford professor thinks the answer is 135"), on a line of an
option list the CoT copies ("(B) implausible: ..."), a number copied from the prompt that no equation of the CoT
computes (approximate: the prompt's numbers without the cue's value), or the model's own result. It reads corpora
built before issue 26 (``edit_span`` only: the "before" count) and after (the "after" count). Then per model: the
label reasons, the φ* balance and, where present, the intervention agreement of the manifest.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def edit_class(record: dict) -> str | None:
    """label | cue | option_list | premise | result for a traced edit, None when the trace has no edit."""
    from sift.lm.edit_targets import computed_values, cue_sentence_spans, label_spans, on_option_line, question_numbers

    v = record.get("verification") or {}
    span = v.get("edit_span")
    if not span:
        return None
    cot, (s, e) = record.get("cot") or "", span
    text = cot[s:e]
    if any(a <= s < b for a, b in label_spans(cot)):
        return "label"
    if any(a <= s < b for a, b in cue_sentence_spans(cot)):
        return "cue"
    if on_option_line(cot, s):
        return "option_list"
    from sift.lm.parsing import first_number

    value = first_number(text)
    prompt_numbers = question_numbers(record.get("prompt") or "") - {str((record.get("cue") or {}).get("value"))}
    if value is not None and value in prompt_numbers and value not in computed_values(cot):
        return "premise"
    return "result"


def _user_turn(prompt: str) -> str:
    """The prompt's last user message (the chat template's markers dropped)."""
    start = prompt.rfind("<|im_start|>user")
    text = prompt[start + len("<|im_start|>user"):] if start >= 0 else prompt
    return text.split("<|im_end|>")[0].strip()


def trace_text(r: dict) -> str:
    """One trace as a reviewer reads it: the question, the CoT with the edited span in [[ ]], the answer, gold and
    cue, each test's result and the rule that gave the label."""
    v = r.get("verification") or {}
    cot = r.get("cot") or ""
    for s, e in sorted(v.get("edit_spans") or ([v["edit_span"]] if v.get("edit_span") else []), reverse=True):
        cot = f"{cot[:s]}[[{cot[s:e]}]]{cot[e:]}"  # the edited result and each restatement
    tests = {k: v[k] for k in ("edit_original", "edit_value", "edit_answer", "mistake", "early", "cue_value",
                                "cue_answer", "rationalised", "verdicts", "mentions_cue") if k in v}
    return (f"=== {r['trace_id']}  φ*={r.get('phi')}  reason={v.get('reason')}  "
            f"cot_necessary={r.get('cot_necessary')}\n"
            f"--- question\n{_user_turn(r.get('prompt') or '')}\n--- CoT\n{cot.strip()}\n"
            f"--- answer {r.get('answer')!r}  gold {r.get('gold_answer')!r}  cue {r.get('cue')}  "
            f"forced {r.get('forced_answer')}\n--- tests {json.dumps(tests, ensure_ascii=False)}\n"
            f"--- rule: {v.get('rule')}\n")


def sample(records: list[dict], n: int, seed: int) -> list[dict]:
    """``n`` random labelled traces per φ* class (fewer where a class has fewer), φ*=0 first."""
    import random

    rng = random.Random(seed)
    out = []
    for phi in (0, 1):
        pool = [r for r in records if r.get("phi") == phi]
        out += rng.sample(pool, min(n, len(pool)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus_dir", type=Path)
    ap.add_argument("--list", action="store_true", help="print every edit that did not hit the model's own result")
    ap.add_argument("--sample", type=int, default=0, help="print this many random traces per φ* class in full")
    ap.add_argument("--seed", type=int, default=0, help="the random draw of --sample")
    args = ap.parse_args(argv)
    from sift.corpus.store import read_jsonl

    path = args.corpus_dir / "traces.jsonl"
    if not path.is_file():
        print(f"check_edit_spans: {path} does not exist", file=sys.stderr)
        return 2
    records = read_jsonl(path)
    classes = Counter()
    for r in records:
        c = edit_class(r)
        if c is None:
            continue
        classes[c] += 1
        if args.list and c != "result":
            v = r["verification"]
            s, e = v["edit_span"]
            cot = r["cot"]
            print(f"[{c}] {r['trace_id']} ({v.get('reason')}): ...{cot[max(0, s - 60):s]}[[{cot[s:e]}]]"
                  f"{cot[e:e + 30]}...".replace("\n", " / "))
    edits = sum(classes.values())
    bad = edits - classes["result"]
    print(f"{len(records)} traces, {edits} edits: {dict(classes)}; on a label, cue, option list or premise: {bad} "
          f"({bad / edits:.1%} of edits)" if edits else f"{len(records)} traces, no edits")
    per_model: dict[str, Counter] = defaultdict(Counter)
    phi: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        per_model[r["family"]][(r.get("verification") or {}).get("reason")] += 1
        phi[r["family"]][str(r.get("phi"))] += 1
    for fam in sorted(per_model):
        p = phi[fam]
        lab = p["0"] + p["1"]
        print(f"\n{fam}: φ*=1 {p['1']}, φ*=0 {p['0']} ({p['0'] / lab:.1%} of {lab} labelled), ambiguous {p['None']}"
              if lab else f"\n{fam}: nothing labelled")
        for reason, n in per_model[fam].most_common():
            print(f"  {n:5d}  {reason}")
    man = args.corpus_dir / "manifest.json"
    if man.is_file():
        agree = json.loads(man.read_text()).get("intervention_agreement")
        if agree:
            print("\nintervention agreement (n, agreement, κ) per model and domain:")
            for fam, doms in agree.items():
                for dom, pairs in doms.items():
                    cells = ", ".join(f"{k} {v['n']}/{v['agreement']}/{v['kappa']}" for k, v in pairs.items()
                                      if v["n"])
                    print(f"  {fam} {dom}: {cells or 'no pair of tests ran'}")
    if args.sample:
        print(f"\n{args.sample} random traces per φ* class (seed {args.seed}):\n")
        for r in sample(records, args.sample, args.seed):
            print(trace_text(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
