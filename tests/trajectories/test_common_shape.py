"""The common shape of source models of different shapes: layer resampling and fixed width projections."""

import pytest
import torch

from sift.errors import SiftError
from sift.trajectories.common_shape import (
    ShapeMap,
    channel_index,
    common_shape,
    layer_map,
    projection,
    resample_layers,
)
from sift.trajectories.extract import descriptor_channels


def test_common_shape_is_the_fewest_layers_and_the_smallest_width():
    assert common_shape({"coder-0.5b": (24, 896), "coder-1.5b": (28, 1536)}) == (24, 896)
    assert common_shape({"a": (28, 896), "b": (24, 1536)}) == (24, 896)  # taken separately
    assert common_shape({"a": (4, 128)}) == (4, 128)
    with pytest.raises(SiftError, match="no models"):
        common_shape({})


def test_layer_map_by_hand():
    assert layer_map(24, 12) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24]
    # j·28/24 = 7j/6 rounded half up: 3.5 → 4, 10.5 → 11, 17.5 → 18, 24.5 → 25
    assert layer_map(28, 24) == [1, 2, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 18, 19, 20, 21, 22, 23, 25, 26, 27,
                                 28]
    assert layer_map(3, 2) == [2, 3] and layer_map(5, 1) == [5] and layer_map(7, 7) == list(range(1, 8))
    for L in range(1, 40):
        for Ls in range(1, L + 1):
            s = layer_map(L, Ls)
            assert s[-1] == L and all(a < b for a, b in zip(s, s[1:])) and s[0] >= 1  # last → last, increasing
    with pytest.raises(SiftError, match="cannot map 12 layers onto 24"):
        layer_map(12, 24)


def test_channels_are_picked_at_the_mapped_layers():
    src, dst = descriptor_channels(24), descriptor_channels(12)
    picked = [src[i] for i in channel_index(24, 12)]
    # drift/l{j} ← drift/l{2j}; velocity/l{j} (into target layer j+1) ← velocity/l{2(j+1)−1}; attention kept
    assert picked[:11] == [f"velocity/l{2 * (j + 1) - 1}" for j in range(1, 12)]
    assert picked[11:23] == [f"drift/l{2 * j}" for j in range(1, 13)]
    assert picked[-1] == "attention_stability" and len(picked) == len(dst) == 24
    picked = [descriptor_channels(28)[i] for i in channel_index(28, 24)]
    assert picked[0] == "velocity/l1" and picked[2] == "velocity/l4" and picked[22] == "velocity/l27"  # last → last
    assert picked[23] == "drift/l1" and picked[25] == "drift/l4" and picked[46] == "drift/l28"
    assert channel_index(6, 6) == list(range(12))
    desc = torch.arange(2 * 3 * 5, dtype=torch.float32).reshape(5, 6)  # [T, 2L] for L = 3
    out = resample_layers(desc, 3, 2)  # velocity/l2, drift/l2, drift/l3, attention_stability
    assert torch.equal(out, desc[:, [1, 3, 4, 5]])
    assert resample_layers(desc, 3, 3) is desc  # same shape: the very same tensor
    with pytest.raises(SiftError, match="expected 8 for 4 layers"):
        resample_layers(desc, 4, 2)


def test_projection_is_orthonormal_fixed_per_name_and_preserves_norms():
    d, ds = 96, 40
    P = projection("qwen-1.5b", d, ds)
    assert P.shape == (ds, d) and P.dtype == torch.float32
    torch.testing.assert_close(P @ P.T * (ds / d), torch.eye(ds), atol=1e-5, rtol=0)  # orthonormal rows × √(d/d*)
    assert torch.equal(P, projection("qwen-1.5b", d, ds))  # deterministic (seeded by the name's SHA-256)
    assert not torch.allclose(P, projection("qwen-0.5b", d, ds), atol=1e-2)  # another name, another matrix
    assert projection("m", 32, 32) is None  # identity when d == d*
    x = torch.randn(20_000, d, generator=torch.Generator().manual_seed(0))
    ratio = float((x @ P.T).pow(2).sum(1).mean() / x.pow(2).sum(1).mean())
    assert ratio == pytest.approx(1.0, abs=0.03)
    with pytest.raises(SiftError, match="cannot project width 8 onto 16"):
        projection("m", 8, 16)


def test_shape_map_is_the_identity_at_the_common_shape():
    same = ShapeMap("a", 2, 32, 2, 32)
    desc, pooled = torch.randn(7, 4), torch.randn(5, 32)
    assert same.identity and same.channels(desc) is desc and same.vectors(pooled) is pooled
    wide = ShapeMap("b", 3, 48, 2, 32)
    assert not wide.identity and wide.channels(torch.randn(7, 6)).shape == (7, 4)
    v = torch.randn(5, 48)
    torch.testing.assert_close(wide.vectors(v), v @ projection("b", 48, 32).T)
    with pytest.raises(SiftError, match="width 32, expected 48"):
        wide.vectors(pooled)
