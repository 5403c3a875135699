"""The batch contract shared by every DataModule and every detector.

One example is one trace. Per-step descriptor channels (docs/design.md §5) form ``x`` ∈ R^{T×C} with a padding
mask; pooled vectors and scalar features serve the baselines. Channel names travel with the data so that
ablations ("no attention stability", "no early commitment") can drop channels by name.

Channel naming convention: ``velocity/l{ℓ}`` (ℓ = 1..L−1), ``drift/l{ℓ}`` (ℓ = 1..L), ``early_commitment``,
``attention_stability``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class TraceExample:
    """One trace, ready for a detector."""

    x: torch.Tensor  # [T, C] float32 descriptor sequence (T ≤ T_max)
    label: int  # verified φ* (1 = faithful)
    env: int  # environment id: index of the preserving-axis variant (condition) the trace comes from
    domain: int  # domain index
    model: int  # source-model index
    pooled: torch.Tensor  # [d] mean-pooled final-layer state over the CoT (hidden-state probe)
    features: torch.Tensor  # [F] scalar features for the baselines (names in the DataModule's feature_names)
    trace_id: str = ""
    base_item: str = ""
    prompt_pooled: torch.Tensor | None = None  # [d] final-layer state of the last prompt token (prompt_probe)
    text: str = ""  # prompt + CoT text (text_bow control)
    # per-step token ids of prompt, CoT and answer (text_sift control; datamodules.token_steps): [S, K] int32 with
    # −1 where a step has fewer than K tokens, and each step's segment [S] (0 prompt, 1 CoT, 2 answer)
    token_ids: torch.Tensor | None = None
    token_segment: torch.Tensor | None = None
    # the final-layer state of each descriptor step [T, d] (the binned CoT tokens; sift_raw, paper Appendix Q)
    states: torch.Tensor | None = None


@dataclass
class TraceBatch:
    """A padded batch. ``mask[b, t]`` is True on real steps."""

    x: torch.Tensor  # [B, T, C]
    mask: torch.Tensor  # [B, T] bool
    label: torch.Tensor  # [B] float
    env: torch.Tensor  # [B] long
    domain: torch.Tensor  # [B] long
    model: torch.Tensor  # [B] long
    pooled: torch.Tensor  # [B, d]
    features: torch.Tensor  # [B, F]
    trace_id: list[str] = field(default_factory=list)
    base_item: list[str] = field(default_factory=list)
    prompt_pooled: torch.Tensor | None = None  # [B, d] prompt-final states (None: the DataModule has none)
    text: list[str] = field(default_factory=list)  # prompt + CoT text per trace (empty: the DataModule has none)
    # text_sift's input (None: the DataModule has none): token ids per step [B, S, K] long (−1: no token) and the
    # steps' segments [B, S] long (0 prompt, 1 CoT, 2 answer; −1 on padded steps); datamodules.token_steps
    token_ids: torch.Tensor | None = None
    token_segment: torch.Tensor | None = None
    # sift_raw's input (None: the DataModule has none): the final-layer state of each step [B, T, d], 0 on padding
    states: torch.Tensor | None = None

    def to(self, device) -> TraceBatch:
        t = {k: getattr(self, k).to(device)
             for k in ("x", "mask", "label", "env", "domain", "model", "pooled", "features")}
        opt = {k: getattr(self, k).to(device) if getattr(self, k) is not None else None
               for k in ("prompt_pooled", "token_ids", "token_segment", "states")}
        return TraceBatch(**t, trace_id=self.trace_id, base_item=self.base_item, text=self.text, **opt)

    def __len__(self) -> int:
        return self.x.shape[0]


def collate(examples: Sequence[TraceExample]) -> TraceBatch:
    """Right-pad ``x`` to the longest trace in the batch."""
    T = max(e.x.shape[0] for e in examples)
    C = examples[0].x.shape[1]
    x = torch.zeros(len(examples), T, C)
    mask = torch.zeros(len(examples), T, dtype=torch.bool)
    for i, e in enumerate(examples):
        x[i, : e.x.shape[0]] = e.x
        mask[i, : e.x.shape[0]] = True
    return TraceBatch(
        x=x, mask=mask,
        label=torch.tensor([float(e.label) for e in examples]),
        env=torch.tensor([e.env for e in examples], dtype=torch.long),
        domain=torch.tensor([e.domain for e in examples], dtype=torch.long),
        model=torch.tensor([e.model for e in examples], dtype=torch.long),
        pooled=torch.stack([e.pooled for e in examples]),
        features=torch.stack([e.features for e in examples]),
        trace_id=[e.trace_id for e in examples], base_item=[e.base_item for e in examples],
        prompt_pooled=(torch.stack([e.prompt_pooled for e in examples])
                       if all(e.prompt_pooled is not None for e in examples) else None),
        text=[e.text for e in examples] if any(e.text for e in examples) else [],
        states=_collate_states(examples, T),
        **_collate_tokens(examples),
    )


def _collate_states(examples: Sequence[TraceExample], T: int) -> torch.Tensor | None:
    """Per-step states right-padded with zeros to ``T`` steps (None unless every example has them)."""
    if not all(e.states is not None for e in examples):
        return None
    out = torch.zeros(len(examples), T, examples[0].states.shape[-1])
    for i, e in enumerate(examples):
        out[i, : e.states.shape[0]] = e.states
    return out


def _collate_tokens(examples: Sequence[TraceExample]) -> dict[str, torch.Tensor | None]:
    if not all(e.token_ids is not None and e.token_segment is not None for e in examples):
        return {"token_ids": None, "token_segment": None}
    from datamodules.token_steps import pad_token_steps

    ids, seg = pad_token_steps([e.token_ids for e in examples], [e.token_segment for e in examples])
    return {"token_ids": ids, "token_segment": seg}


@dataclass(frozen=True)
class PairIndex:
    """A verified pair for evaluation loaders: indices of the two traces in the evaluated dataset."""

    axis: str
    kind: str  # preserving | altering
    source: int
    shifted: int
    phi_source: int
    phi_shifted: int


# --------------------------------------------------------------------------------------------- resumable order
class EpochShuffleSampler(torch.utils.data.Sampler):
    """A permutation of ``range(n)`` that is a function of ``(seed, epoch, stream)`` only.

    The epoch is read when iteration starts, from ``epoch_fn`` (the trainer's ``current_epoch``) or, without
    one, from a count of this sampler's own passes. No running RNG state is involved, so a run resumed from an
    epoch-end checkpoint sees exactly the order the uninterrupted run saw, and drawing the order never consumes
    the global torch RNG (which dropout draws from)."""

    def __init__(self, n: int, seed: int, epoch_fn: Callable[[], int] | None = None, stream: int = 0) -> None:
        self.n, self.seed, self.epoch_fn, self.stream = int(n), int(seed), epoch_fn, int(stream)
        self._passes = 0

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch_fn() if self.epoch_fn is not None else self._passes
        self._passes += 1
        g = torch.Generator().manual_seed(epoch_seed(self.seed, epoch, self.stream))
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


def epoch_seed(seed: int, epoch: int, stream: int = 0) -> int:
    """A 63-bit seed derived from ``(seed, epoch, stream)`` (SplitMix64-style mixing; stable across runs)."""
    x = (0x632BE59BD9B4E019 + int(seed) * 0x9E3779B97F4A7C15 + int(epoch) * 0xBF58476D1CE4E5B9
         + int(stream) * 0x94D049BB133111EB)
    x &= (1 << 64) - 1
    for mult in (0xBF58476D1CE4E5B9, 0x94D049BB133111EB):
        x ^= x >> 31
        x = (x * mult) & ((1 << 64) - 1)
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


def loader_generator(seed: int) -> torch.Generator:
    """A private generator for a DataLoader: its per-iterator base seed is then drawn from this, not from the
    global torch RNG, so creating a loader iterator never shifts the RNG stream dropout uses."""
    return torch.Generator().manual_seed(int(seed) & ((1 << 63) - 1))
