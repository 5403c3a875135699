"""Re-verify chosen traces of a real-LM corpus with the current label code, on the model that wrote them.

    SIFT_CACHE=... python scripts/reverify_traces.py <corpus_dir> [<trace_id> ...]

Loads the corpus's first model as the corpus did (its manifest's config), re-runs every intervention on each named
trace (sift.corpus.verify.verify) and prints its label, reason, edit spans and verdicts next to the stored ones;
also lists the causal-truncation traces whose stored forced answer was cut by the token limit inside a number
(sift.corpus.sources.hf.cut_at_limit: such an answer is unparsable under the current code). A trace's re-verified
label is what the current rule says about the *same* generation; altering traces that a rebuilt corpus would
derive from changed base labels are not rebuilt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    from sift.corpus.config import HFCorpusConfig
    from sift.corpus.sources.hf import LMVerifier, cut_at_limit, lm_source, load_corpus_items
    from sift.corpus.store import read_jsonl
    from sift.corpus.verify import verify
    from sift.lm.prompts import ANSWER_PREFIX, LMView

    corpus, ids = Path(argv[0]), argv[1:]
    m = json.loads((corpus / "manifest.json").read_text())
    cfg = HFCorpusConfig(**m["config"])
    recs = {r["trace_id"]: r for r in read_jsonl(corpus / "traces.jsonl")}
    src = lm_source(cfg, m["config_hash"], 0)
    prefix = src.encode(ANSWER_PREFIX)
    trunc = [r for r in recs.values() if r["condition"] == "causal_truncation"]
    cut = []
    for r in trunc:
        tail = r["generated_ids"][r["cot_span"][1]:]
        ans = tail[len(prefix):] if tail[:len(prefix)] == prefix else tail
        if cut_at_limit(ans, src.decode(ans), cfg.answer_tokens):
            cut.append(r)
    print(f"causal_truncation traces: {len(trunc)}; forced answer cut at {cfg.answer_tokens} tokens inside a "
          f"number: {len(cut)}")
    for r in cut:
        print(f"  {r['trace_id']}: φ*={r['phi']} ({r['verification']['reason']}), "
              f"{src.decode(r['generated_ids'][r['cot_span'][1]:])!r}")
    missing = [t for t in ids if t not in recs]
    if missing:
        print(f"reverify_traces: not in {corpus}: {missing}", file=sys.stderr)
        return 2
    chosen = [dict(recs[t]) for t in ids]
    old = {r["trace_id"]: (r["phi"], r["verification"]["reason"]) for r in chosen}
    views = [LMView(**{**r["view"], "order": tuple(r["view"]["order"]) if r["view"].get("order") else None})
             for r in chosen]
    verify(LMVerifier(src, cfg), chosen, views, {it.item_id: it for it in load_corpus_items(cfg)})
    for r in chosen:
        v = r["verification"]
        print(f"{r['trace_id']}: stored φ*={old[r['trace_id']][0]} ({old[r['trace_id']][1]}) -> φ*={r['phi']} "
              f"({v['reason']}); edit {v.get('edit_original_value')} -> {v.get('edit_value')}, answer "
              f"{v.get('edit_answer')}; edited {[r['cot'][s:e] for s, e in v.get('edit_spans') or []]}; "
              f"verdicts {v['verdicts']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
