"""IRM split-batch penalty against a hand computation; GRL and the DANN gradient's direction."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sift.detectors.penalties import DomainClassifier, dann_penalty, grad_reverse, irm_penalty
from sift.errors import SiftError


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_irm_penalty_hand_computed():
    logits = torch.tensor([1.0, -2.0, 0.5, 3.0], requires_grad=True)
    y = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # d/dw mean_i BCE(w·l_i, y_i) at w = 1 is mean_i (σ(l_i) − y_i)·l_i
    g_even = ((_sig(1.0) - 1) * 1.0 + (_sig(0.5) - 0) * 0.5) / 2  # examples 0, 2
    g_odd = ((_sig(-2.0) - 0) * -2.0 + (_sig(3.0) - 1) * 3.0) / 2  # examples 1, 3
    pen = irm_penalty(logits, y)
    assert pen.item() == pytest.approx(g_even * g_odd, rel=1e-6)
    assert g_even * g_odd == pytest.approx(-0.0040248, abs=1e-6)  # unbiased: may be negative
    pen.backward()  # the penalty is differentiable w.r.t. the logits (create_graph)
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_irm_penalty_equals_squared_gradient_when_halves_agree():
    l = torch.tensor([0.3, 0.3, -1.2, -1.2])
    y = torch.tensor([1.0, 1.0, 0.0, 0.0])
    g = ((_sig(0.3) - 1) * 0.3 + _sig(-1.2) * -1.2) / 2
    assert irm_penalty(l, y).item() == pytest.approx(g * g, rel=1e-6)
    assert irm_penalty(torch.tensor([0.5]), torch.tensor([1.0])).item() == 0.0


def _small_sift(**kw):
    """A tiny SIFT (λ_IRM 2, DANN 0.5, no dropout) and one environment batch of the synthetic DataModule."""
    from datamodules.synthetic_datamodule import SyntheticDataModule
    from sift.detectors import DataSpec, SIFTDetector

    dm = SyntheticDataModule(generator=dict(n_items=40, t_max=20))
    dm.setup()
    torch.manual_seed(0)
    net = {"d_model": 16, "filters": 4, "n_layers": 1, "n_heads": 2, "dim_feedforward": 16, "mlp_hidden": 8,
           "dropout": 0.0}
    m = SIFTDetector(data=DataSpec.from_datamodule(dm), net=net,
                     objective={"dann_hidden": 8, "irm_lambda": 2.0, "dann_weight": 0.5, **kw})
    m.log = lambda *a, **k: None
    m.train()
    return m, next(iter(dm.train_dataloader())), dm


def _objective_terms(m, envs):
    """Σ_e R_e, Σ_e Ω_IRM and the DANN loss by hand, from one concatenated forward pass (same BatchNorm
    statistics as ``training_step``)."""
    from sift.detectors import concat_batches

    cat = concat_batches(envs)
    logits, z = m.encode(cat)
    sizes = [len(b) for b in envs]
    risk = sum(F.binary_cross_entropy_with_logits(l, b.label) for l, b in zip(logits.split(sizes), envs))
    irm = sum(irm_penalty(l, b.label) for l, b in zip(logits.split(sizes), envs))
    return risk, irm, F.cross_entropy(m.domain_classifier(z), cat.env)


def test_sift_objective_sums_env_risks_and_penalties():
    m, envs, _ = _small_sift()
    torch.manual_seed(1)
    loss = m.training_step(envs, 0)
    risk, irm, dann = _objective_terms(m, envs)
    assert loss.item() == pytest.approx((risk + 2.0 * irm + 0.5 * dann).item(), rel=1e-5)


def test_grad_reverse_forward_identity_backward_negated():
    x = torch.randn(5, 3, requires_grad=True)
    y = grad_reverse(x, alpha=0.7)
    assert torch.equal(y, x)
    (y * torch.arange(3.0)).sum().backward()
    assert torch.allclose(x.grad, -0.7 * torch.arange(3.0).expand(5, 3))


def _domain_data(n: int = 256):
    g = torch.Generator().manual_seed(0)
    d = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 2, generator=g)
    x[:, 0] += 2.0 * (2 * d - 1).float()  # feature 0 reveals the domain; feature 1 is noise
    return x, d


def test_dann_gradient_step_moves_encoder_away_from_domain_feature():
    x, d = _domain_data()
    enc = nn.Linear(2, 4)
    head = DomainClassifier(4, 2, hidden=8)
    torch.manual_seed(0)
    with torch.no_grad():
        enc.weight.copy_(torch.tensor([[1.0, 0.1]] * 4) * torch.randn(4, 1).sign())

    def domain_ce() -> float:
        with torch.no_grad():
            return F.cross_entropy(head.net(enc(x)), d).item()

    # let the classifier find the domain first (encoder frozen)
    opt_h = torch.optim.SGD(head.parameters(), lr=0.5)
    for _ in range(200):
        opt_h.zero_grad()
        dann_penalty(head, enc(x).detach(), d).backward()
        opt_h.step()
    before = domain_ce()
    assert before < 0.2  # the domain is linearly readable from the representation
    # the reversed gradient on the encoder is minus the domain-CE gradient: a step makes the domain harder
    enc.zero_grad()
    dann_penalty(head, enc(x), d).backward()
    g_rev = enc.weight.grad.clone()
    enc.zero_grad()
    F.cross_entropy(head.net(enc(x)), d).backward()
    assert torch.allclose(g_rev, -enc.weight.grad)
    with torch.no_grad():
        enc.weight -= 0.05 * g_rev
    assert domain_ce() > before


def test_dann_training_removes_domain_feature_from_encoder():
    x, d = _domain_data()
    y = (x[:, 1] > 0).float()  # the label depends on the noise feature only

    def fit(dann_weight: float) -> float:
        torch.manual_seed(0)
        enc, clf, head = nn.Linear(2, 4), nn.Linear(4, 1), DomainClassifier(4, 2, hidden=16)
        with torch.no_grad():
            enc.weight[:, 0] = 1.0  # start with the domain feature in the representation
        opt = torch.optim.Adam([*enc.parameters(), *clf.parameters(), *head.parameters()], lr=1e-2)
        for _ in range(400):
            opt.zero_grad()
            z = enc(x)
            loss = F.binary_cross_entropy_with_logits(clf(z).squeeze(-1), y) + dann_weight * dann_penalty(head, z, d)
            loss.backward()
            opt.step()
        w = enc.weight.detach().abs()
        return (w[:, 0].sum() / w.sum()).item()  # share of the encoder's weight on the domain feature

    erm, dann = fit(0.0), fit(1.0)
    assert dann < 0.5 * erm, (erm, dann)


def test_dann_schedule_and_discriminator_learning_rate():
    from types import SimpleNamespace

    from datamodules.features import organism_channel_names
    from sift.detectors import SIFTDetector

    m = SIFTDetector(data={"channel_names": organism_channel_names(4), "n_envs": 3},
                     net={"d_model": 16, "filters": 4, "n_layers": 1, "n_heads": 2},
                     objective={"dann_schedule": "ganin", "dann_lr_mult": 10.0})
    for step, alpha in [(0, 0.0), (50, 2 / (1 + math.exp(-5)) - 1), (100, 2 / (1 + math.exp(-10)) - 1)]:
        m._trainer = SimpleNamespace(estimated_stepping_batches=100, global_step=step)
        assert m._grl_alpha() == pytest.approx(alpha)
    m._trainer = None
    opt = m.configure_optimizers()
    assert [g["lr"] for g in opt.param_groups] == [1e-3, pytest.approx(1e-2)]
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(m.parameters()))


def test_penalty_schedule_starts_at_zero_then_ramps(monkeypatch):
    from sift.detectors import DataSpec, SIFTDetector
    from sift.detectors.module import ramp_factor

    assert [ramp_factor(s, 10, 20) for s in (0, 9, 10, 15, 20, 30, 99)] == [0, 0, 0, 0.25, 0.5, 1, 1]
    assert ramp_factor(10, 10, 0) == 1.0 and ramp_factor(0, 0, 0) == 1.0
    m, envs, dm = _small_sift(penalty_start_steps=10, penalty_ramp_steps=20)
    risk, irm, dann = _objective_terms(m, envs)
    for step, factor in ((0, 0.0), (20, 0.5), (40, 1.0)):
        monkeypatch.setattr(SIFTDetector, "global_step", property(lambda self, s=step: s))
        loss = m.training_step(envs, 0)
        assert loss.item() == pytest.approx((risk + factor * (2.0 * irm + 0.5 * dann)).item(), rel=1e-5)
    with pytest.raises(SiftError, match="penalty_start_steps"):
        SIFTDetector(data=DataSpec.from_datamodule(dm), objective={"penalty_start_steps": -1})
