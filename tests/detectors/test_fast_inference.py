"""The fast SIFT inference path computes what SIFTNet computes (allclose); int8 within a stated tolerance."""

import pytest
import torch

from datamodules.batch import TraceBatch
from datamodules.features import ATTENTION_STABILITY, organism_channel_names
from sift.detectors import SIFTDetector, SIFTNet
from sift.detectors.fast_inference import INT8_PROB_ATOL, SIFTInference, fold_tcn

CH = organism_channel_names(4)  # 9 channels


def _net(seed: int = 0, **kw) -> SIFTNet:
    """Paper-size SIFTNet (unless overridden) with non-trivial BatchNorm running statistics, in eval mode."""
    torch.manual_seed(seed)
    net = SIFTNet(kw.pop("in_channels", 9), **kw)
    net.train()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(16, 24, net.proj.in_features if net.tcn is None else net.tcn.convs[0].in_channels,
                            generator=g) * 2 + 0.5, torch.ones(16, 24, dtype=torch.bool))
    return net.eval()


def _batch(B=40, T=33, C=9, seed=0, zero_len=True, holes=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    if zero_len:
        lengths[1] = 0
    mask = torch.arange(T)[None] < lengths[:, None]
    if holes:  # masks that are not left-aligned (a real step after a padded one)
        mask[2:6, 0] = False
        mask[6, T // 2] = False
    x[~mask] = 77.0  # garbage in the padding must not matter
    return x, mask


def _close(a, b, atol=2e-5, rtol=1e-4):
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


def test_folded_tcn_is_one_conv_equal_to_the_branches():
    net = _net()
    W, b, K = fold_tcn(net.tcn)
    assert K == 11 and W.shape == (4 * 64, 9, 11)
    x = torch.randn(5, 9, 30)
    with torch.no_grad():
        ref = torch.cat([bn(conv(x), torch.ones(5, 30, dtype=torch.bool)) for conv, bn in
                         zip(net.tcn.convs, net.tcn.norms)], dim=1)
        out = torch.nn.functional.conv1d(x, W, b, padding=K // 2)
    _close(out, ref)


@pytest.mark.parametrize("chunk,holes", [(0, False), (7, False), (None, True), (128, True)])
def test_fast_path_matches_reference_paper_size(chunk, holes):
    net = _net()
    fast = SIFTInference(net, chunk=chunk)
    # with holes torch leaves its nested-tensor path and SIFTNet gives NaN for an all-padding trace, so that
    # case has none (the fast path gives head(0) for it either way)
    x, mask = _batch(holes=holes, zero_len=not holes)
    with torch.no_grad():
        ref_l, ref_z = net(x, mask)
    l, z = fast(x, mask)
    _close(l, ref_l)
    _close(z, ref_z)
    if not holes:
        assert l[1] == fast._head(torch.zeros(1, 128))[0]  # an all-padding trace pools to 0, as in SIFTNet


def test_fast_path_matches_reference_full_length_and_longer_than_table():
    net = _net()
    fast = SIFTInference(net)
    for T in (64, 80):  # 80 > the precomputed position table
        x = torch.randn(20, T, 9)
        mask = torch.ones(20, T, dtype=torch.bool)
        with torch.no_grad():
            ref_l, ref_z = net(x, mask)
        l, z = fast(x, mask)
        _close(l, ref_l)
        _close(z, ref_z)


@pytest.mark.parametrize("kw", [dict(use_tcn=False), dict(use_transformer=False),
                                dict(kernels=(3, 7), filters=8, d_model=32, n_layers=2, n_heads=4,
                                     dim_feedforward=48, mlp_hidden=16)])
def test_fast_path_matches_reference_ablations_and_sizes(kw):
    net = _net(**kw)
    fast = SIFTInference(net, chunk=16)
    x, mask = _batch()
    with torch.no_grad():
        ref_l, ref_z = net(x, mask)
    l, z = fast(x, mask)
    _close(l, ref_l)
    _close(z, ref_z)


def _trace_batch(x, mask):
    B = x.shape[0]
    zeros = torch.zeros(B, dtype=torch.long)
    return TraceBatch(x=x, mask=mask, label=torch.zeros(B), env=zeros, domain=zeros, model=zeros,
                      pooled=torch.zeros(B, 4), features=torch.zeros(B, 1))


def test_detector_inference_engine_matches_detector_probabilities():
    torch.manual_seed(0)
    det = SIFTDetector(data={"channel_names": CH, "n_envs": 3}, drop_channels=[ATTENTION_STABILITY])
    x, mask = _batch(T=20)
    x = x * 3 + 1
    det.fit_input_stats([_trace_batch(x, mask)])  # a fitted standardiser with non-trivial mean/std
    det.eval()
    b = _trace_batch(x, mask)
    with torch.no_grad():
        ref = det(b)
    eng = det.inference_engine()
    _close(eng.probs(b), ref, atol=1e-6, rtol=1e-5)
    assert det.training is False and det.net.tcn.norms[0].training is False
    # the engine is a snapshot and the detector is unchanged (forward still the reference)
    with torch.no_grad():
        assert torch.equal(det(b), ref)


def test_int8_probabilities_agree_with_fp32_within_tolerance():
    """Dynamic int8 (Linear weights int8, activations quantised per call) is an approximation: stated
    tolerance max |ΔP| ≤ INT8_PROB_ATOL (0.2), mean |ΔP| ≤ 0.03, on traces whose fp32 probabilities spread
    over (0, 1)."""
    net = _net()
    x, mask = _batch(B=64, T=40, zero_len=False)
    with torch.no_grad():  # spread the logits around 0 (a random head gives P ≈ 0.5, or all on one side)
        z = SIFTInference(net)(x, mask)[0]
        net.head[-1].weight.mul_(2.0 / z.std().clamp_min(1e-6))
        net.head[-1].bias.sub_(SIFTInference(net)(x, mask)[0].mean())
    fp32 = torch.sigmoid(SIFTInference(net)(x, mask)[0])
    q = SIFTInference(net, int8=True)
    assert not any(type(m) is torch.nn.Linear for m in q.modules())  # every Linear was quantised
    p8 = torch.sigmoid(q(x, mask)[0])
    assert fp32.std() > 0.1, fp32  # the comparison is not trivial
    assert (p8 - fp32).abs().max() <= INT8_PROB_ATOL and (p8 - fp32).abs().mean() <= 0.03


def _bench_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_sift_throughput.py"
    spec = importlib.util.spec_from_file_location("bench_sift_throughput", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_roofline_counts_matmul_flops_per_trace():
    """The throughput benchmark's roofline: FLOPs per trace of a Linear on [B, T, 128] → 256 is 2·T·128·256."""
    bench = _bench_module()
    lin = torch.nn.Linear(128, 256)
    x, mask = torch.randn(8, 10, 128), torch.ones(8, 10, dtype=torch.bool)
    assert bench.flops_per_trace(lambda a, m: lin(a), x, mask) == 2 * 10 * 128 * 256
    assert bench.gemm_rate(repeats=2, warmup_s=0.05).rate.best > 1e8  # any CPU multiplies faster than 0.1 GFLOP/s
    own = bench.gemm_rate(lambda a, m: lin(a), x, mask, repeats=2, warmup_s=0.05)  # the model's own matmuls
    assert own.gemms == {("mm", ((80, 128), (128, 256))): 1} and own.flops_per_pass == 2 * 80 * 128 * 256
    assert len(own.rate.values) == 2 and own.rate.best > 1e8


def test_roofline_counts_every_product_of_the_fast_path_by_hand():
    """FLOPs per trace of the paper-size fast path at full length T, by hand: the fused TCN (C·11 → 4·64), the
    projection (256 → 128), per layer the in-projection (128 → 384), Q·Kᵀ and A·V over 8 heads of 16, the
    out-projection and the feed-forward (128 → 256 → 128), then the pooling score, the pooled sum and the head. The
    attention's products are counted (SDPA's flash kernel hid them from the counter before), and the GEMM rate is
    measured on the linear layers' matmuls only."""
    bench = _bench_module()
    T, C, d, H, L = 20, 9, 128, 8, 4
    fast = SIFTInference(_net())
    x, mask = torch.randn(6, T, C), torch.ones(6, T, dtype=torch.bool)
    layer = 2 * T * d * 3 * d + 2 * (2 * H * T * T * (d // H)) + 2 * T * d * d + 2 * (2 * T * d * 256)
    want = 2 * T * C * 11 * 256 + 2 * T * 256 * d + L * layer + 2 * T * d + 2 * T * d + 2 * d * 128 + 2 * 128
    assert bench.flops_per_trace(fast, x, mask) == want
    rate = bench.gemm_rate(fast, x, mask, repeats=1, warmup_s=0.01)
    assert rate.gemms and {op for op, _ in rate.gemms} == {"mm"}
    rows = bench.profile_breakdown(fast, x, mask, rate=1e11, repeats=1)
    by = {r["group"]: r for r in rows}
    assert by["attention products (bmm, baddbmm)"]["gflop"] * 1e9 == pytest.approx(6 * (L * 4 * H * T * T * d // H
                                                                                     + 2 * T * d))
    assert sum(r["gflop"] for r in rows) * 1e9 == pytest.approx(6 * want)
    assert all(r["ms"] >= 0 for r in rows)
