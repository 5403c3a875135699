"""Batched generation with a KV cache for any HF causal LM (the organism included), and generation backends.

Prompts are token-id lists (already templated); they are decoded with a fixed number of rows in flight, left-padded
under an attention mask, each row with its own positions; a finished row's place goes to the next prompt. The exact
generated ids are returned, so hidden states can later be extracted from precisely the tokens the model produced
(never from re-tokenised text).

Sampling is seeded per prompt: each row draws its tokens from its own random stream (:class:`RowSampler`),
so a prompt's sampled continuation does not depend on the batch it lands in, its position there or its
neighbours (up to float rounding of padded batches).

Free generation goes through a backend (:func:`make_backend`): :class:`HFBackend` (transformers, any device),
:class:`sift.lm.vllm_backend.VLLMBackend` (vLLM, GPU) or :class:`sift.lm.llamacpp_backend.LlamaCppBackend`
(llama.cpp on the ``.gguf`` file, CPU). Verification and hidden-state extraction stay in transformers
(teacher-forced) whichever backend generated the tokens.
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


def _growing_layers(cache) -> list | None:
    """The cache's layers if each is a plain growing key/value layer (rows can then be merged in), else None."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # pragma: no cover - older transformers: no refill, finished rows still leave
        return None
    layers = getattr(cache, "layers", None)
    ok = layers and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)
    return layers if ok else None


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``t`` with zeros prepended along ``dim`` up to ``width``."""
    short = width - t.shape[dim]
    if short <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = short
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class _Batch:
    """The rows being decoded: prompt indices, their KV cache, attention mask, last positions and next scores."""

    def __init__(self, model, prompts: list[list[int]], rows: list[int], pad_id: int, extra: dict):
        device = next(model.parameters()).device
        ids, self.mask, pos = (t.to(device) for t in left_padded([prompts[r] for r in rows], pad_id))
        res = model(input_ids=ids, attention_mask=self.mask, position_ids=pos, use_cache=True, **extra)
        self.rows, self.last, self.cache = list(rows), pos[:, -1:], cache_of(res)
        self.scores = res.logits[:, -1, :].float()

    def keep(self, keep: list[int]) -> None:
        """Keep the rows at positions ``keep``; drop key/value columns that no remaining row attends to."""
        if len(keep) < len(self.rows):
            sel = torch.tensor(keep, device=self.mask.device)
            if hasattr(self.cache, "batch_select_indices"):
                self.cache.batch_select_indices(sel)
            else:  # a legacy tuple cache
                self.cache = tuple(tuple(t[sel] for t in layer) for layer in self.cache)
            self.mask, self.last, self.scores = self.mask[sel], self.last[sel], self.scores[sel]
            self.rows = [self.rows[j] for j in keep]
        layers = _growing_layers(self.cache)
        first = int(self.mask.any(0).nonzero()[0]) if self.rows else 0
        if layers is not None and first > 0:
            self.mask = self.mask[:, first:]
            for layer in layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    def can_merge(self) -> bool:
        return _growing_layers(self.cache) is not None

    def merge(self, other: _Batch) -> None:
        """Append ``other``'s rows: both caches left-padded (masked) to the wider one, then stacked."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(_growing_layers(self.cache), _growing_layers(other.cache)):
            mine.keys = torch.cat([_left_pad(mine.keys, width, 2), _left_pad(theirs.keys, width, 2)])
            mine.values = torch.cat([_left_pad(mine.values, width, 2), _left_pad(theirs.values, width, 2)])
        self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(other.mask, width, 1)])
        self.last = torch.cat([self.last, other.last])
        self.scores = torch.cat([self.scores, other.scores])
        self.rows += other.rows

    def step(self, model, tokens: torch.Tensor, cache_name: str, extra: dict) -> None:
        """Feed one token per row; the next scores are the last position's logits in float32."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)
        self.last = self.last + 1
        res = model(input_ids=tokens.unsqueeze(-1), attention_mask=self.mask, position_ids=self.last, use_cache=True,
                    **{cache_name: self.cache}, **extra)
        self.cache, self.scores = cache_of(res), res.logits[:, -1, :].float()


@torch.no_grad()
def _decode(model, prompts: list[list[int]], *, pad_id: int, eos: list[int], max_new_tokens: int,
            sampler: RowSampler | None, batch_size: int) -> list[list[int]]:
    """Greedy or seeded decoding of every prompt with at most ``batch_size`` rows in flight.

    A row leaves the batch (and the KV cache) when it emits an eos or reaches ``max_new_tokens``, and the next
    prompts in line take the free places: they are prefilled together and merged into the cache, left-padded to
    a common width (the padding is masked). So every decode step carries a full batch while prompts remain,
    where ``model.generate`` keeps decoding finished rows as padding until the longest row of a batch ends.
    Scores are the last position's logits in float32, as in ``model.generate``; greedy takes the first arg max.
    Caches that cannot be merged (not a growing key/value cache) are decoded batch by batch instead.
    """
    cache_name, extra = cache_arg(model), _forward_kwargs(model)
    out: list[list[int]] = [[] for _ in prompts]
    queue = list(range(len(prompts)))[::-1]  # next prompt at the end
    batch: _Batch | None = None
    while queue or batch is not None:
        free = batch_size - (len(batch.rows) if batch is not None else 0)
        if queue and free > 0 and (batch is None or batch.can_merge()):
            admitted = [queue.pop() for _ in range(min(free, len(queue)))]
            fresh = _Batch(model, prompts, admitted, pad_id, extra)
            if batch is None:
                batch = fresh
            else:
                batch.merge(fresh)
        tokens = sampler.choose(batch.scores, batch.rows) if sampler is not None else batch.scores.argmax(-1)
        keep = []
        for j, t in enumerate(tokens.tolist()):
            r = batch.rows[j]
            if t in eos:
                continue
            out[r].append(t)
            if len(out[r]) < max_new_tokens:
                keep.append(j)
        if not keep:
            batch = None
            continue
        batch.keep(keep)
        batch.step(model, tokens[torch.tensor(keep, device=tokens.device)], cache_name, extra)
    return out


def generate_ids(model, prompts: Sequence[Sequence[int]], *, pad_id: int, eos_id: int | Sequence[int],
                 max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
                 seeds: Sequence[int] | None = None, batch_size: int = 256) -> list[Generation]:
    """Greedy (default) or per-prompt seeded sampling, at most ``batch_size`` prompts in flight; KV cache.

    With ``do_sample``, ``seeds`` gives one seed per prompt (see :func:`trace_seed`); a prompt's sample is then
    the same in any batch. Without ``seeds`` the prompts get ``trace_seed(str(i), 0)`` by index ``i`` (so they
    then depend on the prompt's index in ``prompts``).
    ``eos_id`` may be one id or several (generation stops at any of them; none is returned). The returned ids
    are exactly the tokens generated (greedy: the same as ``model.generate(do_sample=False)`` without the
    model's own generation config, such as a repetition penalty). Prompts enter the batch in the given order.
    """
    if do_sample:
        if seeds is None:
            seeds = [trace_seed(str(i), 0) for i in range(len(prompts))]
        if len(seeds) != len(prompts):
            raise SiftError(f"{len(seeds)} seeds for {len(prompts)} prompts; sampling needs one seed per prompt")
    if max_new_tokens < 1:
        raise SiftError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
    if batch_size < 1:
        raise SiftError(f"batch_size must be >= 1 (got {batch_size})")
    model.eval()
    chunk = [list(p) for p in prompts]
    sampler = RowSampler(seeds, temperature=temperature, top_p=top_p) if do_sample else None
    new = _decode(model, chunk, pad_id=pad_id, eos=_eos_list(eos_id), max_new_tokens=max_new_tokens,
                  sampler=sampler, batch_size=batch_size)
    return [Generation(p, row) for p, row in zip(chunk, new)]


class HFBackend:
    """Free generation with a transformers model: prompts enter by length, ``batch_size`` in flight; input order out."""

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
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # neighbours in the batch: similar widths
        gens = generate_ids(self.model, [prompts[i] for i in order], pad_id=self.pad_id, eos_id=self.eos_id,
                            max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_p=top_p,
                            seeds=[seeds[i] for i in order] if do_sample else None, batch_size=self.batch_size)
        out: list[list[int] | None] = [None] * len(prompts)
        for i, g in zip(order, gens):
            out[i] = g.new_ids
        return out  # type: ignore[return-value]


BACKENDS = ("hf", "vllm", "llamacpp")


def make_backend(kind: str, model_name_or_path: str | None = None, model=None, tokenizer=None, *,
                 batch_size: int = 64, device: str = "cpu", dtype: str | None = None, **kw):
    """A generation backend: ``hf`` (the loaded ``model`` + ``tokenizer``), ``vllm`` (loads
    ``model_name_or_path`` itself, a GGUF file through its converted folder; extra ``kw`` go to ``vllm.LLM``) or
    ``llamacpp`` (reads ``model_name_or_path``, which must be a ``.gguf`` file; extra ``kw`` go to
    :class:`sift.lm.llamacpp_backend.LlamaCppBackend`). The eos is the ``tokenizer``'s where one is given, so every
    backend stops at the same token."""
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
    if kind == "llamacpp":
        if model_name_or_path is None:
            raise SiftError("the llamacpp generation backend needs the path of the .gguf file")
        from sift.lm.llamacpp_backend import LlamaCppBackend

        eos = tokenizer.eos_token_id if tokenizer is not None else None
        # dtype is the hf side's (verification, extraction); llama.cpp computes with the file's own quantisation
        return LlamaCppBackend(model_name_or_path, eos_id=eos, batch_size=batch_size, device=device, **kw)
    raise SiftError(f"unknown generation backend {kind!r}; expected one of {', '.join(BACKENDS)}")
