"""What a forward pass of a Hugging Face causal LM gives beyond its logits: block outputs and attention weights.

* :func:`find_blocks` locates the block list of any HF decoder; :func:`model_dims` its layers, width, vocabulary.
* :func:`pack` pads token-id lists into one batch; :func:`model_inputs` adds mask-following position ids.
* :func:`capture` records block outputs (forward hooks) and attention weights (a registered attention
  implementation wrapping the model's own, through transformers' public ``AttentionInterface``) inside an
  ordinary forward call: the one way sift reads a model's internals (extraction, ICE attributions, the
  organism's training scaffold); :func:`prompt_final_states` reads block L's output at the last prompt token.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

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


# ------------------------------------------------------------------------------------------------------ capture

@dataclass
class Capture:
    """What one forward call recorded: ``states[i]`` block i's output ``[B, S, d]`` (before any final norm),
    ``attention[i]`` block i's attention weights of the queries ``q_start:``, ``[B, S − q_start, S]`` averaged
    over heads (``[B, H, S − q_start, S]`` with ``heads="all"``)."""

    blocks: set[int]
    targets: dict[int, int]  # id(attention submodule) -> block index
    q_start: int = 0
    heads: str = "mean"
    #: ``reduce(block, weights [B, H, S − q_start, S])`` → what ``attention[block]`` stores instead (applied as each
    #: layer runs, so the full per-head weights of every layer never coexist in memory)
    reduce: Callable[[int, torch.Tensor], Any] | None = None
    states: dict[int, torch.Tensor] = field(default_factory=dict)
    attention: dict[int, torch.Tensor] = field(default_factory=dict)
    #: the additive mask of the recomputed rows, built once per mask the model passes (the same in every layer)
    masks: dict[tuple, tuple[Any, torch.Tensor]] = field(default_factory=dict)


_ACTIVE: contextvars.ContextVar[Capture | None] = contextvars.ContextVar("sift_capture", default=None)

#: the prefix of the attention implementations sift registers (one per wrapped implementation)
CAPTURE_PREFIX = "sift_capture:"


def _module_eager(module):
    """The eager attention formula of the module's own modeling file (a generic one if it has none)."""
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


