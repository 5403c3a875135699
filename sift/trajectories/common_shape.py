"""One common shape (layers × width) for the trajectories of source models of different shapes.

The extraction cache stays native per model; the trajectory DataModule maps every model onto the common shape
``(L*, d*) = (min L, min d)`` over its models when it loads the cache (a view, nothing is rewritten):

* **layers** — descriptor channels (``descriptor_channels(L)``: ``velocity/l1..l{L-1}``, ``drift/l1..l{L}``,
  ``attention_stability``) are resampled onto a relative-depth grid of L* layers. Target layer j (1..L*) reads
  source layer ``s(j) = ⌊j·L/L* + ½⌋`` (round half up), so s(L*) = L: the last layer maps to the last layer, and
  s is strictly increasing because L ≥ L*. ``drift/l{j}`` ← ``drift/l{s(j)}``. A velocity is indexed by its
  lower layer (``velocity/l{i}`` is the step from layer i to i+1); target ``velocity/l{j}`` (the step into target
  layer j+1) ← ``velocity/l{s(j+1)−1}``, the source's last one-layer step into the mapped layer s(j+1) — so the
  last velocity maps to the last velocity too. ``attention_stability`` and the ``answer_line`` flag are kept.
  The per-head attention masses ``head_mass/s{j}/h{h}/{source}`` (K slots of layers × H heads) map onto K* = min K
  slots and H* = min H heads: target slot j reads source slot ``s(j)`` of the same rule over slots, target head k
  reads source head ``⌊k·H/H*⌋``. Heads of two models have no correspondence: like the width projection below,
  this fixes a shape, not a meaning. The result is named ``descriptor_channels(L*, H*, K*, answer_line)``.
* **width** — width-d vectors (``pooled``, ``prompt_final``) are multiplied by a fixed per-model matrix
  ``P = √(d/d*)·Qᵀ`` [d*, d] whose unscaled rows are orthonormal (Q from the QR of a Gaussian drawn from a
  generator seeded by the SHA-256 of the model's name). For isotropic inputs E‖Px‖² = ‖x‖² in expectation. The
  projection is random, not learned: two models' projected states do not share a basis.

A model already of the common shape is left untouched (same tensors), so a one-shape job is unchanged.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import torch

from sift.errors import SiftError


def common_shape(shapes: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """``(L*, d*)``: the fewest layers and the smallest width among ``shapes`` (model → (layers, width))."""
    if not shapes:
        raise SiftError("common_shape: no models")
    bad = {m: s for m, s in shapes.items() if len(s) != 2 or min(int(s[0]), int(s[1])) < 1}
    if bad:
        raise SiftError(f"common_shape: layers and width must be positive integers, got {bad}")
    return min(int(s[0]) for s in shapes.values()), min(int(s[1]) for s in shapes.values())


def layer_map(n_layers: int, target_layers: int) -> list[int]:
    """Source layer (1-based) of each target layer j = 1..L*: ``⌊j·L/L* + ½⌋`` (last → last)."""
    if not 1 <= target_layers <= n_layers:
        raise SiftError(f"layer_map: cannot map {n_layers} layers onto {target_layers} (need 1 ≤ L* ≤ L)")
    return [(2 * j * n_layers + target_layers) // (2 * target_layers) for j in range(1, target_layers + 1)]


def channel_index(n_layers: int, target_layers: int) -> list[int]:
    """Columns of ``descriptor_channels(n_layers)`` that give ``descriptor_channels(target_layers)``, in order."""
    s = layer_map(n_layers, target_layers)
    velocity = [s[j] - 2 for j in range(1, target_layers)]  # target velocity/l{j} ← velocity/l{s(j+1)−1}
    drift = [(n_layers - 1) + (s[j - 1] - 1) for j in range(1, target_layers + 1)]  # drift/l{j} ← drift/l{s(j)}
    return velocity + drift + [2 * n_layers - 1]  # attention_stability


@dataclass(frozen=True)
class ChannelLayout:
    """The layout of a stored descriptor channel list (``sift.trajectories.extract.descriptor_channels``)."""

    layers: int
    heads: int
    slots: int
    answer_line: bool

    def names(self) -> list[str]:
        from sift.trajectories.extract import descriptor_channels

        return descriptor_channels(self.layers, self.heads, self.slots, self.answer_line)


def channel_layout(names: list[str] | tuple[str, ...]) -> ChannelLayout:
    """The layout that names exactly ``names``; a SiftError when no layout does."""
    names = list(names)
    L = sum(1 for n in names if n.startswith("drift/l"))
    slots = {n.split("/")[1] for n in names if n.startswith("head_mass/")}
    heads = {n.split("/")[2] for n in names if n.startswith("head_mass/")}
    lay = ChannelLayout(L, len(heads), len(slots), "answer_line" in names)
    if L < 1 or lay.names() != names:
        raise SiftError(f"channels {names[:4]}… are not the descriptor channels of any model layout")
    return lay


def channel_map(source: ChannelLayout, target: ChannelLayout) -> list[int]:
    """Columns of ``source``'s channels that give ``target``'s, in order (see the module docstring)."""
    if source.answer_line != target.answer_line or (target.slots and not (1 <= target.heads <= source.heads)):
        raise SiftError(f"cannot map channel layout {source} onto {target}")
    idx = channel_index(source.layers, target.layers)
    base = 2 * source.layers
    if target.answer_line:
        idx.append(base)
        base += 1
    if target.slots:
        s = layer_map(source.slots, target.slots)
        for j in range(target.slots):
            for k in range(target.heads):
                h = k * source.heads // target.heads
                idx += [base + ((s[j] - 1) * source.heads + h) * 3 + c for c in range(3)]
    return idx


def resample_layers(desc: torch.Tensor, n_layers: int, target_layers: int) -> torch.Tensor:
    """Descriptor channels ``[..., 2L]`` → ``[..., 2L*]`` (see :func:`channel_index`); unchanged when L = L*."""
    if desc.shape[-1] != 2 * n_layers:
        raise SiftError(f"resample_layers: {desc.shape[-1]} channels, expected {2 * n_layers} for {n_layers} layers")
    if target_layers == n_layers:
        return desc
    return desc[..., channel_index(n_layers, target_layers)]


def _seed(model: str) -> int:
    return int.from_bytes(hashlib.sha256(model.encode("utf-8")).digest()[:8], "little")


@lru_cache(maxsize=32)
def _projection(model: str, width: int, target_width: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed(model))
    q, r = torch.linalg.qr(torch.randn(width, target_width, generator=g, dtype=torch.float64))  # q: [d, d*]
    sign = torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)  # unique Q (Haar-distributed)
    return ((q * sign).T * math.sqrt(width / target_width)).to(torch.float32).contiguous()


def projection(model: str, width: int, target_width: int) -> torch.Tensor | None:
    """The fixed ``[d*, d]`` projection of ``model`` (orthonormal rows × √(d/d*)); None (identity) when d = d*."""
    if not 1 <= target_width <= width:
        raise SiftError(f"projection: cannot project width {width} onto {target_width} (need 1 ≤ d* ≤ d)")
    if target_width == width:
        return None
    return _projection(str(model), int(width), int(target_width)).clone()


@dataclass
class ShapeMap:
    """How one model's cached tensors map onto the common shape (identity where its shape already is it)."""

    model: str
    layers: int
    width: int
    target_layers: int
    target_width: int
    #: the stored channel layout and the common one (None: the plain ``descriptor_channels(L)`` of old caches)
    layout: ChannelLayout | None = None
    target_layout: ChannelLayout | None = None

    def __post_init__(self) -> None:
        self._P = projection(self.model, self.width, self.target_width)
        layer_map(self.layers, self.target_layers)  # refuses L* > L
        self._cols = (None if self.layout is None or self.layout == self.target_layout
                      else torch.tensor(channel_map(self.layout, self.target_layout)))

    @property
    def identity(self) -> bool:
        return self.layers == self.target_layers and self.width == self.target_width and self._cols is None

    def channels(self, desc: torch.Tensor) -> torch.Tensor:
        """The stored descriptor channels → the common layout's (the same tensor when they already are)."""
        if self.layout is None:
            return resample_layers(desc, self.layers, self.target_layers)
        return desc if self._cols is None else desc[..., self._cols]

    def vectors(self, x: torch.Tensor) -> torch.Tensor:
        """Width-d vectors ``[..., d]`` → ``[..., d*]`` (the same tensor when d = d*)."""
        if x.shape[-1] != self.width:
            raise SiftError(f"{self.model}: vectors of width {x.shape[-1]}, expected {self.width}")
        if self._P is None:
            return x
        return x.to(torch.float32) @ self._P.T
