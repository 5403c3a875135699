"""Invariance penalties: IRM (split-batch estimator) and DANN (gradient reversal + domain classifier)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def irm_penalty(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Unbiased IRM penalty of one environment (DomainBed ``IRM._irm_penalty``, binary version).

    With a dummy scale w = 1, g_k = ∂/∂w BCE(w · logits[half_k], y[half_k]) for the even (k=1) and odd
    (k=2) examples; the penalty is g_1 · g_2, an unbiased estimate of ‖∇_w R_e‖² (IRM paper authors,
    facebookresearch/InvariantRiskMinimization#7), so a single estimate may be negative. The graph is kept
    (``create_graph=True``) so the penalty trains the model. Fewer than 2 examples: 0.
    """
    if logits.numel() < 2:
        return logits.sum() * 0.0
    scale = torch.ones((), device=logits.device, dtype=logits.dtype, requires_grad=True)
    y = labels.to(logits.dtype)
    loss_1 = F.binary_cross_entropy_with_logits(logits[::2] * scale, y[::2])
    loss_2 = F.binary_cross_entropy_with_logits(logits[1::2] * scale, y[1::2])
    g1 = torch.autograd.grad(loss_1, [scale], create_graph=True)[0]
    g2 = torch.autograd.grad(loss_2, [scale], create_graph=True)[0]
    return torch.sum(g1 * g2)


class _GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, alpha: float) -> torch.Tensor:  # type: ignore[override]
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return -ctx.alpha * grad, None


def grad_reverse(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """Identity forward, gradient multiplied by −alpha backward (Ganin et al., 2016)."""
    return _GradReverse.apply(x, alpha)


class GradientReversal(nn.Module):
    """Module form of :func:`grad_reverse`."""

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return grad_reverse(x, self.alpha)


class DomainClassifier(nn.Module):
    """DANN head: GRL → MLP → domain logits. Minimising its cross-entropy trains the classifier to find the
    domain while the reversed gradient trains the encoder to hide it (one optimizer, unlike DomainBed's
    alternating two-optimizer DANN, which the maintainers call equivalent in DomainBed#143)."""

    def __init__(self, in_dim: int, n_domains: int, hidden: int = 128, alpha: float = 1.0) -> None:
        super().__init__()
        self.grl = GradientReversal(alpha)
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, n_domains))
        self.n_domains = n_domains

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(self.grl(z))


def dann_penalty(classifier: DomainClassifier, z: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the domain classifier on the (gradient-reversed) representation ``z``."""
    if domain.numel() and int(domain.max()) >= classifier.n_domains:
        from sift.errors import SiftError

        raise SiftError(f"domain id {int(domain.max())} ≥ n_domains={classifier.n_domains} of the DANN head")
    return F.cross_entropy(classifier(z), domain.long())
