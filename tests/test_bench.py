"""The benchmark helpers (sift.bench): best-of-k repeats and their spread on a fake clock, the GEMM shapes a model
performs, and the GEMM rate measured on them."""

from __future__ import annotations

import pytest
import torch

from sift.bench import Spread, gemm_flops, gemm_rate, gemm_shapes, repeat
from sift.lm.bench import agreement


class FakeClock:
    """Each call of the timed function advances the clock by the next of ``durations``."""

    def __init__(self, durations):
        self.t, self.durations, self.calls = 0.0, list(durations), 0

    def __call__(self) -> float:
        return self.t

    def work(self):
        self.calls += 1
        self.t += self.durations.pop(0)
        return self.calls


def test_spread_best_median_and_rates():
    s = Spread((3.0, 1.0, 2.0, 10.0))
    assert (s.best, s.min, s.median, s.max) == (1.0, 1.0, 2.5, 10.0)
    assert s.rel_spread == pytest.approx(9.0)
    r = s.rate(100.0)  # e.g. 100 tokens: tokens/s, higher is better
    assert r.best == 100.0 and r.min == 10.0 and r.median == pytest.approx((100 / 3 + 50) / 2)
    assert r.as_dict() == {"best": 100.0, "min": 10.0, "median": r.median, "max": 100.0, "n": 4,
                           "values": [100 / 3, 100.0, 50.0, 10.0]}  # in the order measured
    assert Spread((2.0,)).fmt(".1f") == "2.0 (2.0–2.0)" and Spread((2.0,)).rel_spread == 0
    with pytest.raises(ValueError):
        Spread(())


def test_repeat_warms_up_then_keeps_every_repeat():
    clock = FakeClock([50.0, 4.0, 2.0, 3.0])  # a slow first (cold) call, then three timed ones
    t = repeat(clock.work, repeats=3, warmup=1, clock=clock, cpu_clock=clock)
    assert t.wall.values == (4.0, 2.0, 3.0) and t.wall.best == 2.0 and t.wall.median == 3.0 and t.wall.max == 4.0
    assert t.cpu.values == t.wall.values and t.results == (2, 3, 4) and clock.calls == 4
    warmed = []
    clock = FakeClock([5.0, 6.0, 9.0])
    t = repeat(clock.work, repeats=2, warmup=lambda: warmed.append(clock.work()), clock=clock, cpu_clock=clock)
    assert warmed == [1] and t.wall.values == (6.0, 9.0)  # a separate warm-up function (a short generation)
    with pytest.raises(ValueError):
        repeat(clock.work, repeats=0)


def test_gemm_shapes_are_the_models_own():
    lin = torch.nn.Linear(16, 32)
    x = torch.randn(4, 10, 16)

    def f(a):
        h = lin(a)  # [40, 16] @ [16, 32] (+ bias)
        return torch.bmm(h, h.transpose(1, 2)) @ torch.randn(10, 3)  # bmm, then a matmul broadcast to an mm

    got = gemm_shapes(f, x)
    assert got[("mm", ((40, 16), (16, 32)))] == 1 and got[("bmm", ((4, 10, 32), (4, 32, 10)))] == 1
    assert gemm_flops(("bmm", ((4, 10, 32), (4, 32, 10)))) == 2 * 4 * 10 * 32 * 10
    assert gemm_flops(("mm", ((40, 16), (16, 32)))) == 2 * 40 * 16 * 32


def test_gemm_rate_best_of_repeats_on_those_shapes():
    gemms = {("mm", ((64, 32), (32, 48))): 3, ("bmm", ((2, 8, 16), (2, 16, 4))): 1}
    r = gemm_rate(gemms, repeats=4, warmup_s=0.01, min_repeat_s=0.005)
    assert r.flops_per_pass == 3 * 2 * 64 * 32 * 48 + 2 * 2 * 8 * 16 * 4
    assert len(r.rate.values) == 4 and r.rate.higher_is_better and r.rate.best == max(r.rate.values) > 1e6
    assert r.passes_per_repeat >= 1 and r.as_dict()["gemms"][0] == {"op": "mm", "shapes": [[64, 32], [32, 48]],
                                                                    "count": 3}


def test_agreement_of_two_backends():
    g = agreement([[1, 2, 3], [4, 5], []], [[1, 2, 9, 9], [4, 5], []])
    assert g["identical"] == 2 and g["of"] == 3 and g["mean_common_prefix"] == pytest.approx((2 / 4 + 1 + 1) / 3)


def test_encoder_recompute_benchmark_times_both_settings():
    """scripts/bench_encoder_recompute.py: two rounds of kept vs recomputed encoder activations, each a positive
    time per step."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_encoder_recompute.py"
    out = subprocess.run([sys.executable, str(script), "--batch", "4", "--steps", "6", "--iters", "1", "--repeats", "1",
                          "--threads", "1"], capture_output=True, text=True, check=True).stdout
    rows = re.findall(r"round (\d): (kept|recomputed)\s+([\d.]+) ms", out)
    assert [(r, k) for r, k, _ in rows] == [("1", "kept"), ("1", "recomputed"), ("2", "kept"), ("2", "recomputed")]
    assert all(float(ms) > 0 for *_, ms in rows)
