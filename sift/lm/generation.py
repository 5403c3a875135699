"""Batched generation with a KV cache for any HF causal LM (the organism included).

Prompts are token-id lists (already templated); they are left-padded into one batch so that every row's
new tokens start at the same position. The exact generated ids are returned, so hidden states can later
be extracted from precisely the tokens the model produced (never from re-tokenised text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Generation:
    prompt_ids: list[int]
    new_ids: list[int]  # generated ids, eos excluded


def left_padded(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad token id lists into (ids, attention_mask, position_ids); positions count real tokens only."""
    width = max(len(p) for p in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, p in enumerate(seqs):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate_ids(model, prompts: Sequence[Sequence[int]], *, pad_id: int, eos_id: int, max_new_tokens: int,
                 do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                 batch_size: int = 256) -> list[Generation]:
    """Greedy (default) or seeded sampling; batches of ``batch_size`` prompts, left padding, KV cache."""
    model.eval()
    device = next(model.parameters()).device
    out: list[Generation] = []
    for start in range(0, len(prompts), batch_size):
        chunk = [list(p) for p in prompts[start:start + batch_size]]
        ids, mask, _ = left_padded(chunk, pad_id)
        width = ids.shape[1]
        kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_id, use_cache=True)
        if do_sample:
            torch.manual_seed(seed + start)
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        else:
            kwargs.update(do_sample=False)
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
        new = gen[:, width:].tolist()
        for p, row in zip(chunk, new):
            cut = row.index(eos_id) if eos_id in row else len(row)
            row = row[:cut]
            while row and row[-1] == pad_id:
                row.pop()
            out.append(Generation(p, row))
    return out
