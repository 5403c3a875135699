"""What a forward pass of a Hugging Face causal LM gives beyond its logits: block outputs and attention weights.

* :func:`find_blocks` locates the block list of any HF decoder; :func:`model_dims` its layers, width, vocabulary.
* :func:`pack` pads token-id lists into one batch; :func:`model_inputs` adds mask-following position ids.
* :func:`capture_attention` captures the head-averaged attention weights of chosen layers inside an ordinary
  forward call; :func:`prompt_final_states` reads block L's output at the last prompt token.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from sift.errors import SiftError


def text_config(model):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def find_blocks(model) -> torch.nn.ModuleList:
    """The decoder's list of transformer blocks (a ModuleList of ``num_hidden_layers`` same-type modules)."""
    n = getattr(text_config(model), "num_hidden_layers", None)
    for mod in model.modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and n and len({type(m) for m in mod}) == 1:
            return mod
    raise SiftError(f"{type(model).__name__}: cannot find its list of {n} transformer blocks")


def model_dims(model) -> dict[str, int]:
    """Layers, width and vocabulary size of a model (as recorded in caches)."""
    cfg = text_config(model)
    emb = model.get_input_embeddings()
    return {"num_layers": int(cfg.num_hidden_layers), "hidden_size": int(cfg.hidden_size),
            "vocab_size": int(emb.num_embeddings)}


# ---------------------------------------------------------------------------------------------- attention capture

@dataclass
class _Capture:
    targets: dict[int, int]  # id(attention submodule) -> layer index
    q_start: int = 0  # only queries from this position on are needed
    weights: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [B, S − q_start, S] head-averaged


_ACTIVE: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("sift_attention_capture", default=None)


def _module_eager(module):
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return fn if fn is not None else _generic_eager


def _generic_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    rep = query.shape[1] // key.shape[1]
    if rep > 1:
        key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    w = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        w = w + attention_mask
    w = torch.softmax(w.float(), dim=-1).to(query.dtype)
    return torch.matmul(w, value).transpose(1, 2).contiguous(), w


