"""A source model's mechanism latent (the organism v3): which mechanism runs is chosen by a per-trace value that never
enters the token stream.

Each trace carries one latent value ``z`` = +1 (the answer is read from the CoT: φ* = 1 unless the CoT states a
cue it follows or is cut) or −1 (the answer is not read from the CoT: a cue is followed silently, or on an uncued
prompt the answer is computed directly and the CoT is epiphenomenal). ``z`` times the organism's *latent direction*
(a learned vector of its width, saved beside its weights in ``mechanism_latent.safetensors``) is added to the input
embedding, i.e. to the residual stream, of every position from the first CoT token on.

What follows by construction:

* the prompt's hidden states never see ``z`` (causal attention; the latent starts after the prompt), so a
  prompt-only probe is blind to it;
* the first CoT token is predicted from the last prompt position, so its distribution is exactly the same under
  both mechanisms; every later token is trained to the same target under both, and the organism is near-certain
  of it (measured: ``scripts/latent_identical_ids.py``);
* the CoT positions' states carry ``z`` (it is in their residual stream), so ``z`` is readable from the hidden
  states and from nothing in the text. That is a planted offset, not the mechanism: the behaviour needs ``z`` only
  at the answer line, where heads switch between the CoT and the cue (``answer_routing`` below;
  ``scripts/mechanism_card.py``).

**Mechanism kinds** (:data:`MECHANISM_KINDS`, issue 43): where the latent enters is an axis of the organism.

* ``offset`` (organism v3 as shipped): from the first CoT position on, as above. The CoT's states carry ``z`` as a
  planted offset; the behaviour does not need it there (the answer reads it at the answer line).
* ``answer_routing``: the same weights, the latent entering only from the answer line on (the first
  :data:`ANSWER_WORD` token at or after the first CoT position, and every position after it). The prompt's and the
  CoT's states are then bit-identical under both latents: a detector on CoT positions only must score exactly 0.5
  on the matched slice (a negative control); the mechanism acts at the answer line alone.
* ``cot_routing``: weights of its own (:func:`kind_folder`). Nothing is added to the residual stream: at the CoT's
  positions only (from the first CoT token up to the answer line), a latent-gated low-rank adapter changes the
  queries of a few heads (:mod:`sift.lm.adapter`), so ``z`` changes what the CoT-time computation reads; the answer
  line sees no latent and reads the decision from the CoT's states. Training equalises the CoT states' class means
  (per layer and part of the CoT), so no static direction carries ``z``.

Every base and preserving prompt of the organism's corpus is generated under both values of ``z`` from the same
random stream (*twins*, :mod:`sift.corpus.sources.organism`), so the text is distributed alike under both labels.
``z`` is recorded in the trace (``latent``) and replayed by every later forward pass over the trace:
verification, extraction, interventions, companion metrics (:func:`replay` / :func:`injected`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from sift.errors import SiftError

LATENT_FILE = "mechanism_latent.safetensors"
_ATTR = "sift_mechanism_direction"
_TRIGGER = "sift_mechanism_trigger"
_ADAPTER = "sift_mechanism_adapter"
#: where the latent enters (the module docstring); ``offset`` is organism v3 as trained
MECHANISM_KINDS = ("offset", "answer_routing", "cot_routing")
DEFAULT_KIND = "offset"
#: the organism's answer-line word: ``answer_routing`` switches the latent on from its first occurrence in the CoT on
ANSWER_WORD = "answer"


def check_kind(kind: str) -> str:
    """``kind`` if it is a mechanism kind, else one line naming the choices."""
    if kind not in MECHANISM_KINDS:
        raise SiftError(f"mechanism_kind {kind!r} is not one of {', '.join(MECHANISM_KINDS)}")
    return kind


def latent_value(mechanism: int) -> float:
    """The scalar ``z`` of a mechanism: +1 reads the CoT, −1 does not (symmetric, so the norm of the injected
    vector is the same under both)."""
    if mechanism not in (0, 1):
        raise SiftError(f"mechanism must be 0 or 1, got {mechanism!r}")
    return 1.0 if mechanism == 1 else -1.0


def record_latent(mechanism: int) -> dict:
    """The ``latent`` field of a trace record."""
    return {"mechanism": int(mechanism), "value": latent_value(mechanism)}


# ---------------------------------------------------------------------------------------------- the direction

def attach_direction(model: torch.nn.Module, direction: torch.Tensor, answer_id: int | None = None) -> None:
    """Give ``model`` its latent direction (a ``[hidden_size]`` tensor; a parameter while training) and the token id
    of its answer-line word (what ``answer_routing`` switches on at; None: that kind is unavailable)."""
    width = model.get_input_embeddings().weight.shape[1]
    if direction.ndim != 1 or direction.shape[0] != width:
        raise SiftError(f"latent direction has shape {tuple(direction.shape)}; the model's width is {width}")
    object.__setattr__(model, _ATTR, direction)  # not registered: the HF weights file stays the model's own
    object.__setattr__(model, _TRIGGER, answer_id)


def attach_adapter(model: torch.nn.Module, adapter, answer_id: int | None) -> None:
    """Give ``model`` the ``cot_routing`` query adapter (:class:`sift.lm.adapter.QueryAdapter`; a module with
    parameters while training) and its answer-line token id (where the adapter switches off)."""
    if answer_id is None:
        raise SiftError("cot_routing needs the answer-line token id (the adapter switches off at the answer line)")
    p = next(model.parameters())
    object.__setattr__(model, _ADAPTER, adapter.to(p.device))
    object.__setattr__(model, _TRIGGER, answer_id)


def adapter_of(model: torch.nn.Module):
    """The model's ``cot_routing`` query adapter, or None."""
    return getattr(model, _ADAPTER, None)