class _WeightsOnly(torch.overrides.TorchFunctionMode):
    """Inside a recomputation of attention weights: the weights × values product (``matmul(w, value)``), whose
    result the capture discards, returns an uninitialised tensor of its shape instead of being computed."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.matmul, torch.Tensor.__matmul__) and len(args) == 2 and args[1] is self.value:
            w, v = args
            return w.new_empty(*w.shape[:-1], v.shape[-1])
        return func(*args, **(kwargs or {}))


def _capturing(impl: str):
    """An attention function that runs ``impl`` (the model's own kernel: its output is unchanged) and, for the
    layers the active :class:`Capture` asks for, records the attention weights: those eager returns, or for
    another kernel the weights of the needed queries recomputed with the model's own eager formula."""
    from transformers import AttentionInterface

    base = AttentionInterface().get(impl) if impl != "eager" else None

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        out = (base or _module_eager(module))(module, query, key, value, attention_mask, *args, **kwargs)
        cap = _ACTIVE.get()
        if cap is None or id(module) not in cap.targets:
            return out
        qs = min(cap.q_start, query.shape[-2] - 1)
        # the weights the kernel returns, when it returns them (eager, or a knockout wrapping it), else recomputed
        w = out[1] if isinstance(out, tuple) and len(out) > 1 and out[1] is not None else None
        if w is not None:
            w = w[:, :, qs:]
        else:
            kw = {k: v for k, v in kwargs.items() if k != "is_causal"}
            q = query[:, :, qs:]
            mask = cap.masks.get((qs, q.shape[-2], key.shape[-2], q.dtype))
            if mask is None or mask[0] is not attention_mask:  # the same mask for every layer of one pass
                mask = (attention_mask, _additive_mask(_rows(attention_mask, qs), q, key))
                cap.masks[(qs, q.shape[-2], key.shape[-2], q.dtype)] = mask
            with _WeightsOnly(value):
                _, w = _module_eager(module)(module, q, key, value, mask[1], *args, **kw)
        layer = cap.targets[id(module)]
        if cap.reduce is not None:
            cap.attention[layer] = cap.reduce(layer, w.float())
        else:
            cap.attention[layer] = w.float().mean(1) if cap.heads == "mean" else w.float()
        return out

    return attention


def _capture_implementation(impl: str) -> str | None:
    """The name of the registered capturing twin of attention implementation ``impl`` (registered here on first
    use with transformers' public ``AttentionInterface`` / ``AttentionMaskInterface``); None when ``impl`` has no
    mask function to share."""
    from transformers import AttentionInterface, AttentionMaskInterface

    masks = AttentionMaskInterface()
    if impl not in masks:
        return None
    name = CAPTURE_PREFIX + impl
    if name not in AttentionInterface():
        AttentionInterface.register(name, _capturing(impl))
        AttentionMaskInterface.register(name, masks[impl])
    return name


@contextlib.contextmanager
def capture(model, blocks: Sequence[int] = (), attention: Sequence[int] = (), q_start: int = 0,
            heads: str = "mean", reduce: Callable[[int, torch.Tensor], Any] | None = None) -> Iterator[Capture]:
    """Record block outputs (forward hooks on ``blocks``, 0-based) and attention weights (of ``attention``, for
    the queries at positions ≥ ``q_start``) during the forward calls inside the ``with``.

    Attention is captured through a registered attention implementation that wraps the model's own one (the
    model's outputs are bit-identical); the model is switched to it with ``set_attn_implementation`` for the
    duration. A model whose attention bypasses transformers' ``AttentionInterface`` records no weights
    (``attention`` stays empty): the caller then runs it eagerly with ``output_attentions=True``."""
    if heads not in ("mean", "all"):
        raise SiftError(f"heads must be 'mean' or 'all', got {heads!r}")
    mods = find_blocks(model)
    cap = Capture(set(blocks), {id(m): i for i in attention for m in mods[i].modules()}, q_start, heads, reduce)

    def hook(i: int):
        def record(_m, _inp, out):
            cap.states[i] = out[0] if isinstance(out, (tuple, list)) else out

        return record

    handles = [mods[i].register_forward_hook(hook(i)) for i in cap.blocks]
    prev = getattr(text_config(model), "_attn_implementation", None) or "eager"
    switch = None
    if attention and not prev.startswith(CAPTURE_PREFIX) and hasattr(model, "set_attn_implementation"):
        switch = _capture_implementation(prev)
    token = _ACTIVE.set(cap)
    try:
        if switch is not None:
            model.set_attn_implementation(switch)
        yield cap
    finally:
        _ACTIVE.reset(token)
        if switch is not None:
            model.set_attn_implementation(prev)
        for h in handles:
            h.remove()



# ------------------------------------------------------------------------------------------- causal interventions

_KNOCKOUT: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("sift_knockout", default=None)
#: the prefix of the attention implementation :func:`knockout` registers
KNOCKOUT_IMPL = "sift_knockout:eager"


def _knocking_out(module, query, key, value, attention_mask, *args, **kwargs):
    """The module's eager attention with the active knockout's (query, key) pairs removed from the softmax."""
    drop = _KNOCKOUT.get()
    am = _additive_mask(attention_mask, query, key)
    if drop is not None:
        Sq, Sk = query.shape[-2], key.shape[-2]
        d = drop[:, Sk - Sq:Sk, :Sk].to(query.device)  # the queries of this call (a cached step: the last rows)
        am = am.masked_fill(d[:, None], torch.finfo(am.dtype).min)
    kw = {k: v for k, v in kwargs.items() if k != "is_causal"}
    return _module_eager(module)(module, query, key, value, am, *args, **kw)


@contextlib.contextmanager
def knockout(model, drop: torch.Tensor) -> Iterator[None]:
    """Every forward call inside the ``with`` runs eager attention in which query position q of row b does not
    attend to key position k wherever ``drop[b, q, k]`` (``[B, S, S]`` bool, padded positions of the batch as
    given to the model), in every layer and head; the rest of the row is renormalised by the softmax. Used by the
    mechanism card (``scripts/mechanism_card.py``) to cut the answer's access to one source."""
    from transformers import AttentionInterface, AttentionMaskInterface

    if KNOCKOUT_IMPL not in AttentionInterface():
        AttentionInterface.register(KNOCKOUT_IMPL, _knocking_out)
        AttentionMaskInterface.register(KNOCKOUT_IMPL, AttentionMaskInterface()["eager"])
    prev = getattr(text_config(model), "_attn_implementation", None) or "eager"
    token = _KNOCKOUT.set(drop.bool())
    model.set_attn_implementation(KNOCKOUT_IMPL)
    try:
        yield
    finally:
        _KNOCKOUT.reset(token)
        model.set_attn_implementation(prev)


def head_projections(model) -> list[torch.nn.Module]:
    """Each block's attention output projection, whose input is the heads' outputs side by side
    (``[B, S, heads · head_dim]``): ``o_proj`` (Llama-style) or ``attn.c_proj`` (GPT-2-style)."""
    out = []
    for i, block in enumerate(find_blocks(model)):
        attn = getattr(block, "self_attn", None) or getattr(block, "attn", None)
        proj = getattr(attn, "o_proj", None) or getattr(attn, "c_proj", None)
        if proj is None:
            raise SiftError(f"{type(model).__name__}: block {i} has no attention output projection (o_proj/c_proj)")
        out.append(proj)
    return out


@contextlib.contextmanager
def head_outputs(model, positions: torch.Tensor, patch: dict[tuple[int, int], torch.Tensor] | None = None
                 ) -> Iterator[dict[tuple[int, int], torch.Tensor]]:
    """Read, or overwrite, each attention head's output at one position per row (``positions`` ``[B]``, padded
    coordinates) or at the positions of a ``[B, S]`` boolean mask. Yields ``{(layer, head): [B, head_dim]}`` (a
    mask: ``[B, S, head_dim]``, every position) filled by the forward calls inside the ``with``; with ``patch``,
    those heads' outputs at ``positions`` are replaced by the given tensors instead (activation patching; layers
    and heads 0-based)."""
    cfg = text_config(model)
    H = int(cfg.num_attention_heads)
    dh = int(cfg.hidden_size) // H
    got: dict[tuple[int, int], torch.Tensor] = {}
    handles = []

    masked = positions.dtype == torch.bool  # a [B, S] mask of positions, else one position per row

    def read(x: torch.Tensor, cols: slice) -> torch.Tensor:
        if masked:
            return x[..., cols]
        return x[torch.arange(x.shape[0], device=x.device), positions.to(x.device), cols]

    def write(x: torch.Tensor, cols: slice, v: torch.Tensor) -> None:
        v = v.to(x.device, x.dtype)
        if masked:
            x[..., cols] = torch.where(positions.to(x.device)[..., None], v, x[..., cols])
        else:
            x[torch.arange(x.shape[0], device=x.device), positions.to(x.device), cols] = v

    def hook(layer: int):
        def pre(_m, args):
            x = args[0]
            if patch is None:
                for h in range(H):
                    got[(layer, h)] = read(x, slice(h * dh, (h + 1) * dh)).detach().clone()
                return None
            mine = {h: v for (ly, h), v in patch.items() if ly == layer}
            if not mine:
                return None
            x = x.clone()
            for h, v in mine.items():
                write(x, slice(h * dh, (h + 1) * dh), v)
            return (x, *args[1:])

        return pre

    for i, proj in enumerate(head_projections(model)):
        handles.append(proj.register_forward_pre_hook(hook(i)))
    try:
        yield got
    finally:
        for h in handles:
            h.remove()

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
def prompt_final_states(model, prompts: Sequence[Sequence[int]], pad_id: int = 0, batch_size: int = 64,
                        padding_side: str = "left") -> torch.Tensor:
    """Block L's output (pre final norm) at the last token of each prompt: ``[N, d]`` float32, in input order.
    One forward pass over the prompts only (causal attention makes it equal to the state inside the full
    trace)."""
    last = len(find_blocks(model)) - 1
    device = next(model.parameters()).device
    out = torch.zeros(len(prompts), model_dims(model)["hidden_size"])
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        p = pack([prompts[i] for i in idx], pad_id, padding_side)
        kw = model_inputs(model, p, device)
        if "logits_to_keep" in forward_params(model):  # the logits are not read: one position, not [B, T, vocab]
            kw["logits_to_keep"] = 1  # (all positions of 172 prompts through a 150k vocabulary: 11 GB in bf16)
        with capture(model, blocks=[last]) as cap:
            model(**kw)
        h = cap.states[last]
        lens = torch.tensor([len(prompts[i]) for i in idx])
        pos = (p.offset + lens - 1).clamp_min(0).to(h.device)
        out[torch.tensor(idx)] = h[torch.arange(len(idx), device=pos.device), pos].float().cpu()
    return out