def _additive_mask(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """An eager-style additive mask from whatever the model's kernel was given (None, bool 4D or 2D, float)."""
    Sq, Sk = query.shape[-2], key.shape[-2]
    neg = torch.finfo(query.dtype).min
    if mask is not None and mask.dtype != torch.bool and mask.ndim == 4:
        return mask[..., :Sk]
    causal = torch.ones(Sq, Sk, dtype=torch.bool, device=query.device).tril(Sk - Sq)[None, None]
    if mask is None:
        keep = causal
    elif mask.ndim == 2:  # [B, Sk] padding mask (flash-style)
        keep = causal & mask.bool()[:, None, None, :Sk]
    else:
        keep = mask[..., :Sk]
    return torch.zeros(keep.shape, dtype=query.dtype, device=query.device).masked_fill(~keep, neg)


def _rows(mask: torch.Tensor | None, qs: int) -> torch.Tensor | None:
    """The mask rows of queries ``qs:`` (4D masks only; 2D padding masks and None have no query axis)."""
    return mask[:, :, qs:] if mask is not None and mask.ndim == 4 and mask.shape[-2] > 1 else mask


def _wrap(original, impl: str):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        base = original if original is not None else _module_eager(module)
        out = base(module, query, key, value, attention_mask, *args, **kwargs)
        cap = _ACTIVE.get()
        if cap is None or id(module) not in cap.targets:
            return out
        qs = min(cap.q_start, query.shape[-2] - 1)
        w = out[1] if impl == "eager" and isinstance(out, tuple) and out[1] is not None else None
        if w is not None:
            w = w[:, :, qs:]
        else:  # recompute the weights of the needed queries only, with the model's own eager formula
            kw = {k: v for k, v in kwargs.items() if k not in ("is_causal",)}
            q = query[:, :, qs:]
            _, w = _module_eager(module)(module, q, key, value, _additive_mask(_rows(attention_mask, qs), q, key),
                                         *args, **kw)
        cap.weights[cap.targets[id(module)]] = w.float().mean(1)
        return out

    attention._sift_wrapper = True  # type: ignore[attr-defined]
    return attention


@contextlib.contextmanager
def capture_attention(model, layers: Sequence[int], q_start: int = 0) -> Iterator[_Capture]:
    """Capture head-averaged attention weights of ``layers`` (0-based block indices) during one forward call,
    for the queries at positions ≥ ``q_start`` (``weights[layer]`` is ``[B, S − q_start, S]``)."""
    from transformers.modeling_utils import AttentionInterface

    blocks = find_blocks(model)
    cap = _Capture({id(m): i for i in layers for m in blocks[i].modules()}, q_start=q_start)
    impl = getattr(text_config(model), "_attn_implementation", None) or "eager"
    mapping = AttentionInterface._global_mapping
    had = impl in mapping
    original = mapping.get(impl)
    if not getattr(original, "_sift_wrapper", False):
        mapping[impl] = _wrap(original, impl)
    token = _ACTIVE.set(cap)
    try:
        yield cap
    finally:
        _ACTIVE.reset(token)
        if had:
            mapping[impl] = original
        else:
            mapping.pop(impl, None)


# -------------------------------------------------------------------------------------------------- batch packing

@dataclass
class Packed:
    ids: torch.Tensor  # [B, S]
    mask: torch.Tensor  # [B, S] long
    offset: torch.Tensor  # [B] index of each row's first real token


def pack(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "left") -> Packed:
    """Pad token-id lists into one batch (``side`` = left or right)."""
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    offset = torch.zeros(len(seqs), dtype=torch.long)
    for i, s in enumerate(seqs):
        o = width - len(s) if side == "left" else 0
        ids[i, o:o + len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, o:o + len(s)] = 1
        offset[i] = o
    return Packed(ids, mask, offset)


def model_inputs(model, p: Packed, device) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and (when the model takes them) mask-following position ids."""
    kw = {"input_ids": p.ids.to(device), "attention_mask": p.mask.to(device)}
    if "position_ids" in forward_params(model):
        kw["position_ids"] = (p.mask.cumsum(-1) - 1).clamp_min(0).to(device)
    return kw


def forward_params(model) -> set[str]:
    cached = getattr(model, "_sift_forward_params", None)
    if cached is None:
        cached = set(inspect.signature(model.forward).parameters)
        try:
            model._sift_forward_params = cached
        except Exception:  # pragma: no cover
            pass
    return cached



@torch.no_grad()
def prompt_final_states(model, prompts: Sequence[Sequence[int]], pad_id: int = 0, batch_size: int = 256,
                        padding_side: str = "left") -> torch.Tensor:
    """Block L's output (pre final norm, as in :meth:`Extractor.extract`) at the last token of each prompt:
    ``[N, d]`` float32, in input order. One forward pass over the prompts only (causal attention makes it
    equal to the state inside the full trace)."""
    blocks = find_blocks(model)
    device = next(model.parameters()).device
    out = torch.zeros(len(prompts), model_dims(model)["hidden_size"])
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        p = pack([prompts[i] for i in idx], pad_id, padding_side)
        last: dict[str, torch.Tensor] = {}

        def hook(_m, _inp, o, last=last):
            last["h"] = o[0] if isinstance(o, (tuple, list)) else o

        h = blocks[-1].register_forward_hook(hook)
        try:
            model(**model_inputs(model, p, device))
        finally:
            h.remove()
        lens = torch.tensor([len(prompts[i]) for i in idx])
        pos = (p.offset + lens - 1).clamp_min(0).to(last["h"].device)
        out[torch.tensor(idx)] = last["h"][torch.arange(len(idx), device=pos.device), pos].float().cpu()
    return out
