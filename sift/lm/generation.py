"""Batched generation with a KV cache for any HF causal LM (the organism included), and generation backends.

Prompts are token-id lists (already templated); they are left-padded into one batch so that every row's
new tokens start at the same position. The exact generated ids are returned, so hidden states can later
be extracted from precisely the tokens the model produced (never from re-tokenised text).

Sampling is seeded per prompt: each row draws its tokens from its own random stream (:class:`RowSampler`),
so a prompt's sampled continuation does not depend on the batch it lands in, its position there or its
neighbours (up to float rounding of padded batches).

Free generation goes through a backend (:func:`make_backend`): :class:`HFBackend` (transformers, any device)
or :class:`sift.lm.vllm_backend.VLLMBackend` (vLLM, GPU). Verification and hidden-state extraction stay in
transformers (teacher-forced) whichever backend generated the tokens.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sift.errors import SiftError

SEED_MASK = (1 << 63) - 1


@dataclass(frozen=True)
class Generation:
    prompt_ids: list[int]
    new_ids: list[int]  # generated ids, eos excluded


def trace_seed(key: str, seed: int) -> int:
    """A 63-bit sampling seed for one trace: SHA-256 of the run seed and the trace's key (stable across runs)."""
    digest = hashlib.sha256(f"{int(seed)}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & SEED_MASK


def cache_arg(model) -> str:
    """The name of ``model.forward``'s KV-cache argument: ``cache`` (transformers ≥ 5.2x) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def cache_of(res):
    """The KV cache of a forward pass's output, under either name."""
    return getattr(res, "cache", None) if hasattr(res, "cache") else res.past_key_values


def left_padded(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad token id lists into (ids, attention_mask, position_ids); positions count real tokens only."""
    width = max(len(p) for p in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, p in enumerate(seqs):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


class RowSampler:
    """Samples each row from its own seeded stream (temperature, then top-p, then an inverse-CDF draw).

    A row's scores are turned into probabilities with temperature and top-p; one uniform number from the row's
    ``torch.Generator`` (always on the CPU, so draws are the same on every device) picks the token by inverse CDF
    over the kept tokens, sorted by probability. Each row consumes exactly one draw per step while it is
    generating, so its t-th token depends only on its seed and its own scores, whatever the batch around it.
    Called as a ``transformers`` logits processor it returns scores that are ``-inf`` everywhere but at the drawn
    token, so greedy decoding emits exactly that token.
    """

    def __init__(self, seeds: Sequence[int], *, temperature: float = 1.0, top_p: float = 1.0):
        if not temperature > 0:
            raise SiftError(f"sampling temperature must be > 0 (got {temperature}); use greedy decoding instead")
        if not 0 < top_p <= 1:
            raise SiftError(f"top_p must be in (0, 1] (got {top_p})")
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.generators = []
        for s in seeds:
            g = torch.Generator(device="cpu")
            g.manual_seed(int(s) & SEED_MASK)
            self.generators.append(g)

    def draws(self, rows: Sequence[int] | None = None) -> torch.Tensor:
        """One uniform in [0, 1) per row (all rows, or the given ones), each from the row's own stream (float64)."""
        gens = self.generators if rows is None else [self.generators[r] for r in rows]
        return torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in gens])

    def choose(self, scores: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
        """The drawn token per row of ``scores`` ([rows, vocab]); ``rows`` names the seed of each score row."""
        n = len(self.generators) if rows is None else len(rows)
        if scores.shape[0] != n:
            raise SiftError(f"RowSampler has {n} seeds but the batch has {scores.shape[0]} rows")
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        sp, si = probs.sort(dim=-1, descending=True, stable=True)
        mass_before = sp.cumsum(-1) - sp
        sp = sp * (mass_before < self.top_p)  # the smallest prefix whose mass reaches top_p (the top token always)
        cdf = sp.double().cumsum(-1)
        target = self.draws(rows).to(cdf.device).unsqueeze(-1) * cdf[:, -1:]
        pos = torch.searchsorted(cdf, target, right=True)
        kept = (sp > 0).sum(-1, keepdim=True)
        pos = torch.minimum(pos, (kept - 1).clamp(min=0))
        return si.gather(-1, pos).squeeze(-1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        token = self.choose(scores).unsqueeze(-1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, token, 0.0)


def _eos_list(eos_id: int | Sequence[int]) -> list[int]:
    return [int(eos_id)] if isinstance(eos_id, int) else [int(e) for e in eos_id]


def _forward_kwargs(model) -> dict:
    """Ask for the last position's logits only where the model supports it (a prompt's full logits are large)."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def _select_rows(cache, keep: torch.Tensor):
    """The KV cache restricted to the rows ``keep`` (a Cache object in place, or a legacy tuple rebuilt)."""
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(keep)
        return cache
    return tuple(tuple(t[keep] for t in layer) for layer in cache)


@torch.no_grad()
def _decode_batch(model, chunk: list[list[int]], *, pad_id: int, eos: list[int], max_new_tokens: int,
                  sampler: RowSampler | None) -> list[list[int]]:
    """Greedy or seeded decoding of one left-padded batch with a KV cache; a row leaves the batch when it ends.

    Rows that emitted an eos are dropped from the cache, so the remaining steps cost only the rows still
    generating (``model.generate`` keeps every row until the longest one ends, padding the finished ones).
    Scores are the last position's logits in float32, as in ``model.generate``; greedy picks the first arg max.
    """
    device = next(model.parameters()).device
    ids, mask, pos = (t.to(device) for t in left_padded(chunk, pad_id))
    cache_name, extra = cache_arg(model), _forward_kwargs(model)
    res = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **extra)
    out: list[list[int]] = [[] for _ in chunk]
    active = list(range(len(chunk)))  # the batch row each cache row belongs to
    last = pos[:, -1:]
    for step in range(max_new_tokens):
        scores = res.logits[:, -1, :].float()
        tokens = sampler.choose(scores, active) if sampler is not None else scores.argmax(-1)
        keep = []
        for j, t in enumerate(tokens.tolist()):
            if t not in eos:
                out[active[j]].append(t)
                keep.append(j)
        if not keep or step == max_new_tokens - 1:
            break
        cache = cache_of(res)
        if len(keep) < len(active):
            sel = torch.tensor(keep, device=device)
            cache, mask, last, tokens = _select_rows(cache, sel), mask[sel], last[sel], tokens[sel]
            active = [active[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
        last = last + 1
        res = model(input_ids=tokens.unsqueeze(-1), attention_mask=mask, position_ids=last, use_cache=True,
                    **{cache_name: cache}, **extra)
    return out


def generate_ids(model, prompts: Sequence[Sequence[int]], *, pad_id: int, eos_id: int | Sequence[int],
                 max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
                 seeds: Sequence[int] | None = None, seed: int | None = None,
                 batch_size: int = 256) -> list[Generation]:
    """Greedy (default) or per-prompt seeded sampling; batches of ``batch_size`` prompts, left padding, KV cache.

    With ``do_sample``, ``seeds`` gives one seed per prompt (see :func:`trace_seed`); a prompt's sample is then
    the same in any batch. The old ``seed=`` keyword still works: without ``seeds`` the prompts get
    ``trace_seed(str(i), seed)`` by index ``i`` (so they then depend on the prompt's index in ``prompts``).
    ``eos_id`` may be one id or several (generation stops at any of them; none is returned). The returned ids
    are exactly the tokens generated (greedy: the same as ``model.generate(do_sample=False)`` without the
    model's own generation config, such as a repetition penalty).
    """
    if do_sample:
        if seeds is None:
            base = 0 if seed is None else seed
            seeds = [trace_seed(str(i), base) for i in range(len(prompts))]
        if len(seeds) != len(prompts):
            raise SiftError(f"{len(seeds)} seeds for {len(prompts)} prompts; sampling needs one seed per prompt")
    if max_new_tokens < 1:
        raise SiftError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
    eos = _eos_list(eos_id)
    model.eval()
    out: list[Generation] = []
    for start in range(0, len(prompts), batch_size):
        chunk = [list(p) for p in prompts[start:start + batch_size]]
        sampler = (RowSampler(seeds[start:start + batch_size], temperature=temperature, top_p=top_p)
                   if do_sample else None)
        new = _decode_batch(model, chunk, pad_id=pad_id, eos=eos, max_new_tokens=max_new_tokens, sampler=sampler)
        out += [Generation(p, row) for p, row in zip(chunk, new)]
    return out


class HFBackend:
    """Free generation with a transformers model: prompts batched by length, results in input order."""

    kind = "hf"

    def __init__(self, model, *, pad_id: int, eos_id: int | Sequence[int], batch_size: int = 64):
        self.model, self.pad_id, self.eos_id, self.batch_size = model, pad_id, eos_id, int(batch_size)

    @classmethod
    def from_tokenizer(cls, model, tokenizer, *, batch_size: int = 64) -> HFBackend:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(model, pad_id=pad, eos_id=tokenizer.eos_token_id, batch_size=batch_size)

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0,
                 seeds: Sequence[int] | None = None) -> list[list[int]]:
        """New ids per prompt (eos excluded), in the order of ``prompts``; ``seeds`` (one per prompt) to sample."""
        if do_sample and (seeds is None or len(seeds) != len(prompts)):
            raise SiftError("sampling needs one seed per prompt (seeds=...)")
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[list[int] | None] = [None] * len(prompts)
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            gens = generate_ids(self.model, [prompts[i] for i in idx], pad_id=self.pad_id, eos_id=self.eos_id,
                                max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
                                top_p=top_p, seeds=[seeds[i] for i in idx] if do_sample else None,
                                batch_size=self.batch_size)
            for i, g in zip(idx, gens):
                out[i] = g.new_ids
        return out  # type: ignore[return-value]


BACKENDS = ("hf", "vllm")


def make_backend(kind: str, model_name_or_path: str | None = None, model=None, tokenizer=None, *,
                 batch_size: int = 64, device: str = "cpu", dtype: str | None = None, **kw):
    """A generation backend: ``hf`` (the loaded ``model`` + ``tokenizer``) or ``vllm`` (loads
    ``model_name_or_path`` itself, a GGUF file through its converted folder; extra ``kw`` go to ``vllm.LLM``)."""
    if kind == "hf":
        if model is None or tokenizer is None:
            raise SiftError("the hf generation backend needs a loaded model and tokenizer")
        if kw:
            raise SiftError(f"unknown options for the hf generation backend: {sorted(kw)}")
        return HFBackend.from_tokenizer(model, tokenizer, batch_size=batch_size)
    if kind == "vllm":
        if model_name_or_path is None:
            raise SiftError("the vllm generation backend needs the model's name or path")
        from sift.lm.vllm_backend import VLLMBackend

        eos = tokenizer.eos_token_id if tokenizer is not None else None
        return VLLMBackend(model_name_or_path, eos_id=eos, dtype=dtype, device=device, batch_size=batch_size, **kw)
    raise SiftError(f"unknown generation backend {kind!r}; expected one of {', '.join(BACKENDS)}")
