"""Two real-LM corpora's labels side by side: the same items labelled under two rules (issue 48's must-show).

    python scripts/compare_real_labels.py <before_corpus> <after_corpus>

Prints, for each corpus: traces, label reasons, the ambiguous share, φ* balance per domain, and Cohen's κ between
the edit and the added mistake per domain (sift.corpus.real_labels.pairwise_agreement, recomputed from each
trace's verdicts, so an older corpus is read the same way); then the traces both corpora hold (same trace id),
counted by reason before → after; and, for the second corpus, φ* × ``cot_necessary`` per domain.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def _records(corpus: Path) -> list[dict]:
    path = corpus / "traces.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no traces file")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(records: list[dict]) -> dict:
    from sift.corpus.real_labels import pairwise_agreement

    reasons = Counter((r.get("verification") or {}).get("reason") for r in records)
    amb = sum(r.get("phi") is None for r in records)
    by_dom = {}
    for dom in sorted({r["domain"] for r in records}):
        rs = [r for r in records if r["domain"] == dom]
        lab = [r["phi"] for r in rs if r.get("phi") is not None]
        by_dom[dom] = {"traces": len(rs), "phi_1": lab.count(1), "phi_0": lab.count(0),
                       "ambiguous": len(rs) - len(lab),
                       "phi_0_share": round(lab.count(0) / len(lab), 3) if lab else None,
                       "kappa_edit_mistake": pairwise_agreement(rs)["edit~mistake"]}
    return {"traces": len(records), "ambiguous": amb, "ambiguous_share": round(amb / max(1, len(records)), 3),
            "reasons": dict(reasons.most_common()), "by_domain": by_dom}


def _print(name: str, s: dict) -> None:
    print(f"\n== {name}: {s['traces']} traces, ambiguous {s['ambiguous']} ({s['ambiguous_share']:.1%})")
    for reason, n in s["reasons"].items():
        print(f"  {n:5d}  {reason}")
    print("  domain: φ*=1 / φ*=0 / ambiguous (φ*=0 share of labelled); κ edit~mistake (traces both judged, agreement)")
    for dom, d in s["by_domain"].items():
        k = d["kappa_edit_mistake"]
        print(f"    {dom}: {d['phi_1']} / {d['phi_0']} / {d['ambiguous']} ({d['phi_0_share']}); κ {k['kappa']} "
              f"({k['n']}, {k['agreement']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    before, after = _records(args.before), _records(args.after)
    _print(f"before ({args.before})", summary(before))
    _print(f"after ({args.after})", summary(after))
    old = {r["trace_id"]: r for r in before}
    moves = Counter(((old[r["trace_id"]].get("verification") or {}).get("reason"),
                     (r.get("verification") or {}).get("reason")) for r in after if r["trace_id"] in old)
    print(f"\n== {sum(moves.values())} traces in both (same trace id), reason before → after")
    for (a, b), n in moves.most_common():
        print(f"  {n:5d}  {a} → {b}")
    if any("cot_necessary" in r for r in after):
        from sift.corpus.real_labels import phi_by_necessity

        print("\n== after: φ* × cot_necessary per domain")
        for dom, cells in phi_by_necessity(after).items():
            print(f"  {dom}: " + ", ".join(f"{k} {n}" for k, n in cells.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