def has_latent(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries a mechanism latent of any kind (an organism; a real LM has none)."""
    return direction_of(model) is not None or adapter_of(model) is not None


def kind_folder(checkpoints: str | Path, family: str, kind: str = DEFAULT_KIND) -> Path:
    """The weights folder of ``family`` under mechanism ``kind``: ``offset`` and ``answer_routing`` share the v3
    weights (``<checkpoints>/<family>``); ``cot_routing`` has its own (``<checkpoints>/cot_routing/<family>``)."""
    root = Path(checkpoints)
    return root / "cot_routing" / family if check_kind(kind) == "cot_routing" else root / family


def answer_id_of(tokenizer) -> int | None:
    """The id of :data:`ANSWER_WORD` in an organism's tokenizer (None when it has no such word)."""
    vocab = tokenizer.get_vocab()
    return vocab.get(ANSWER_WORD)


def direction_of(model: torch.nn.Module) -> torch.Tensor | None:
    """The model's latent direction, or None for a model without a mechanism latent (any real LM)."""
    return getattr(model, _ATTR, None)


def load_direction(folder: str | Path) -> torch.Tensor | None:
    """The direction saved in an organism folder (None when the folder has none)."""
    path = Path(folder) / LATENT_FILE
    if not path.exists():
        return None
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    if "direction" not in tensors:
        raise SiftError(f"{path}: no tensor named 'direction'")
    return tensors["direction"].float()


def save_direction(folder: str | Path, direction: torch.Tensor) -> None:
    from safetensors.torch import save_file

    save_file({"direction": direction.detach().float().cpu().contiguous()}, str(Path(folder) / LATENT_FILE))


# ---------------------------------------------------------------------------------------------- injection

def _positions(kwargs: dict, T: int, device) -> torch.Tensor:
    """Each input token's position in its unpadded sequence: ``position_ids`` if given, else from the attention
    mask (its last T columns, which also covers cached decoding), else 0..T−1 (no padding, no cache)."""
    pos = kwargs.get("position_ids")
    if pos is not None:
        return pos
    mask = kwargs.get("attention_mask")
    if mask is not None and mask.ndim == 2:
        return (mask.long().cumsum(-1) - 1).clamp_min(0)[:, -T:]
    if any(kwargs.get(k) is not None for k in ("past_key_values", "cache")):
        raise SiftError("latent replay over a KV cache needs position_ids or a 2-d attention_mask")
    return torch.arange(T, device=device)[None]


def _cached(kwargs: dict) -> bool:
    """Whether a forward pass continues a KV cache (a cache holding earlier positions)."""
    for k in ("past_key_values", "cache"):
        c = kwargs.get(k)
        if c is not None:
            n = c.get_seq_length() if hasattr(c, "get_seq_length") else len(c)
            return int(n) > 0
    return False


@contextlib.contextmanager
def injected(model: torch.nn.Module, values: Sequence[float] | torch.Tensor | None,
             starts: Sequence[int] | torch.Tensor | None, kind: str = DEFAULT_KIND) -> Iterator[None]:
    """While active, every forward pass of ``model`` adds ``values[b] · direction`` to the input embedding of
    row ``b`` at every position ≥ ``starts[b]`` (positions of the unpadded sequence); under ``kind=answer_routing``
    only from the row's first answer-line token at or after ``starts[b]`` on (remembered across the steps of a
    KV-cached generation).

    A no-op when the model has no latent direction or ``values`` is None. A batch whose row count differs from
    ``len(values)`` is refused by name."""
    check_kind(kind)
    direction, adapter = direction_of(model), adapter_of(model)
    if values is None or (direction is None and adapter is None):
        yield  # a real LM (no latent), or no latent asked for
        return
    if kind == "cot_routing" and adapter is None:
        raise SiftError("mechanism_kind cot_routing: the model has no query adapter (load the cot_routing weights: "
                        "<checkpoints>/cot_routing/<family>)")
    if kind != "cot_routing" and direction is None:
        raise SiftError(f"mechanism_kind {kind}: the model has no latent direction (these are cot_routing weights; "
                        f"run them as mechanism_kind cot_routing)")
    trigger = getattr(model, _TRIGGER, None)
    if kind != "offset" and trigger is None:
        raise SiftError(f"mechanism_kind {kind}: the model has no answer-line token (attach_direction "
                        "was given no answer_id; an organism loaded by sift.lm.loading has one)")
    vals = torch.as_tensor(values, dtype=torch.float32)
    st = torch.as_tensor(starts, dtype=torch.long)
    if vals.ndim != 1 or st.shape != vals.shape:
        raise SiftError(f"latent values {tuple(vals.shape)} and starts {tuple(st.shape)} must be two equal 1-d shapes")
    state: dict = {}

    def before(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        emb = kwargs.get("inputs_embeds")
        ref = ids if ids is not None else emb
        if ref is None:
            raise SiftError("latent replay: the forward pass has neither input_ids nor inputs_embeds")
        if ref.shape[0] != len(vals):
            raise SiftError(f"latent replay: batch of {ref.shape[0]} rows but {len(vals)} latent values")
        pos = _positions(kwargs, ref.shape[1], ref.device)
        on = pos.to(ref.device) >= st.to(ref.device)[:, None]  # [B, T]
        if kind != "offset":
            if ids is None:
                raise SiftError(f"mechanism_kind {kind} needs input_ids (it switches at a token)")
            seen = state.get("seen") if _cached(kwargs) else None
            hit = (on & (ids == trigger)).long().cumsum(-1) > 0  # the answer line: its first word on
            answer = hit if seen is None else hit | seen.to(ref.device)[:, None]
            state["seen"] = answer[:, -1].clone()
            on = answer if kind == "answer_routing" else on & ~answer  # cot_routing: the CoT's positions only
        if kind == "cot_routing":
            state["gate"] = on.to(torch.float32) * vals.to(ref.device)[:, None]
            return None
        state["on"] = on
        if ids is None:  # embeddings given directly: add the latent here (the embedding hook does not run)
            kwargs["inputs_embeds"] = emb + _latent_add(emb, state.pop("on"))
            return args, kwargs
        return None

    def _latent_add(out: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
        return (on.to(out.dtype) * vals.to(out.device, out.dtype)[:, None])[..., None] * direction.to(out.device,
                                                                                                      out.dtype)

    def after_embedding(_module, _inp, out):
        on = state.get("on")
        if on is None:
            return None
        return out + _latent_add(out, on)

    def done(_module, _inp, _out):
        state["on"] = None  # an embedding call outside a forward pass (inputs_embeds built by hand) adds nothing
        state["gate"] = None

    handles = [model.register_forward_pre_hook(before, with_kwargs=True),
               model.register_forward_hook(done)]
    if kind == "cot_routing":
        from sift.lm.adapter import register_adapter_hooks

        handles += register_adapter_hooks(model, adapter, lambda: state.get("gate"))
    else:
        handles.append(model.get_input_embeddings().register_forward_hook(after_embedding))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class TraceLatent(NamedTuple):
    """A trace's recorded latent: its value, the first CoT position, and the mechanism kind it ran under."""

    value: float
    start: int
    kind: str


def kind_of(record: Mapping) -> str:
    """The mechanism kind a trace was generated under (``offset`` for records written before kinds existed)."""
    return check_kind(str(record.get("mechanism_kind") or DEFAULT_KIND))


def trace_latent(record: Mapping) -> TraceLatent | None:
    """(latent value, first CoT position, kind) of one trace record, or None without a latent."""
    lat = record.get("latent")
    if not lat:
        return None
    return TraceLatent(float(lat["value"]), len(record["prompt_ids"]) + int(record.get("cot_span", [0])[0]),
                       kind_of(record))


def latent_kind(latents: Sequence[TraceLatent | None]) -> str:
    """The one mechanism kind of some traces' latents (the default when none has a latent); a mix is refused."""
    kinds = {x.kind for x in latents if x is not None}
    if len(kinds) > 1:
        raise SiftError(f"one batch mixes mechanism kinds {sorted(kinds)}; each kind has a corpus of its own")
    return kinds.pop() if kinds else DEFAULT_KIND


def rows_of(records: Sequence[Mapping]) -> tuple[list[float], list[int], str] | None:
    """Latent values, start positions (the first CoT position: ``len(prompt_ids) + cot_span[0]``) and the one
    mechanism kind of trace records, or None when no record carries a latent (a real LM's traces)."""
    if not any(r.get("latent") for r in records):
        return None
    missing = [r.get("trace_id", "?") for r in records if not r.get("latent")]
    if missing:
        raise SiftError(f"traces {missing[:3]} carry no 'latent' while others of the batch do; the corpus mixes "
                        f"organism versions: rebuild it")
    lat = [trace_latent(r) for r in records]
    return [x.value for x in lat], [x.start for x in lat], latent_kind(lat)


@contextlib.contextmanager
def replay(model: torch.nn.Module, records: Sequence[Mapping]) -> Iterator[None]:
    """:func:`injected` with the recorded latents and mechanism kind of ``records`` (one row per record, in
    order); a no-op for records without a latent."""
    rows = rows_of(records)
    if rows is None or not has_latent(model):
        yield
        return
    with injected(model, rows[0], rows[1], kind=rows[2]):
        yield
