"""Descriptor formulas on hand-built tensors with known answers (docs/design.md §5)."""

import math

import pytest
import torch

from sift.trajectories import descriptors as D


def test_velocity_known_answer():
    H = torch.zeros(1, 3, 2, 4)  # [B, L, T, d]
    H[0, 1] = 2.0  # layer 2 = 2·1 → ‖Δ‖ = 4, /√4 = 2
    H[0, 2] = 2.0  # layer 3 = layer 2 → 0
    v = D.velocity(H, torch.ones(1, 2, dtype=torch.bool))
    assert v.shape == (1, 2, 2)
    assert torch.allclose(v[0], torch.tensor([[2.0, 0.0], [2.0, 0.0]]))


def test_drift_known_answer_and_last_step_zero():
    H = torch.zeros(1, 2, 3, 4)
    H[0, :, 1] = torch.tensor([3.0, 4.0, 0.0, 0.0])  # t0 → t1: ‖(3,4)‖ = 5, /√4 = 2.5
    H[0, :, 2] = 100.0  # a padding step: must not leak into the last real step
    valid = torch.tensor([[True, True, False]])
    dr = D.drift(H, valid)
    assert dr.shape == (1, 3, 2)
    assert torch.allclose(dr[0, 0], torch.tensor([2.5, 2.5]))
    assert torch.all(dr[0, 1:] == 0)  # last real step defined as 0; padding 0


def test_jsd_known_values():
    p = torch.tensor([1.0, 0.0])
    assert D.jsd(p, p).item() == pytest.approx(0.0, abs=1e-7)
    assert D.jsd(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == pytest.approx(1.0)
    q = torch.tensor([0.5, 0.5])  # by hand: ½·log2(4/3) + ½·(½·log2(2/3) + ½·log2 2)
    want = 0.5 * math.log2(4 / 3) + 0.5 * (0.5 * math.log2(2 / 3) + 0.5)
    assert D.jsd(p, q).item() == pytest.approx(want, abs=1e-6)


def test_attention_stability_known_answer():
    A = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]])
    valid = torch.tensor([[True, True, True, False]])
    a = D.attention_stability(A, valid)
    assert torch.allclose(a, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))
    vel = torch.zeros(1, 4, 1)
    dr = torch.zeros(1, 4, 2)
    means = D.trace_means(vel, dr, a, valid)
    assert means[0, 2].item() == pytest.approx(0.5)  # AttnStab = mean over t ≥ 1 of (1, 0)


def test_attention_normalisation_restricts_to_prompt():
    A = torch.tensor([[[0.2, 0.2, 0.6]]]) * torch.tensor([1.0, 1.0, 0.0])
    n = D.normalise_attention(A)
    assert torch.allclose(n, torch.tensor([[[0.5, 0.5, 0.0]]]))


def test_trace_means_known_answer():
    valid = torch.tensor([[True, True, True], [True, False, False]])
    vel = torch.tensor([[[1.0], [2.0], [3.0]], [[4.0], [0.0], [0.0]]])
    dr = torch.tensor([[[1.0, 3.0], [3.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])
    a = torch.tensor([[1.0, 0.5, 0.7], [1.0, 0.0, 0.0]])
    m = D.trace_means(vel, dr, a, valid)
    assert torch.allclose(m[0], torch.tensor([2.0, 2.0, 0.6]))
    assert torch.allclose(m[1], torch.tensor([4.0, 0.0, 1.0]))  # one-token CoT: no drift, AttnStab 1


def test_binning_means_within_bins():
    x = torch.arange(5.0)[None, :, None]  # T = 5 tokens, t_max = 2: bins {0,1,2}, {3,4}
    xb, n = D.bin_steps(x, torch.tensor([5]), 2)
    assert n.tolist() == [2]
    assert torch.allclose(xb[0, :, 0], torch.tensor([1.0, 3.5]))
    assert D.bin_starts(5, 2) == [0, 3]
    x2 = torch.tensor([[[1.0], [2.0], [9.0]], [[4.0], [0.0], [0.0]]])
    xb2, n2 = D.bin_steps(x2, torch.tensor([3, 1]), 8)  # short traces are left as they are
    assert n2.tolist() == [3, 1]
    assert torch.allclose(xb2[0, :, 0], torch.tensor([1.0, 2.0, 9.0])) and xb2[1, 0, 0] == 4.0


def test_early_commitment_first_third():
    e = torch.tensor([0.1, 0.9, 0.3, 0.95, 0.2, 0.1])
    assert D.early_commitment(e, 6) == pytest.approx(0.9)  # max over t < ⌈6/3⌉ = 2
    assert D.early_commitment(torch.tensor([0.4, 0.99, 0.99]), 7) == pytest.approx(0.4)  # 3 bins of 7: starts 0,3,5
    assert D.early_commitment(torch.tensor([0.7]), 1) == pytest.approx(0.7)
    assert D.early_commitment(torch.zeros(0), 0) == 0.0
