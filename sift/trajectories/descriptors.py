"""Per-step trajectory descriptors (docs/design.md §5), vectorised over a padded batch of CoTs.

Shapes: ``H`` is ``[B, L, T, d]`` (block outputs of layers 1..L at the T CoT tokens, padded to the longest CoT
of the batch), ``valid`` is ``[B, T]`` (True on real CoT tokens, a prefix of each row), ``A`` is ``[B, T, P]``
(head-averaged attention of each CoT token over the prompt positions; any padding columns hold 0).

Conventions (the paper's text lost the exact formulas; these are our reconstructions):

* velocity ``v[ℓ,t] = ‖H[ℓ+1,t] − H[ℓ,t]‖₂ / √d`` for ℓ = 1..L−1;
* drift ``d[ℓ,t] = ‖H[ℓ,t+1] − H[ℓ,t]‖₂ / √d`` for ℓ = 1..L; the last step has no successor and is defined as
  0 (its mean over a trace therefore excludes the last step);
* attention stability ``a[t] = 1 − JSD(A_t, A_{t−1})`` with JSD in bits (so a ∈ [0, 1]); ``a[0] = 1`` by
  definition (nothing to compare with) and ``AttnStab = mean_{t≥1} a[t]`` (1 for a one-token CoT);
* early commitment ``EC = max_{t < ⌈T/3⌉} e[t]`` with ``e[t] = P(y_final | H[L,t])`` from the answer probe
  (:mod:`sift.trajectories.probe`);
* binning: a CoT of T tokens is reduced to ``n = min(T, T_max)`` steps, token t going to bin ``⌊t·n/T⌋``; a
  bin holds the mean of its tokens (descriptors are computed at token resolution first, then binned).

Padded entries of every output are 0.
"""

from __future__ import annotations

import math

import torch


def velocity(H: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Inter-layer velocity ``[B, T, L−1]``."""
    d = H.shape[-1]
    v = (H[:, 1:] - H[:, :-1]).norm(dim=-1) / math.sqrt(d)  # [B, L-1, T]
    return v.transpose(1, 2) * valid[..., None]


def drift(H: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Step-to-step drift ``[B, T, L]``; 0 at each CoT's last step."""
    d = H.shape[-1]
    B, L, T, _ = H.shape
    out = torch.zeros(B, T, L, dtype=H.dtype, device=H.device)
    if T > 1:
        dd = (H[:, :, 1:] - H[:, :, :-1]).norm(dim=-1) / math.sqrt(d)  # [B, L, T-1]
        has_next = valid[:, 1:]  # step t has a successor iff t+1 is valid
        out[:, :-1] = dd.transpose(1, 2) * has_next[..., None]
    return out


def jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence in bits along the last dim (inputs are distributions; 0·log 0 = 0)."""
    m = 0.5 * (p + q)
    kl_pm = torch.special.xlogy(p, p).sum(-1) - torch.special.xlogy(p, m).sum(-1)
    kl_qm = torch.special.xlogy(q, q).sum(-1) - torch.special.xlogy(q, m).sum(-1)
    return (0.5 * (kl_pm + kl_qm) / math.log(2)).clamp(0.0, 1.0)


def normalise_attention(A: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Renormalise attention restricted to the prompt so each row sums to 1 (all-zero rows stay 0)."""
    return A / A.sum(-1, keepdim=True).clamp_min(eps)


def attention_stability(A: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``a[t] = 1 − JSD(A_t, A_{t−1})`` as ``[B, T]``; ``a[0] = 1``; padding 0. ``A`` must be normalised."""
    B, T, _ = A.shape
    a = torch.ones(B, T, dtype=A.dtype, device=A.device)
    if T > 1:
        a[:, 1:] = 1.0 - jsd(A[:, 1:], A[:, :-1])
    return a * valid


def trace_means(v: torch.Tensor, dr: torch.Tensor, a: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-trace scalars ``[B, 3]``: mean velocity, mean drift (steps with a successor), AttnStab (t ≥ 1)."""
    n = valid.sum(1).to(v.dtype)  # T per trace
    L1 = max(v.shape[-1], 1)
    mean_v = v.sum((1, 2)) / (n * L1).clamp_min(1)
    mean_d = dr.sum((1, 2)) / ((n - 1).clamp_min(1) * dr.shape[-1])
    later = valid.clone()
    later[:, 0] = False
    n_later = later.sum(1)
    attn = torch.where(n_later > 0, (a * later).sum(1) / n_later.clamp_min(1), torch.ones_like(n))
    return torch.stack([mean_v, mean_d, attn], dim=1)


def bin_index(lengths: torch.Tensor, T: int, t_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bin of each token ``[B, T]`` (−1 on padding) and the number of bins per trace ``[B]``."""
    n_bins = lengths.clamp(max=t_max)
    t = torch.arange(T, device=lengths.device)[None]
    idx = torch.div(t * n_bins[:, None], lengths.clamp_min(1)[:, None], rounding_mode="floor")
    idx = torch.where(t < lengths[:, None], idx, torch.full_like(idx, -1))
    return idx, n_bins


def bin_steps(x: torch.Tensor, lengths: torch.Tensor, t_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``x`` ``[B, T, C]`` within at most ``t_max`` bins per trace: ``([B, T', C], n_bins [B])``."""
    B, T, C = x.shape
    idx, n_bins = bin_index(lengths, T, t_max)
    width = max(int(n_bins.max().item()) if B else 0, 1)
    safe = idx.clamp_min(0)
    w = (idx >= 0).to(x.dtype)
    sums = torch.zeros(B, width, C, dtype=x.dtype, device=x.device)
    sums.scatter_add_(1, safe[..., None].expand(B, T, C), x * w[..., None])
    counts = torch.zeros(B, width, dtype=x.dtype, device=x.device)
    counts.scatter_add_(1, safe, w)
    return sums / counts.clamp_min(1)[..., None], n_bins


def bin_starts(n_tokens: int, n_bins: int) -> list[int]:
    """First token index of each bin (inverse of :func:`bin_index`): ``⌈b·T/n⌉``."""
    return [-(-b * n_tokens // n_bins) for b in range(n_bins)]


def early_commitment(e: torch.Tensor, n_tokens: int) -> float:
    """EC from the binned answer-probability curve ``e`` ``[n]`` of a CoT of ``n_tokens`` tokens.

    Uses the bins that start within the first ⌈T/3⌉ tokens (identical to the token-level definition when the
    trace was not binned); 0 for an empty CoT.
    """
    n = e.shape[0]
    if n == 0 or n_tokens == 0:
        return 0.0
    cutoff = -(-n_tokens // 3)
    k = sum(1 for s in bin_starts(n_tokens, n) if s < cutoff)
    return float(e[:max(k, 1)].max())
