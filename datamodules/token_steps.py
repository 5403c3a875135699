"""Per-step token ids of a trace, the input of the ``text_sift`` control (:mod:`sift.detectors.text_sift`).

A trace's text is three segments of the model's own token ids, in order:

=========  =================================================================  ==================================
segment    tokens                                                             steps
=========  =================================================================  ==================================
0 prompt   ``prompt_ids`` + ``generated_ids[:cot_span[0]]``                   one per token, at most
                                                                              ``prompt_steps``
1 CoT      ``generated_ids[cot_span[0]:cot_span[1]]``                         exactly the descriptor sequence's
                                                                              steps (``n_bins``, ≤ ``t_max``)
2 answer   ``generated_ids[cot_span[1]:]``                                    one per token, at most
                                                                              ``answer_steps``
=========  =================================================================  ==================================

A segment of ``n`` tokens in ``m < n`` steps is cut into equal-width bins exactly as the descriptors are
(:func:`sift.trajectories.descriptors.bin_index`: token ``t`` falls in bin ``⌊t·m/n⌋``), so step ``k`` of the CoT
segment covers the same tokens as descriptor step ``k``. Each step holds the ids of its tokens (``−1`` pads a
step to the widest step); its segment id travels beside it. Empty segments take no step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sift.trajectories.descriptors import bin_starts

PROMPT, COT, ANSWER = 0, 1, 2
SEGMENTS = ("prompt", "cot", "answer")


def bin_bounds(n_tokens: int, n_steps: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of the ``min(n_steps, n_tokens)`` bins of a segment of ``n_tokens`` tokens."""
    m = min(int(n_steps), int(n_tokens))
    if m <= 0:
        return []
    starts = bin_starts(int(n_tokens), m) + [int(n_tokens)]
    return [(starts[b], starts[b + 1]) for b in range(m)]


def bins(ids: Sequence[int], n_steps: int) -> list[list[int]]:
    """``ids`` in ``min(n_steps, len(ids))`` contiguous bins of (almost) equal width (the descriptors' binning)."""
    return [list(ids[a:b]) for a, b in bin_bounds(len(ids), n_steps)]


def token_steps(prompt: Sequence[int], cot: Sequence[int], answer: Sequence[int], *, cot_steps: int,
                prompt_steps: int = 64, answer_steps: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [S, K] int32, −1 = no token; segment [S] int8)`` of one trace (module docstring)."""
    segs = [np.asarray(t, dtype=np.int64).reshape(-1) for t in (prompt, cot, answer)]
    bounds = [bin_bounds(len(t), m) for t, m in zip(segs, (prompt_steps, cot_steps, answer_steps))]
    S = sum(len(b) for b in bounds)
    K = max([1, *(b - a for bb in bounds for a, b in bb)])
    ids = np.full((S, K), -1, dtype=np.int32)
    seg = np.empty(S, dtype=np.int8)
    i = 0
    for s, (t, bb) in enumerate(zip(segs, bounds)):
        for a, b in bb:
            ids[i, :b - a] = t[a:b]
            seg[i] = s
            i += 1
    return torch.from_numpy(ids), torch.from_numpy(seg)


def record_token_steps(record: dict, cot_steps: int, prompt_steps: int = 64, answer_steps: int = 8
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_steps` of a corpus record (``prompt_ids``, ``generated_ids``, ``cot_span``)."""
    gen = list(record.get("generated_ids") or [])
    c0, c1 = (int(v) for v in record.get("cot_span") or (0, len(gen)))
    return token_steps(list(record.get("prompt_ids") or []) + gen[:c0], gen[c0:c1], gen[c1:], cot_steps=cot_steps,
                       prompt_steps=prompt_steps, answer_steps=answer_steps)


def pad_token_steps(ids: Sequence[torch.Tensor], seg: Sequence[torch.Tensor], S: int | None = None,
                    K: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack per-trace ``ids [S_i, K_i]`` / ``segment [S_i]`` (or per-batch ``[B_i, S_i, K_i]`` / ``[B_i, S_i]``)
    into ``[B, S, K]`` long (−1 padding) and ``[B, S]`` long (−1 on padded steps)."""
    ids3 = [i if i.dim() == 3 else i[None] for i in ids]
    seg2 = [s if s.dim() == 2 else s[None] for s in seg]
    B = sum(i.shape[0] for i in ids3)
    S = max([S or 0, *(i.shape[1] for i in ids3)])
    K = max([K or 1, *(i.shape[2] for i in ids3)])
    dev = ids3[0].device if ids3 else None
    out = torch.full((B, S, K), -1, dtype=torch.long, device=dev)
    so = torch.full((B, S), -1, dtype=torch.long, device=dev)
    r = 0
    for i, s in zip(ids3, seg2):
        n = i.shape[0]
        out[r:r + n, :i.shape[1], :i.shape[2]] = i.long()
        so[r:r + n, :s.shape[1]] = s.long()
        r += n
    return out, so


__all__ = ["ANSWER", "COT", "PROMPT", "SEGMENTS", "bin_bounds", "bins", "pad_token_steps", "record_token_steps",
           "token_steps"]
