"""``text_sift``: SIFT's own network, objective and training schedule on the trace's tokens instead of its hidden
states — a shortcut control with the detector's capacity (docs/controls.md; ``sift-train detector=text_sift``).

The linear and hand-built controls (``text_bow``, ``surface``, ``prompt_probe``) cannot read an interaction of
two words (e.g. φ* = XOR of two sampled CoT words). ``text_sift`` can: it is :class:`~sift.detectors.sift_model.
SIFTNet` (masked multi-scale TCN → transformer encoder → attention pooling → MLP), trained exactly like ``sift``
(Σ_e R_e + IRM + DANN with the same warm-up and ramps, step-based early stopping), whose only input is a learned
embedding of each step's token ids:

* steps (:mod:`datamodules.token_steps`): the prompt's tokens one per step (at most ``data.token_prompt_steps``,
  binned beyond), the CoT in exactly the descriptor sequence's steps (≤ ``t_max``; step k covers the tokens of
  descriptor step k), the answer's tokens one per step (at most ``data.token_answer_steps``);
* step input = mean of the learned embeddings of the step's token ids + a learned segment embedding (prompt,
  CoT, answer) + a learned embedding of the step's position within its segment (capped at ``max_positions``);
  SIFTNet then adds its own sinusoidal positions over the whole sequence;
* vocabulary: the source model's token ids, hashed into ``buckets`` rows by ``id mod buckets`` (an identity for
  vocabularies smaller than ``buckets``, e.g. the organism's 151 tokens; a real LM's 150k ids share rows, and
  because BPE ids are ordered by merge rank the tokens that share a row are unrelated). Models with different
  tokenizers share the table (their ids collide).

It reads no hidden state, descriptor, pooled vector or feature of the batch (tested): when it matches a
trajectory detector, that detector may be reading the text rather than the mechanism.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from datamodules.batch import TraceBatch
from datamodules.token_steps import SEGMENTS
from sift.detectors.module import DataSpec, DetectorModule, build_net
from sift.detectors.sift_model import SIFTNet
from sift.errors import SiftError


class TokenStepEmbedding(nn.Module):
    """Token ids per step ``[B, S, K]`` (−1: no token) and segments ``[B, S]`` (−1: padded step) →
    (step inputs ``[B, S, dim]``, mask ``[B, S]``): mean token embedding + segment + position-in-segment."""

    def __init__(self, buckets: int = 32768, dim: int = 64, max_positions: int = 128,
                 n_segments: int = len(SEGMENTS)) -> None:
        super().__init__()
        if buckets < 1 or dim < 1 or max_positions < 1:
            raise SiftError(f"text_sift tokens: buckets, dim and max_positions must be ≥ 1, got {buckets}, {dim}, "
                            f"{max_positions}")
        self.buckets, self.dim, self.max_positions, self.n_segments = int(buckets), int(dim), int(max_positions), int(
            n_segments)
        self.token = nn.Embedding(self.buckets, self.dim)
        self.segment = nn.Embedding(self.n_segments, self.dim)
        self.position = nn.Embedding(self.max_positions, self.dim)

    def forward(self, ids: torch.Tensor, segment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids, segment = ids.long(), segment.long()
        present = ids >= 0  # [B, S, K]
        n = present.sum(-1)  # tokens per step
        mask = (n > 0) & (segment >= 0)
        # mean over the step's tokens as a weighted bag (weight 1/n per present token, 0 for padding), so the
        # [B, S, K, dim] tensor of per-token embeddings is never built (2.5 GB per real-LM training run)
        B, S, K = ids.shape
        w = present.to(self.token.weight.dtype) / n.clamp_min(1)[..., None].to(self.token.weight.dtype)
        x = F.embedding_bag(ids.clamp_min(0).remainder(self.buckets).reshape(B * S, K), self.token.weight,
                            per_sample_weights=w.reshape(B * S, K), mode="sum").reshape(B, S, self.dim)
        seg = segment.clamp(0, self.n_segments - 1)
        onehot = F.one_hot(seg, self.n_segments) * mask[..., None]  # [B, S, n_segments]
        pos = ((onehot.cumsum(1) * onehot).sum(-1) - 1).clamp(0, self.max_positions - 1)  # index within its segment
        x = x + self.segment(seg) + self.position(pos)
        return x * mask[..., None].to(x.dtype), mask


class TextSIFTDetector(DetectorModule):
    """``text_sift`` (module docstring). ``tokens``: :class:`TokenStepEmbedding` keyword arguments (``buckets``,
    ``dim``, ``max_positions``); ``net``, ``optimizer``, ``scheduler``, ``objective``: as for
    :class:`~sift.detectors.sift_model.SIFTDetector` (IRM and DANN on by default); ``net`` is built with
    ``in_channels = tokens.dim``."""

    objective_defaults: ClassVar[dict[str, Any]] = {"use_irm": True, "use_dann": True}
    stack_net: ClassVar[type | None] = SIFTNet

    def __init__(self, *, data: DataSpec | Mapping[str, Any] | None = None, name: str = "text_sift",
                 tokens: Mapping[str, Any] | None = None, net: Mapping[str, Any] | None = None,
                 optimizer: Mapping[str, Any] | None = None, scheduler: Mapping[str, Any] | None = None,
                 objective: Mapping[str, Any] | None = None, threshold_method: str = "youden") -> None:
        super().__init__(data=data, name=name, optimizer=optimizer, scheduler=scheduler, objective=objective,
                         threshold_method=threshold_method)
        self.save_hyperparameters(logger=False)
        self.embed = TokenStepEmbedding(**dict(tokens or {}))
        self.net = build_net(net, SIFTNet, in_channels=self.embed.dim)
        self.representation_dim = int(self.net.d_model)
        self.build_dann_head()

    def step_inputs(self, batch: TraceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The network's input ``[B, S, dim]`` and step mask ``[B, S]`` (the batch's tokens only)."""
        if batch.token_ids is None or batch.token_segment is None:
            raise SiftError(f"{self.detector_name}: the batch carries no token ids (TraceBatch.token_ids); this "
                            "control needs the trajectory DataModule (data=trajectory), which reads them from the "
                            "corpus")
        return self.embed(batch.token_ids, batch.token_segment)

    def stack_inputs(self, batch: TraceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.step_inputs(batch)

    def encode(self, batch: TraceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(*self.stack_inputs(batch))


__all__ = ["TextSIFTDetector", "TokenStepEmbedding"]
