"""Helpers of the benchmark scripts (``scripts/bench_*.py``): warm-up, best-of-k repeats with their spread, and a
GEMM roofline measured on a model's own matmul shapes (the generation benchmark's prompts: :mod:`sift.lm.bench`).

A single timing on a shared or cold machine can be off by a factor of ten (the GEMM rate of this project's 2-core
machine once read 25 GFLOP/s against 200–213 in three other runs). So every rate here is measured after a warm-up,
``repeats`` times, and reported as the best (the least disturbed run) with the min / median / max spread next to it.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one quantity: the best (min for times, max for rates), the median, the spread."""

    values: tuple[float, ...]
    higher_is_better: bool = False

    def __post_init__(self):
        if not self.values:
            raise ValueError("a spread needs at least one value")

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def max(self) -> float:
        return max(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def best(self) -> float:
        return self.max if self.higher_is_better else self.min

    @property
    def rel_spread(self) -> float:
        """(max − min) / best: 0 when every repeat agrees."""
        return (self.max - self.min) / self.best if self.best else float("inf")

    def rate(self, amount: float) -> Spread:
        """``amount`` per unit of each value (e.g. tokens per second from seconds): a spread where higher is
        better."""
        return Spread(tuple(amount / v if v > 0 else float("inf") for v in self.values), higher_is_better=True)

    def as_dict(self) -> dict[str, float]:
        return {"best": self.best, "min": self.min, "median": self.median, "max": self.max, "n": len(self.values),
                "values": list(self.values)}

    def fmt(self, spec: str = ".3g") -> str:
        """``best (min–max)`` — e.g. ``12.1 (12.1–13.0)``."""
        return f"{self.best:{spec}} ({self.min:{spec}}–{self.max:{spec}})"


@dataclass(frozen=True)
class Timing:
    """Wall and CPU seconds of each timed repeat, and the results of every repeat (in order)."""

    wall: Spread
    cpu: Spread
    results: tuple[Any, ...]


def repeat(fn: Callable[[], Any], *, repeats: int = 3, warmup: int | Callable[[], Any] = 1,
           clock: Callable[[], float] = time.perf_counter,
           cpu_clock: Callable[[], float] = time.process_time) -> Timing:
    """Time ``fn()`` ``repeats`` times after a warm-up: ``warmup`` untimed calls of ``fn``, or one call of the given
    warm-up function (e.g. a short generation). CPU time is the process's (all its threads)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if callable(warmup):
        warmup()
    else:
        for _ in range(int(warmup)):
            fn()
    wall, cpu, results = [], [], []
    for _ in range(repeats):
        w, c = clock(), cpu_clock()
        results.append(fn())
        wall.append(clock() - w)
        cpu.append(cpu_clock() - c)
    return Timing(Spread(tuple(wall)), Spread(tuple(cpu)), tuple(results))


# ---------------------------------------------------------------------------------------------- GEMM roofline

#: a matmul as ``(op, shapes of its operands)``: ``mm`` ([m, k], [k, n]) or ``bmm`` ([b, m, k], [b, k, n])
Gemm = tuple[str, tuple[tuple[int, ...], tuple[int, ...]]]

#: SIFT's typical GEMM (the attention in-projection of a chunk), used when no model is given
DEFAULT_GEMMS: dict[Gemm, int] = {("mm", ((4096, 128), (128, 384))): 1}


def gemm_flops(g: Gemm) -> int:
    op, (a, b) = g
    if op == "mm":
        return 2 * a[0] * a[1] * b[1]
    return 2 * a[0] * a[1] * a[2] * b[2]


def gemm_shapes(fn: Callable[..., Any], *args, **kwargs) -> dict[Gemm, int]:
    """The matmuls one call of ``fn(*args, **kwargs)`` performs, as ``{gemm: count}`` (``mm``, ``addmm``, ``bmm``,
    ``baddbmm`` at the dispatcher level, where ``nn.Linear`` and ``@`` end up), recorded through
    ``torch.utils.flop_counter.FlopCounterMode``'s custom mapping."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    seen: Counter = Counter()

    def mm(a_shape, b_shape, *_, **__):
        seen[("mm", (tuple(a_shape), tuple(b_shape)))] += 1
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]

    def addmm(self_shape, a_shape, b_shape, *_, **__):
        return mm(a_shape, b_shape)

    def bmm(a_shape, b_shape, *_, **__):
        seen[("bmm", (tuple(a_shape), tuple(b_shape)))] += 1
        return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]

    def baddbmm(self_shape, a_shape, b_shape, *_, **__):
        return bmm(a_shape, b_shape)

    mapping = {aten.mm: mm, aten.addmm: addmm, aten.bmm: bmm, aten.baddbmm: baddbmm}
    with FlopCounterMode(display=False, custom_mapping=mapping):
        fn(*args, **kwargs)
    return dict(seen)


@dataclass(frozen=True)
class GemmRate:
    """The fp32 GEMM rate (FLOP/s) of repeated passes over a set of matmuls."""

    rate: Spread  # FLOP/s per repeat (best = the highest)
    flops_per_pass: int
    gemms: dict[Gemm, int]
    passes_per_repeat: int

    def as_dict(self) -> dict[str, Any]:
        return {"flops_per_s": self.rate.as_dict(), "flops_per_pass": self.flops_per_pass,
                "passes_per_repeat": self.passes_per_repeat,
                "gemms": [{"op": op, "shapes": [list(a), list(b)], "count": n}
                          for (op, (a, b)), n in self.gemms.items()]}


def gemm_rate(gemms: dict[Gemm, int] | None = None, *, repeats: int = 7, warmup_s: float = 0.5,
              min_repeat_s: float = 0.1, clock: Callable[[], float] = time.perf_counter) -> GemmRate:
    """This machine's fp32 rate on ``gemms`` (default :data:`DEFAULT_GEMMS`), the way a model runs them.

    Operands and outputs are allocated once (``out=``: no allocator or page-fault cost inside the timing); one pass
    runs every matmul its count of times. The passes run for ``warmup_s`` seconds untimed first (thread pool and
    clock frequency settle), then ``repeats`` timed repeats of enough passes to last ``min_repeat_s`` each. The rate's
    best is the ceiling any fp32 implementation of those matmuls can reach here; its spread says how steady the
    machine was.
    """
    import torch

    gemms = dict(gemms or DEFAULT_GEMMS)
    if not gemms:
        raise ValueError("no matmuls to time")
    g = torch.Generator().manual_seed(0)
    work = []
    for (op, (a, b)), n in gemms.items():
        x, y = torch.randn(a, generator=g), torch.randn(b, generator=g)
        out = torch.empty((a[0], b[1]) if op == "mm" else (a[0], a[1], b[2]))
        work.append((torch.mm if op == "mm" else torch.bmm, x, y, out, n))
    flops = sum(gemm_flops(k) * n for k, n in gemms.items())

    def one_pass():
        for f, x, y, out, n in work:
            for _ in range(n):
                f(x, y, out=out)

    with torch.inference_mode():
        t0 = clock()
        passes = 0
        while passes < 2 or clock() - t0 < warmup_s:
            one_pass()
            passes += 1
        per_pass = max((clock() - t0) / passes, 1e-9)
        k = max(1, int(min_repeat_s / per_pass + 0.5))
        times = []
        for _ in range(repeats):
            t = clock()
            for _ in range(k):
                one_pass()
            times.append((clock() - t) / k)
    return GemmRate(Spread(tuple(times)).rate(flops), flops, gemms, k)
