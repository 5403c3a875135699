"""The organism's sampler: greedy where the model is sure, a seeded draw at its choice points.

At each generated position the nucleus is the smallest set of tokens whose probability reaches ``top_p``.
A nucleus of one token is taken as is (the model is sure there). A larger nucleus is a *choice point*:
the token is drawn from the nucleus with the model's own (renormalised) probabilities by inverse CDF over
the candidates in vocabulary order, i.e. top-p sampling. What is special is only the random number: it
is the uniform number of the row's random stream keyed by the candidate set and how often that set has
come up in the row, not by the position. The corpus keys streams by item and sampling seed, so every view
of one item (and both families) makes the same draw at the organism's designed choice point (the CoT's
``hmm``/``ok`` opener, sift.organism.render), whatever else differs between the views: common random numbers,
so a preserving view differs from its base only in what the axis changes.

Each row's mechanism latent (sift.organism.latent) is injected from its first generated position on (``offset``) or
from its answer line on (``answer_routing``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from sift.lm.generation import cache_arg as _cache_arg
from sift.lm.generation import cache_of as _cache_of
from sift.lm.generation import left_padded
from sift.organism.latent import DEFAULT_KIND, injected


def stream_uniform(stream: str, k: int) -> float:
    """The ``k``-th number in [0, 1) of a named random stream (platform independent)."""
    digest = hashlib.sha256(f"{stream}#{k}".encode()).digest()
    return int.from_bytes(digest[:7], "big") / float(1 << 56)


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Token ids of the smallest set whose probability reaches ``top_p``, in vocabulary order."""
    p, idx = probs.sort(descending=True)
    keep = int((p.cumsum(0) < top_p).sum().item()) + 1
    return idx[:keep].sort().values


@torch.no_grad()
def sample_choice_points(model, prompts: Sequence[Sequence[int]], streams: Sequence[str], *, pad_id: int,
                         eos_id: int, max_new_tokens: int, top_p: float | None = 0.75, batch_size: int = 256,
                         latents: Sequence[float] | None = None, starts: Sequence[int] | None = None,
                         kind: str = DEFAULT_KIND) -> list[list[int]]:
    """Generate with a KV cache; returns the new ids of each prompt (eos excluded). ``latents``: each prompt's
    mechanism latent value (None: no latent), injected from position ``starts[i]`` on (default: the first
    generated position) as mechanism ``kind`` (sift.lm.latent.MECHANISM_KINDS); ``top_p=None``: the top token
    everywhere (greedy, no draws)."""
    if len(streams) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(streams)} random streams")
    if latents is not None and len(latents) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(latents)} latent values")
    if top_p is not None and not 0.0 < top_p < 1.0:
        raise ValueError(f"top_p must lie in (0, 1) or be None (greedy), got {top_p}")
    model.eval()
    device = next(model.parameters()).device
    cache_arg = _cache_arg(model)
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = [list(p) for p in prompts[start:start + batch_size]]
        keys = list(streams[start:start + batch_size])
        vals = None if latents is None else list(latents[start:start + batch_size])
        st = [len(p) for p in chunk] if starts is None else list(starts[start:start + batch_size])
        with injected(model, vals, st, kind=kind):
            out += _sample_chunk(model, chunk, keys, pad_id, eos_id, max_new_tokens, top_p, device, cache_arg)
    return out


def _sample_chunk(model, chunk: list[list[int]], keys: list[str], pad_id: int, eos_id: int, max_new_tokens: int,
                  top_p: float | None, device, cache_arg: str) -> list[list[int]]:
    ids, mask, pos = (t.to(device) for t in left_padded(chunk, pad_id))
    res = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    n = len(chunk)
    seen: list[dict[tuple[int, ...], int]] = [{} for _ in range(n)]
    new: list[list[int]] = [[] for _ in range(n)]
    done = torch.zeros(n, dtype=torch.bool, device=device)
    pos = pos[:, -1:]
    for _ in range(max_new_tokens):
        probs = res.logits[:, -1].float().softmax(-1)
        top, nxt = probs.max(-1)
        unsure = torch.zeros_like(done) if top_p is None else (top < top_p) & ~done
        for i in torch.nonzero(unsure).flatten().tolist():
            cand = nucleus(probs[i], top_p)
            key = tuple(cand.tolist())
            k = seen[i].get(key, 0)
            seen[i][key] = k + 1
            u = stream_uniform(f"{keys[i]}|{','.join(map(str, key))}", k)
            cdf = (probs[i][cand] / probs[i][cand].sum()).cumsum(0)
            nxt[i] = cand[min(int((cdf <= u).sum().item()), len(cand) - 1)]
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        for i, t in enumerate(nxt.tolist()):
            if not done[i] and t != eos_id:
                new[i].append(t)
        done |= nxt == eos_id
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
        pos = pos + 1
        res = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, use_cache=True,
                    **{cache_arg: _cache_of(res)})
    return new
